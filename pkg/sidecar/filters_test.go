package sidecar

import (
	"net/http"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

func TestAttrsFromRequest(t *testing.T) {
	req := &extproc.Request{Headers: map[string][]string{
		":authority": {"my.model.com"}, ":path": {"/v1/completions?stream=true"}, ":method": {"POST"}, "x-tier": {"gold"},
	}}
	a := attrsFromRequest(req)
	assert.Equal(t, "my.model.com", a.Host)
	assert.Equal(t, "/v1/completions", a.Path)
	assert.Equal(t, "stream=true", a.RawQuery)
	assert.Equal(t, "POST", a.Method)
	assert.Equal(t, []string{"gold"}, a.Headers["x-tier"])
}

// setHeaders flattens a mutation's set headers to "name:action" -> value.
func setHeaders(m *extprocv3.HeaderMutation) map[string]string {
	out := map[string]string{}
	for _, h := range m.GetSetHeaders() {
		out[h.GetHeader().GetKey()+":"+h.GetAppendAction().String()] = string(h.GetHeader().GetRawValue())
	}
	return out
}

// The sidecar applies the filters of the rule and of the backendRef it
// picked, after the EPP's own mutations; a redirect answers without an
// EPP; a filter it cannot apply fails the rule with 500.
func TestServerAppliesHTTPRouteFilters(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	ah, ap := hostPort(t, a.addr)
	ch, cp := hostPort(t, c.addr)
	imp := sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: ah, Port: ap})
	other := sidecartest.Import("other", sidecartest.Imported{Name: "cluster-c", Addr: ch, Port: cp})

	modified := sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/api")}, sidecartest.ImportRef("llm", ptr.To[int32](1)), sidecartest.ImportRef("other", ptr.To[int32](0)))
	modified.Filters = []gatewayv1.HTTPRouteFilter{
		{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
			Set: []gatewayv1.HTTPHeader{{Name: "X-Picked-By", Value: "the route"}}, Remove: []string{"X-Debug"}}},
	}
	modified.BackendRefs[0].Filters = []gatewayv1.HTTPRouteFilter{
		{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
			Hostname: ptr.To(gatewayv1.PreciseHostname("llm.internal")),
			Path:     &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v1")}}},
	}
	redirected := sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/old")})
	redirected.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
		Scheme: ptr.To("https"), Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")}, StatusCode: ptr.To(301)}}}
	mirrored := sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/mirrored")}, sidecartest.ImportRef("llm", nil))
	mirrored.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{}}}

	h := startServer(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, []string{"my.model.com"}, modified, redirected, mirrored)},
		Imports: []*v1alpha1.InferencePoolImport{imp, other},
	}, &fakeState{})

	t.Run("header modifier and rewrite", func(t *testing.T) {
		res := h.do(t, envoyclient.Request{Authority: "my.model.com", Path: "/api/chat/completions?stream=true", Body: chatBody,
			Headers: http.Header{"X-Debug": {"1"}}})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.1.0.1:8000", res.Destination, "the EPP still picks the endpoint")
		assert.Equal(t, "/v1/chat/completions?stream=true", res.Headers.Get(":path"))
		assert.Equal(t, "llm.internal", res.Headers.Get(":authority"))
		assert.Equal(t, "the route", res.Headers.Get("x-picked-by"), "the route's filter overrides the EPP's header")
		assert.Empty(t, res.Headers.Values("x-debug"))
		assert.Equal(t, "/api/chat/completions?stream=true", a.lastPath(), "the EPP sees the request as the client sent it")
	})
	t.Run("redirect", func(t *testing.T) {
		calls := a.calls.Load() + c.calls.Load()
		res := h.do(t, envoyclient.Request{Authority: "my.model.com", Path: "/old/models", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusMovedPermanently, res.Immediate.StatusCode)
		assert.Equal(t, "https://my.model.com/new/models", res.Immediate.Headers.Get("location"))
		assert.Equal(t, calls, a.calls.Load()+c.calls.Load(), "no EPP is asked")
	})
	t.Run("a filter the sidecar cannot apply", func(t *testing.T) {
		res := h.do(t, envoyclient.Request{Authority: "my.model.com", Path: "/mirrored", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusInternalServerError, res.Immediate.StatusCode)
		assert.Contains(t, res.Immediate.Details, "RequestMirror")
	})
}
