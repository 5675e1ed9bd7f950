package clusterset

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/test/localclusterset"
)

// Against a real kube-apiserver: only the local member watches HTTPRoutes,
// and each route change names the imports the route used before and after
// it, so that the imports it leaves are recomputed too.
func TestLocalHTTPRouteChangesNameTheImportsTheyTouch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"routes"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	local := cs.Clusters[0].Config
	const ns = "routes"
	_, err = kubernetes.NewForConfigOrDie(local).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	gw := gatewayclient.NewForConfigOrDie(local).GatewayV1()

	var mu sync.Mutex
	var events []Event
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 10 * time.Second}, func(ev Event) {
		if ev.Kind == KindHTTPRoute || ev.Kind == KindReferenceGrant {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}
	})
	// The same apiserver is also a remote member: it must not watch routes.
	go func() {
		_ = cache.Run(ctx, staticSource{"remote": {rest: asAnotherCluster(local, "remote-cluster-id"), fingerprint: "1"}})
	}()
	require.Eventually(t, func() bool { return cache.Ready() == nil && len(cache.Snapshot().Members) == 2 }, time.Minute, 50*time.Millisecond)
	for _, m := range cache.Snapshot().Members {
		assert.Equal(t, m.Name == "local", m.Routes != nil, "%s: only the local member has routes", m.Name)
		assert.Equal(t, m.Name == "local", m.ReferenceGrants != nil, "%s: only the local member has ReferenceGrants", m.Name)
	}
	routeEvent := func(want ...string) {
		t.Helper()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range events {
				if ev.Kind == KindHTTPRoute && slices.Equal(ev.Imports, want) {
					require.Equal(t, "local", ev.Member)
					return true
				}
			}
			return false
		}, 20*time.Second, 20*time.Millisecond, "no HTTPRoute event naming %v", want)
	}

	backend := func(name string) gatewayv1.HTTPBackendRef {
		ref := gatewayv1.HTTPBackendRef{}
		ref.Group = ptr.To(gatewayv1.Group("inference.networking.x-k8s.io"))
		ref.Kind = ptr.To(gatewayv1.Kind("InferencePoolImport"))
		ref.Name = gatewayv1.ObjectName(name)
		return ref
	}
	route := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r"}}
	route.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "gw"}}
	route.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{backend("a")}}}
	_, err = gw.HTTPRoutes(ns).Create(ctx, route, metav1.CreateOptions{})
	require.NoError(t, err)
	routeEvent(ns + "/a")
	assert.Equal(t, []string{ns + "/a"}, cache.ImportsRoutedThrough(ns, "gw"))
	assert.Equal(t, []string{ns + "/a"}, cache.ImportsRoutedFrom(ns), "a change of the route's namespace (its labels) may change its parents")
	assert.Empty(t, cache.ImportsRoutedFrom("default"))
	// Listeners' namespace selectors are matched against the local
	// cluster's namespace labels; other members' namespaces keep none.
	for _, m := range cache.Snapshot().Members {
		got, err := m.Namespaces.Get(ns)
		require.NoError(t, err)
		if m.Name == "local" {
			assert.Equal(t, ns, got.Labels[corev1.LabelMetadataName], "the local cluster's namespaces keep their labels")
		} else {
			assert.Empty(t, got.Labels, "%s: another member's namespaces keep no labels", m.Name)
		}
	}

	patch := `{"spec":{"rules":[{"backendRefs":[{"group":"inference.networking.x-k8s.io","kind":"InferencePoolImport","name":"b"}]}]}}`
	_, err = gw.HTTPRoutes(ns).Patch(ctx, "r", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	require.NoError(t, err)
	routeEvent(ns+"/b", ns+"/a")
	assert.Equal(t, []string{ns + "/b"}, cache.ImportsRoutedThrough(ns, "gw"))

	require.NoError(t, gw.HTTPRoutes(ns).Delete(ctx, "r", metav1.DeleteOptions{}))
	routeEvent(ns + "/b")
	require.Eventually(t, func() bool { return len(cache.ImportsRoutedThrough(ns, "gw")) == 0 }, 10*time.Second, 20*time.Millisecond)

	// A route to a Service only is no business of imports: no event.
	plain := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}}
	plain.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "web", Port: ptr.To(gatewayv1.PortNumber(80))}}}}}}
	_, err = gw.HTTPRoutes(ns).Create(ctx, plain, metav1.CreateOptions{})
	require.NoError(t, err)
	grant := &gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"}}
	grant.Spec.From = []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: "other"}}
	grant.Spec.To = []gatewayv1.ReferenceGrantTo{{Group: "inference.networking.x-k8s.io", Kind: "InferencePoolImport"}}
	_, err = gatewayclient.NewForConfigOrDie(local).GatewayV1beta1().ReferenceGrants(ns).Create(ctx, grant, metav1.CreateOptions{})
	require.NoError(t, err)
	// The grant's event comes after the plain route's would have.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(events, func(ev Event) bool { return ev.Kind == KindReferenceGrant && ev.Namespace == ns })
	}, 20*time.Second, 20*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events {
		assert.NotEqual(t, "plain", ev.Name, "a route that uses no import makes no event")
		assert.Equal(t, "local", ev.Member)
	}
}
