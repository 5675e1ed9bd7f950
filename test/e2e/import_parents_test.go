package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/test/waitfor"
)

// importRoute is an HTTPRoute in ns that sends /v1 to the import ns/pool
// through the Gateways named.
func importRoute(ns, name, pool string, gateways ...string) *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, g := range gateways {
		r.Spec.ParentRefs = append(r.Spec.ParentRefs, gatewayv1.ParentReference{Name: gatewayv1.ObjectName(g)})
	}
	ref := gatewayv1.HTTPBackendRef{}
	ref.Group = ptr.To(gatewayv1.Group(v1alpha1.GroupName))
	ref.Kind = ptr.To(gatewayv1.Kind("InferencePoolImport"))
	ref.Name = gatewayv1.ObjectName(pool)
	r.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{ref}}}
	return r
}

// exportReadyPool makes cluster c export ns/name in EndpointMode with a
// ready EPP.
func (c *cluster) exportReadyPool(t *testing.T, ctx context.Context, ns, name, eppIP string) {
	t.Helper()
	c.createEPPService(t, ctx, ns, eppIP)
	c.setEPPEndpoint(t, ctx, ns, true)
	_, err := c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
}

// parentsState renders an import's parents as "ns/name:Accepted/ResolvedRefs"
// (condition statuses, reasons when not True), for comparisons and messages.
func parentsState(imp *v1alpha1.InferencePoolImport) string {
	if imp == nil {
		return "<no import>"
	}
	if len(imp.Status.Controllers) != 1 {
		return fmt.Sprintf("<%d controllers>", len(imp.Status.Controllers))
	}
	out := ""
	for _, p := range imp.Status.Controllers[0].Parents {
		if out != "" {
			out += " "
		}
		out += p.ParentRef.Namespace + "/" + p.ParentRef.Name + ":" + condState(p.Conditions, "Accepted") + "/" + condState(p.Conditions, "ResolvedRefs")
	}
	return out
}

func condState(conds []metav1.Condition, t string) string {
	for _, c := range conds {
		if c.Type == t {
			if c.Status == metav1.ConditionTrue {
				return "True"
			}
			return string(c.Status) + "(" + c.Reason + ")"
		}
	}
	return "missing"
}

