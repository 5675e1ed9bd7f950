package sidecar

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	gatewayfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mcifake "github.com/mci-dev/mci/pkg/generated/clientset/versioned/fake"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

var importsGVR = v1alpha1.SchemeGroupVersion.WithResource("inferencepoolimports")

// clustersOf returns the cluster names of the only backend the current
// table routes "/" to, nil when there is none (or it is invalid).
func clustersOf(r *routetable.Router) []string {
	rl, _ := r.Table().Match(&routetable.RequestAttrs{Host: "my.model.com", Path: "/v1/completions"})
	if rl == nil || len(rl.Backends) == 0 || rl.Backends[0].Invalid != "" {
		return nil
	}
	return names(rl.Backends[0].Clusters)
}

func TestWatcherFollowsTheCluster(t *testing.T) {
	kube := kubefake.NewSimpleClientset(sidecartest.EPPService("llm", "127.0.1.1"))
	mci := mcifake.NewSimpleClientset(
		sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.2.1"}),
		sidecartest.Pool("llm", poolv1.FailOpen),
	)
	gw := gatewayfake.NewSimpleClientset(sidecartest.Route("llm-route", 0, []string{"my.model.com"}, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))))

	router := routetable.NewRouter()
	published := make(chan *routetable.Table, 1000)
	w := NewWatcher(Clients{Kube: kube, MCI: mci, Gateway: gw}, WatchConfig{LocalCluster: "cluster-b", DefaultPolicy: routingpolicy.Named()[routingpolicy.LocalFirst], InferenceModels: true}, router,
		func(t *routetable.Table, _ time.Duration) { published <- t }, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	select {
	case <-w.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher never synced")
	}
	require.Equal(t, []string{"cluster-a"}, clustersOf(router))
	rl, _ := router.Table().Match(&routetable.RequestAttrs{Host: "my.model.com", Path: "/"})
	b := rl.Backends[0]
	assert.Equal(t, routingpolicy.LocalFirst, b.Policy.Name)
	require.NotNil(t, b.Local, "the local pool of the same name")
	assert.Equal(t, "127.0.1.1:9002", b.Local.EPP)
	assert.Equal(t, poolv1.FailOpen, b.FailureMode)

	// Each import event is in the routing table within milliseconds.
	var lat []time.Duration
	for i, cs := range [][]sidecartest.Imported{
		{{Name: "cluster-a", Addr: "127.0.2.1"}, {Name: "cluster-c", Addr: "127.0.3.1"}},
		{{Name: "cluster-c", Addr: "127.0.3.1"}},
		{{Name: "cluster-a", Addr: "127.0.2.1", Ready: metav1.ConditionFalse}, {Name: "cluster-c", Addr: "127.0.3.1"}},
		{{Name: "cluster-a", Addr: "127.0.2.1"}},
	} {
		imp := sidecartest.Import("llm", cs...)
		imp.ResourceVersion = ""
		var want []string
		for _, c := range cs {
			if c.Ready != metav1.ConditionFalse {
				want = append(want, c.Name)
			}
		}
		start := time.Now()
		require.NoError(t, mci.Tracker().Update(importsGVR, imp, ns))
		require.Eventually(t, func() bool { return slices.Equal(want, clustersOf(router)) }, 10*time.Second, 100*time.Microsecond, "event %d", i)
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("import event to routing table, fake clientset: min %v max %v", lat[0], lat[len(lat)-1])

	// Withdrawing the export removes the import: its share answers 500.
	require.NoError(t, mci.Tracker().Delete(importsGVR, ns, "llm"))
	require.Eventually(t, func() bool {
		rl, _ := router.Table().Match(&routetable.RequestAttrs{Host: "my.model.com", Path: "/"})
		return rl != nil && rl.Backends[0].Invalid != ""
	}, 10*time.Second, time.Millisecond)

	// A new route is routed once it is seen.
	_, err := gw.GatewayV1().HTTPRoutes(ns).Create(ctx, sidecartest.Route("second", time.Hour, []string{"other.com"}, sidecartest.Rule(nil, sidecartest.PoolRef("llm", nil))), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rl, _ := router.Table().Match(&routetable.RequestAttrs{Host: "other.com", Path: "/"})
		return rl != nil && rl.Route.Name == "second" && len(rl.Backends[0].Clusters) == 1
	}, 10*time.Second, time.Millisecond)

	// The EPP Service going away leaves the local pool without a cluster.
	require.NoError(t, kube.CoreV1().Services(ns).Delete(ctx, "llm-epp", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		rl, _ := router.Table().Match(&routetable.RequestAttrs{Host: "other.com", Path: "/"})
		return rl != nil && len(rl.Backends[0].Clusters) == 0
	}, 10*time.Second, time.Millisecond)

	// Generations only grow.
	var last uint64
	for len(published) > 0 {
		tbl := <-published
		assert.Greater(t, tbl.Generation, last)
		last = tbl.Generation
	}
}

