package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// HTTPRoute filters, as a kube-apiserver stores them, change what reaches
// the model servers of other clusters: a URLRewrite lets a path the model
// servers do not serve reach them, a RequestRedirect answers without a
// cluster, and a filter the sidecar cannot apply fails its rule with 500
// instead of being skipped. Loopback blocks 127.0.140-142.x.
func TestSidecarAppliesHTTPRouteFilters(t *testing.T) {
	s := newSidecarSetup(t, "e2e-sidecar-filters", 140)
	ctx := t.Context()
	routes := s.b.gateway.GatewayV1().HTTPRoutes(s.ns)
	r, err := routes.Get(ctx, "completions", metav1.GetOptions{})
	require.NoError(t, err)
	toImport := r.Spec.Rules[0].BackendRefs
	prefix := func(p string) []gatewayv1.HTTPRouteMatch {
		return []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To(p)}}}
	}
	r.Spec.Rules = append(r.Spec.Rules,
		gatewayv1.HTTPRouteRule{
			Matches: prefix("/api/v1"),
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
				Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v1")},
			}}},
			BackendRefs: toImport,
		},
		gatewayv1.HTTPRouteRule{
			Matches: prefix("/old"),
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
				Scheme: ptr.To("https"), Hostname: ptr.To(gatewayv1.PreciseHostname("llm.example")), StatusCode: ptr.To(301),
			}}},
		},
		gatewayv1.HTTPRouteRule{
			Matches: prefix("/mirrored"),
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{
				BackendRef: gatewayv1.BackendObjectReference{Name: "shadow", Port: ptr.To(gatewayv1.PortNumber(8000))},
			}}},
			BackendRefs: toImport,
		},
	)
	_, err = routes.Update(ctx, r, metav1.UpdateOptions{})
	require.NoError(t, err, "the HTTPRoute CRD accepts the filters")

	noRedirects := *noProxyClient
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	post := func(ctx context.Context, path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.gateway.URL+path, strings.NewReader(string(completion(baseModel))))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := noRedirects.Do(req)
		if err != nil {
			return nil, err
		}
		_ = resp.Body.Close()
		return resp, nil
	}

	// The sidecar's table follows the route's update.
	waitfor.Eventually(t, ctx, 15*time.Second, func(ctx context.Context) (bool, string) {
		resp, err := post(ctx, "/old/v1/completions")
		if err != nil {
			return false, err.Error()
		}
		return resp.StatusCode == http.StatusMovedPermanently, fmt.Sprintf("HTTP %d", resp.StatusCode)
	})

	t.Run("a redirect answers with the rewritten location", func(t *testing.T) {
		resp, err := post(ctx, "/old/v1/completions?x=1")
		require.NoError(t, err)
		assert.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
		assert.Equal(t, "https://llm.example/old/v1/completions?x=1", resp.Header.Get("Location"))
	})
	t.Run("a URLRewrite reaches the model servers on their own path", func(t *testing.T) {
		got := map[string]int{}
		for range 20 {
			resp, err := post(ctx, "/api/v1/completions")
			require.NoError(t, err)
			got[fmt.Sprintf("HTTP %d %s", resp.StatusCode, resp.Header.Get(simulator.InstanceHeader))]++
		}
		want := map[string]int{}
		for _, name := range []string{"cluster-a", "cluster-c"} {
			want["HTTP 200 "+s.instances[name]] = 10
		}
		assert.Equal(t, want, got, "the rewritten requests split across both clusters' model servers")
	})
	t.Run("a filter the sidecar cannot apply fails the rule", func(t *testing.T) {
		resp, err := post(ctx, "/mirrored/v1/completions")
		require.NoError(t, err)
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	})
	t.Run("the unfiltered rule is unchanged", func(t *testing.T) {
		code, instance, body := s.send(t)
		assert.Equal(t, http.StatusOK, code, body)
		assert.NotEmpty(t, instance)
	})
}