// Import parents are computed from the importing cluster's own HTTPRoutes
// and Gateways, and follow every change of them: a route appears, moves to
// a Gateway that does not exist yet, the Gateway is created, a route from
// another namespace waits for a ReferenceGrant, the route goes.
func TestImportParentsFollowTheImportingClustersRoutesAndGateways(t *testing.T) {
	ctx := context.Background()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns, team = "e2e-import-parents", "e2e-import-parents-team"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	b.createNamespace(t, ctx, team)
	a.exportReadyPool(t, ctx, ns, "llm", "127.0.0.31")
	b.createProgrammedGateway(t, ctx, ns, "inf-gw", "127.0.0.32")

	want := func(t *testing.T, cl *cluster, state string) {
		t.Helper()
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := cl.importOf(ctx, ns, "llm")
			got := parentsState(imp)
			return err == nil && got == state, fmt.Sprintf("err=%v parents=%q, want %q", err, got, state)
		})
	}
	want(t, b, "")

	routes := b.gateway.GatewayV1().HTTPRoutes(ns)
	_, err := routes.Create(ctx, importRoute(ns, "llm", "llm", "inf-gw"), metav1.CreateOptions{})
	require.NoError(t, err)

	t.Run("the Gateway of an HTTPRoute that uses the import is its parent, Accepted and ResolvedRefs", func(t *testing.T) {
		want(t, b, ns+"/inf-gw:True/True")
		imp, err := b.importOf(ctx, ns, "llm")
		require.NoError(t, err)
		p := imp.Status.Controllers[0].Parents[0]
		require.Equal(t, "gateway.networking.k8s.io", ptr.Deref(p.ParentRef.Group, ""))
		require.Equal(t, "Gateway", p.ParentRef.Kind)
		require.Equal(t, v1alpha1.ControllerName, p.ControllerName)
	})
	t.Run("another importing cluster does not see cluster-b's routes", func(t *testing.T) {
		want(t, c, "")
	})
	t.Run("a route moved to a Gateway that does not exist is not Accepted, until the Gateway is created", func(t *testing.T) {
		r, err := routes.Get(ctx, "llm", metav1.GetOptions{})
		require.NoError(t, err)
		r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "later-gw"}}
		_, err = routes.Update(ctx, r, metav1.UpdateOptions{})
		require.NoError(t, err)
		want(t, b, ns+"/later-gw:False(NotSupportedByParent)/True")
		b.createProgrammedGateway(t, ctx, ns, "later-gw", "127.0.0.33")
		want(t, b, ns+"/later-gw:True/True")
	})
	t.Run("a route of another namespace needs a ReferenceGrant in the import's namespace, and a listener that takes routes of its namespace", func(t *testing.T) {
		cross := importRoute(team, "cross", "llm")
		cross.Spec.Rules[0].BackendRefs[0].Namespace = ptr.To(gatewayv1.Namespace(ns))
		cross.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw", Namespace: ptr.To(gatewayv1.Namespace(ns))}}
		_, err := b.gateway.GatewayV1().HTTPRoutes(team).Create(ctx, cross, metav1.CreateOptions{})
		require.NoError(t, err)
		// The Gateway's listener takes routes of its own namespace only
		// (allowedRoutes' default), and the reference is not granted.
		want(t, b, ns+"/inf-gw:False(HTTPRouteNotAccepted)/False(RefNotPermitted) "+ns+"/later-gw:True/True")

		grant := &gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "routes-of-team"}}
		grant.Spec.From = []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: gatewayv1.Namespace(team)}}
		grant.Spec.To = []gatewayv1.ReferenceGrantTo{{Group: v1alpha1.GroupName, Kind: "InferencePoolImport"}}
		_, err = b.gateway.GatewayV1beta1().ReferenceGrants(ns).Create(ctx, grant, metav1.CreateOptions{})
		require.NoError(t, err)
		want(t, b, ns+"/inf-gw:False(HTTPRouteNotAccepted)/True "+ns+"/later-gw:True/True")

		// A listener that takes routes of the namespaces labelled
		// gateway-access=granted: the route's namespace is not yet.
		selector := `{"spec":{"listeners":[{"name":"http","protocol":"HTTP","port":80,"allowedRoutes":{"namespaces":{"from":"Selector","selector":{"matchLabels":{"gateway-access":"granted"}}}}}]}}`
		_, err = b.gateway.GatewayV1().Gateways(ns).Patch(ctx, "inf-gw", types.MergePatchType, []byte(selector), metav1.PatchOptions{})
		require.NoError(t, err)
		want(t, b, ns+"/inf-gw:False(HTTPRouteNotAccepted)/True "+ns+"/later-gw:True/True")
		imp, err := b.importOf(ctx, ns, "llm")
		require.NoError(t, err)
		accepted := meta.FindStatusCondition(imp.Status.Controllers[0].Parents[0].Conditions, "Accepted")
		require.NotNil(t, accepted)
		require.Contains(t, accepted.Message, "labels of namespace "+team+" do not match allowedRoutes.namespaces.selector")
		// Labelling the namespace (a namespace change, no route or Gateway
		// change) attaches the route.
		_, err = b.kube.CoreV1().Namespaces().Patch(ctx, team, types.MergePatchType, []byte(`{"metadata":{"labels":{"gateway-access":"granted"}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		want(t, b, ns+"/inf-gw:True/True "+ns+"/later-gw:True/True")

		err = b.gateway.GatewayV1().HTTPRoutes(team).Delete(ctx, "cross", metav1.DeleteOptions{})
		require.NoError(t, err)
		want(t, b, ns+"/later-gw:True/True")
		// Back to the listener's default (routes of its own namespace).
		_, err = b.gateway.GatewayV1().Gateways(ns).Patch(ctx, "inf-gw", types.MergePatchType, []byte(`{"spec":{"listeners":[{"name":"http","protocol":"HTTP","port":80}]}}`), metav1.PatchOptions{})
		require.NoError(t, err)
	})
	t.Run("a watcher of the import gets an event when a route moves", func(t *testing.T) {
		imports := b.mci.InferenceV1alpha1().InferencePoolImports(ns)
		list, err := imports.List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		require.NoError(t, err)
		defer w.Stop()
		_, err = routes.Patch(ctx, "llm", types.MergePatchType, []byte(`{"spec":{"parentRefs":[{"name":"inf-gw"}]}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		timeout := time.After(convergence)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				require.True(t, ok, "the watch closed")
				imp, isImport := ev.Object.(*v1alpha1.InferencePoolImport)
				if ev.Type == watch.Modified && isImport && imp.Name == "llm" && parentsState(imp) == ns+"/inf-gw:True/True" {
					return
				}
			case <-timeout:
				t.Fatalf("no watch event with parent %s/inf-gw within %s", ns, convergence)
			}
		}
	})
	t.Run("a route that no longer uses the import takes its parents with it", func(t *testing.T) {
		err := routes.Delete(ctx, "llm", metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			require.NoError(t, err)
		}
		want(t, b, "")
	})
}