func TestWatcherRestrictsToItsGateway(t *testing.T) {
	attached := sidecartest.Route("mine", 0, []string{"my.model.com"}, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))
	attached.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw"}}
	other := sidecartest.Route("theirs", 0, []string{"my.model.com"}, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))
	other.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "other-gw"}}
	router := routetable.NewRouter()
	w := NewWatcher(Clients{
		Kube:    kubefake.NewSimpleClientset(),
		MCI:     mcifake.NewSimpleClientset(sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.2.1"})),
		Gateway: sidecartest.GatewayClients(attached, other, sidecartest.Gateway("inf-gw", sidecartest.Listener("http", 80, "", nil)), sidecartest.Gateway("other-gw", sidecartest.Listener("http", 80, "", nil))),
	}, WatchConfig{Gateways: gatewayRefs("example/inf-gw")}, router, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	<-w.Synced()
	require.Len(t, router.Table().Rules(), 1)
	assert.Equal(t, "mine", router.Table().Rules()[0].Route.Name)
}

// TestWatcherFollowsAttachmentRules changes the served Gateway's
// allowedRoutes, a namespace's labels and a ReferenceGrant through the
// clients, and watches a route of another namespace, and its backendRef to
// an import of the Gateway's namespace, follow.
func TestWatcherFollowsAttachmentRules(t *testing.T) {
	theirs := sidecartest.Route("theirs", 0, []string{"their.model.com"}, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))
	theirs.Namespace = "team-a"
	theirs.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw", Namespace: ptr.To(gatewayv1.Namespace(ns))}}
	theirs.Spec.Rules[0].BackendRefs[0].Namespace = ptr.To(gatewayv1.Namespace(ns))
	kube := kubefake.NewSimpleClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}})
	gw := sidecartest.GatewayClients(theirs, sidecartest.Gateway("inf-gw", sidecartest.Listener("http", 80, "", nil)))
	router := routetable.NewRouter()
	w := NewWatcher(Clients{
		Kube:    kube,
		MCI:     mcifake.NewSimpleClientset(sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.2.1"})),
		Gateway: gw,
	}, WatchConfig{Gateways: gatewayRefs("example/inf-gw")}, router, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	<-w.Synced()

	// served says whether their.model.com is routed, and to a usable
	// backend.
	served := func() (routed, usable bool) {
		rl, _ := router.Table().Match(&routetable.RequestAttrs{Host: "their.model.com", Path: "/"})
		if rl == nil {
			return false, false
		}
		return true, rl.Backends[0].Invalid == ""
	}
	waitFor := func(what string, routed, usable bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			r, u := served()
			return r == routed && u == usable
		}, 10*time.Second, time.Millisecond, what)
	}
	waitFor("from: Same (the default) refuses a route of another namespace", false, false)

	g, err := gw.GatewayV1().Gateways(ns).Get(ctx, "inf-gw", metav1.GetOptions{})
	require.NoError(t, err)
	g.Spec.Listeners[0].AllowedRoutes = sidecartest.FromNamespaces(gatewayv1.NamespacesFromSelector, &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}})
	_, err = gw.GatewayV1().Gateways(ns).Update(ctx, g, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return slices.ContainsFunc(router.Table().Errors, func(err error) bool {
			return strings.Contains(err.Error(), "labels of namespace team-a do not match allowedRoutes.namespaces.selector")
		})
	}, 10*time.Second, time.Millisecond, "a selector the namespace's labels do not match refuses it, and says why")
	waitFor("refused", false, false)

	_, err = kube.CoreV1().Namespaces().Update(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}}}, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor("labelling the namespace attaches the route; its backendRef to another namespace is refused without a ReferenceGrant", true, false)

	grant := &gatewayv1beta1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team-a-routes"},
		Spec: gatewayv1beta1.ReferenceGrantSpec{
			From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: "team-a"}},
			To:   []gatewayv1beta1.ReferenceGrantTo{{Group: routetable.InferencePoolImportGroup, Kind: routetable.InferencePoolImportKind}},
		},
	}
	_, err = gw.GatewayV1beta1().ReferenceGrants(ns).Create(ctx, grant, metav1.CreateOptions{})
	require.NoError(t, err)
	waitFor("a ReferenceGrant makes the backendRef usable", true, true)

	require.NoError(t, gw.GatewayV1beta1().ReferenceGrants(ns).Delete(ctx, grant.Name, metav1.DeleteOptions{}))
	waitFor("deleting the ReferenceGrant refuses it again", true, false)
}

func gatewayRefs(refs ...string) []types.NamespacedName {
	var out []types.NamespacedName
	for _, r := range refs {
		ns, name, _ := strings.Cut(r, "/")
		out = append(out, types.NamespacedName{Namespace: ns, Name: name})
	}
	return out
}

// TestEveryWatchedKindReachesTheBuilder: a kind without an applier would
// have its changes dropped without a word.
func TestEveryWatchedKindReachesTheBuilder(t *testing.T) {
	require.Len(t, appliers, int(kindBackendTLSPolicy)+1)
	for kind, a := range appliers {
		assert.NotNil(t, a.set, "kind %d", kind)
		assert.NotNil(t, a.remove, "kind %d", kind)
	}
}
