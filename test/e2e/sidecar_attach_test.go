package e2e

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/waitfor"
)

// TestSidecarFollowsGatewayAPIAttachmentRules runs the sidecar data path
// (loopback blocks 127.0.176-178.x) and moves cluster-b's HTTPRoute to
// another namespace than its Gateway and its import: the route is served
// only where the Gateway's listener allows routes of that namespace (from
// Same refuses it, All and a matching Selector accept it), and its
// backendRef to the import only while a ReferenceGrant of the import's
// namespace allows it. The Gateway's allowedRoutes default comes from the
// real Gateway API CRD the kube-apiserver serves.
func TestSidecarFollowsGatewayAPIAttachmentRules(t *testing.T) {
	const ns = "e2e-attach"
	team := ns + "-team"
	s := newSidecarSetup(t, ns, 176)
	ctx := t.Context()
	b := s.b
	s.expect(t, "the route of the Gateway's namespace is served", http.StatusOK)

	gateways := b.gateway.GatewayV1().Gateways(ns)
	g, err := gateways.Get(ctx, "inference-gateway", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, g.Spec.Listeners[0].AllowedRoutes, "the CRD defaults allowedRoutes")
	require.Equal(t, gatewayv1.NamespacesFromSame, *g.Spec.Listeners[0].AllowedRoutes.Namespaces.From, "the CRD defaults allowedRoutes to from: Same")

	// The same route, in another namespace, to the import of the Gateway's
	// namespace.
	b.createNamespace(t, ctx, team)
	route, err := b.gateway.GatewayV1().HTTPRoutes(ns).Get(ctx, "completions", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, b.gateway.GatewayV1().HTTPRoutes(ns).Delete(ctx, "completions", metav1.DeleteOptions{}))
	route = &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: "completions", Namespace: team, Annotations: route.Annotations}, Spec: route.Spec}
	route.Spec.ParentRefs[0].Namespace = ptr.To(gatewayv1.Namespace(ns))
	route.Spec.Rules[0].BackendRefs[0].Namespace = ptr.To(gatewayv1.Namespace(ns))
	_, err = b.gateway.GatewayV1().HTTPRoutes(team).Create(ctx, route, metav1.CreateOptions{})
	require.NoError(t, err)
	s.expect(t, "from: Same refuses a route of another namespace: no route matches", http.StatusNotFound)
	s.expectProblem(t, routetable.ReasonNotAllowedByListeners, "routes of namespace "+team+" are not allowed")

	setAllowed := func(allowed *gatewayv1.AllowedRoutes) {
		t.Helper()
		g, err := gateways.Get(ctx, "inference-gateway", metav1.GetOptions{})
		require.NoError(t, err)
		g.Spec.Listeners[0].AllowedRoutes = allowed
		_, err = gateways.Update(ctx, g, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	from := func(f gatewayv1.FromNamespaces, selector *metav1.LabelSelector) *gatewayv1.AllowedRoutes {
		return &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: &f, Selector: selector}}
	}
	setAllowed(from(gatewayv1.NamespacesFromAll, nil))
	s.expect(t, "from: All attaches it, but its backendRef to another namespace has no ReferenceGrant", http.StatusInternalServerError)
	s.expectProblem(t, routetable.ReasonRefNotPermitted, "no ReferenceGrant of namespace "+ns)
	s.expectMetric(t, `mci_sidecar_gateway_api_refusals{reason="RefNotPermitted"}`, 1)

	grants := b.gateway.GatewayV1beta1().ReferenceGrants(ns)
	_, err = grants.Create(ctx, &gatewayv1beta1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Name: "team-routes", Namespace: ns},
		Spec: gatewayv1beta1.ReferenceGrantSpec{
			From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: gatewayv1.Namespace(team)}},
			To:   []gatewayv1beta1.ReferenceGrantTo{{Group: routetable.InferencePoolImportGroup, Kind: routetable.InferencePoolImportKind, Name: ptr.To(gatewayv1.ObjectName("llm"))}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	s.expect(t, "a ReferenceGrant for the import serves the route", http.StatusOK)
	s.expectMetric(t, `mci_sidecar_gateway_api_refusals{reason="RefNotPermitted"}`, 0)

	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"mci.x-k8s.io/e2e-gateway-access": "granted"}}
	setAllowed(from(gatewayv1.NamespacesFromSelector, selector))
	s.expect(t, "a Selector the namespace's labels do not match refuses the route", http.StatusNotFound)
	s.expectProblem(t, routetable.ReasonNotAllowedByListeners, "labels of namespace "+team+" do not match")

	namespace, err := b.kube.CoreV1().Namespaces().Get(ctx, team, metav1.GetOptions{})
	require.NoError(t, err)
	namespace.Labels = map[string]string{"mci.x-k8s.io/e2e-gateway-access": "granted"}
	_, err = b.kube.CoreV1().Namespaces().Update(ctx, namespace, metav1.UpdateOptions{})
	require.NoError(t, err)
	s.expect(t, "labelling the namespace to match the Selector serves the route", http.StatusOK)

	require.NoError(t, grants.Delete(ctx, "team-routes", metav1.DeleteOptions{}))
	s.expect(t, "deleting the ReferenceGrant refuses the backendRef again", http.StatusInternalServerError)

	// Leave the namespace without the label, so that a rerun starts from
	// the same state.
	namespace, err = b.kube.CoreV1().Namespaces().Get(ctx, team, metav1.GetOptions{})
	require.NoError(t, err)
	namespace.Labels = nil
	_, err = b.kube.CoreV1().Namespaces().Update(ctx, namespace, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// expect waits until requests through the gateway get code.
func (s *sidecarSetup) expect(t *testing.T, what string, code int) {
	t.Helper()
	start := time.Now()
	var last string
	waitfor.Eventually(t, t.Context(), 15*time.Second, func(ctx context.Context) (bool, string) {
		got, _, err := s.try(ctx)
		last = fmt.Sprintf("%d (err=%v)", got, err)
		return err == nil && got == code, fmt.Sprintf("%s: got %s, want %d", what, last, code)
	})
	t.Logf("%s: %d after %s", what, code, time.Since(start).Round(time.Millisecond))
}

// expectProblem waits until the sidecar's table reports a problem of reason
// whose text contains text.
func (s *sidecarSetup) expectProblem(t *testing.T, reason, text string) {
	t.Helper()
	waitfor.Eventually(t, t.Context(), 15*time.Second, func(context.Context) (bool, string) {
		var all []string
		for _, err := range s.sidecar.Router().Table().Errors {
			var be *routetable.BuildError
			if errors.As(err, &be) && be.Reason == reason && strings.Contains(be.Message, text) {
				return true, ""
			}
			all = append(all, err.Error())
		}
		return false, fmt.Sprintf("no %s problem with %q among %v", reason, text, all)
	})
}

// metric is the value of one series of the sidecar's metrics (0 and false
// while it is absent).
func (s *sidecarSetup) metric(ctx context.Context, series string) (float64, bool, error) {
	m, err := promtext.Get(ctx, "http://"+s.sidecar.MetricsAddr()+"/metrics")
	if err != nil {
		return 0, false, err
	}
	return m.Lookup(series)
}

// settledMetric is the value of one series of the sidecar's metrics once
// two reads in a row agree (0 while it is absent).
func (s *sidecarSetup) settledMetric(t *testing.T, series string) float64 {
	t.Helper()
	last, settled := math.NaN(), 0.0
	waitfor.Eventually(t, t.Context(), 15*time.Second, func(ctx context.Context) (bool, string) {
		v, _, err := s.metric(ctx, series)
		if err != nil {
			return false, err.Error()
		}
		stable := v == last
		settled, last = v, v
		return stable, fmt.Sprintf("%s moved to %v", series, v)
	})
	return settled
}

// expectMetric waits until the sidecar's metrics have series with the
// value want.
func (s *sidecarSetup) expectMetric(t *testing.T, series string, want float64) {
	t.Helper()
	waitfor.Eventually(t, t.Context(), 15*time.Second, func(ctx context.Context) (bool, string) {
		v, found, err := s.metric(ctx, series)
		if err != nil {
			return false, err.Error()
		}
		return found && v == want, fmt.Sprintf("%s is %v (present: %t), want %v", series, v, found, want)
	})
}
