package clusterset

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/testutil"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/servedapis"
	"github.com/mci-dev/mci/test/localclusterset"
)

// The mode follows what the member's discovery answers, not what it
// failed to answer at start.
func TestTheModeIsDecidedOnTheMembersOwnAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		member *member
		served servedapis.Set
		want   memberMode
	}{
		{name: "summaries served: summary mode", member: &member{summaryPolicy: SummariesAuto}, served: servedSet(t, true, false), want: modeSummary},
		{name: "summaries not served: full mode", member: &member{summaryPolicy: SummariesAuto}, served: servedSet(t, false, false), want: modeFull},
		{name: "discovery unanswered: not decided yet", member: &member{summaryPolicy: SummariesAuto}, served: servedSet(t, true, true), want: modeDiscovering},
		{name: "never reads summaries: full mode whatever discovery says", member: &member{summaryPolicy: SummariesNever}, served: servedSet(t, true, true), want: modeFull},
		{name: "the local cluster is always watched", member: &member{local: true}, served: servedSet(t, true, false), want: modeFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.member.modeOf(tc.served))
		})
	}
}

// servedSet is a discovery answer for the summary APIs: served, and
// whether only assumed so (the cluster could not be asked).
func servedSet(t *testing.T, served, assumed bool) servedapis.Set {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case assumed:
			http.Error(w, "boom", http.StatusInternalServerError)
		case served:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"inference.networking.x-k8s.io/v1alpha1","resources":[{"name":"inferencepoolexportsummaries","namespaced":true,"kind":"InferencePoolExportSummary","verbs":["list"]},{"name":"inferenceclustersummaries","namespaced":false,"kind":"InferenceClusterSummary","verbs":["list"]}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	m, err := newMember("m", "", &rest.Config{Host: srv.URL}, 0, func(Event) {})
	require.NoError(t, err)
	d, err := m.discoveryClient()
	require.NoError(t, err)
	return servedapis.Discover(t.Context(), d, time.Second, apiExportSummaries, apiClusterSummaries)
}

// A member whose discovery fails while it joins used to be read in full
// mode for good: with the summary-only identity members hand out, every
// list of its objects was then forbidden until mci-apiserver restarted.
// Now it is asked again with backoff and read through its summaries as
// soon as it answers, and a member that stops publishing them is read in
// full mode without a restart.
func TestAMemberWhoseDiscoveryFailsAtStartIsReadInSummaryModeOnceItAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	defer restoreModeTimings(time.Second)()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const ns = "mode"
	// The member's discovery of the summary group version fails until the
	// test lets it.
	var failDiscovery atomic.Bool
	failDiscovery.Store(true)
	local, cache := summaryMemberBehindProxy(t, ctx, ns, func(w http.ResponseWriter, r *http.Request) bool {
		if failDiscovery.Load() && r.URL.Path == "/apis/"+v1alpha1.SchemeGroupVersion.String() {
			http.Error(w, "discovery is having a bad day", http.StatusInternalServerError)
			return true
		}
		return false
	})

	require.Eventually(t, func() bool { return cache.member("remote") != nil }, time.Minute, 20*time.Millisecond)
	assert.Equal(t, modeDiscovering, cache.member("remote").mode, "not read in full mode on a failed discovery")
	assert.Error(t, cache.Ready(), "a member still discovering has not listed")

	failDiscovery.Store(false)
	require.Eventually(t, func() bool {
		m := cache.member("remote")
		return m.mode == modeSummary && m.hasSynced() && len(summariesOf(cache, "remote")) == 1
	}, 30*time.Second, 50*time.Millisecond, "read through its summaries once its discovery answers, without a restart")
	require.Eventually(t, func() bool { return cache.Ready() == nil }, 30*time.Second, 50*time.Millisecond)
	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(`
# HELP mci_clusterset_member_mode [ALPHA] 1 for the mode this replica reads the member in, 0 for the others: full (its objects are watched), summary (the summaries its own mci-apiserver publishes), discovering (its API discovery has not said yet whether it publishes summaries: nothing of it is read, and it is asked again with backoff).
# TYPE mci_clusterset_member_mode gauge
mci_clusterset_member_mode{member="local",mode="discovering"} 0
mci_clusterset_member_mode{member="local",mode="full"} 1
mci_clusterset_member_mode{member="local",mode="summary"} 0
mci_clusterset_member_mode{member="remote",mode="discovering"} 0
mci_clusterset_member_mode{member="remote",mode="full"} 0
mci_clusterset_member_mode{member="remote",mode="summary"} 1
`), "mci_clusterset_member_mode"))

	// A discovery that fails again changes nothing: the summaries stay.
	failDiscovery.Store(true)
	assert.Never(t, func() bool { return cache.member("remote").mode != modeSummary }, 3*time.Second, 100*time.Millisecond)
	failDiscovery.Store(false)

	// The member stops publishing summaries (its mci-apiserver is
	// removed): it answers NotFound, and is read in full mode.
	crds := dynamic.NewForConfigOrDie(local).Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, r := range []string{"inferencepoolexportsummaries", "inferenceclustersummaries"} {
		require.NoError(t, crds.Delete(ctx, r+"."+v1alpha1.GroupName, metav1.DeleteOptions{}))
	}
	require.Eventually(t, func() bool {
		m := cache.member("remote")
		return m.mode == modeFull && m.hasSynced()
	}, time.Minute, 50*time.Millisecond, "read in full mode once it answers that it publishes no summaries")
	_, err := cache.member("remote").namespaceLister().Get(ns)
	assert.NoError(t, err, "its namespaces are watched")
}

// A replica that starts while its link to a member is down (a partition)
// cannot discover what the member serves; once the link heals, it reads
// the member within a probe interval, not when a discovery backoff grown
// while the link was down next lets it ask. The backoff is made longer
// than the test so that only the gate's reopening can wake it.
func TestAMemberDiscoveredWhileItsLinkIsDownIsReadOnceTheLinkHeals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	defer restoreModeTimings(time.Minute)()
	discoveryBackoff = wait.Backoff{Duration: 5 * time.Minute, Factor: 1, Steps: 1 << 30}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	// The link: while down, every connection is dropped unanswered.
	var down atomic.Bool
	down.Store(true)
	_, cache := summaryMemberBehindProxy(t, ctx, "partitioned", func(w http.ResponseWriter, _ *http.Request) bool {
		if !down.Load() {
			return false
		}
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
		return true
	})
	require.Eventually(t, func() bool {
		m := cache.member("remote")
		return m != nil && m.mode == modeDiscovering && m.gate.held()
	}, time.Minute, 20*time.Millisecond, "the member's probe fails and its discovery waits")

	down.Store(false)
	healed := time.Now()
	require.Eventually(t, func() bool {
		m := cache.member("remote")
		return m.mode == modeSummary && m.hasSynced() && len(summariesOf(cache, "remote")) == 1
	}, 30*time.Second, 20*time.Millisecond, "read once its link heals, without waiting out the discovery backoff")
	t.Logf("read %s after the link healed", time.Since(healed).Round(10*time.Millisecond))
}

// summaryMemberBehindProxy starts a one-cluster ClusterSet that serves
// summaries, publishes as member "remote" the summary of one export in
// namespace ns, and runs a Cache of that cluster as "local" with "remote"
// as its member: the same kube-apiserver reached through a proxy that
// intercept may answer instead. It returns the cluster's configuration
// and the Cache.
func summaryMemberBehindProxy(t *testing.T, ctx context.Context, ns string, intercept func(http.ResponseWriter, *http.Request) bool) (*rest.Config, *Cache) {
	t.Helper()
	local := summaryServingCluster(t, ctx)
	_, err := kubernetes.NewForConfigOrDie(local).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	publishSummaries(t, ctx, local, "remote", ns, "pool")
	remote := memberProxy(t, local, intercept)
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: time.Second, RemoveAfter: time.Minute}, func(Event) {})
	go func() {
		_ = cache.Run(ctx, staticSource{"remote": {rest: asAnotherCluster(remote, "remote-cluster-id"), fingerprint: "1"}})
	}()
	return local, cache
}

// restoreModeTimings shortens how often members are asked again what
// they serve, for a test, and returns what puts them back.
func restoreModeTimings(recheck time.Duration) func() {
	backoff, every := discoveryBackoff, modeRecheck
	discoveryBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: time.Second}
	modeRecheck = recheck
	return func() { discoveryBackoff, modeRecheck = backoff, every }
}

// summaryServingCluster starts a one-cluster ClusterSet whose
// kube-apiserver serves the summary resources as CRDs, and returns its
// configuration.
func summaryServingCluster(t *testing.T, ctx context.Context) *rest.Config {
	t.Helper()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{
		Dir: t.TempDir(), Clusters: []string{"local"}, Log: testLog{t},
		CRDPaths: []string{"../../test/localclusterset/crds", "testdata/summary-crds"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	return cs.Clusters[0].Config
}

// publishSummaries writes, as member's mci-apiserver would publish them,
// its cluster summary listing namespace and the summary of one export
// namespace/pool.
func publishSummaries(t *testing.T, ctx context.Context, config *rest.Config, member, namespace, pool string) {
	t.Helper()
	require.NoError(t, publish(ctx, dynamic.NewForConfigOrDie(config), &v1alpha1.InferenceClusterSummary{
		ObjectMeta: metav1.ObjectMeta{Name: member},
		Status:     v1alpha1.InferenceClusterSummaryStatus{Namespaces: []string{namespace}},
	}))
	require.NoError(t, publish(ctx, dynamic.NewForConfigOrDie(config), exportSummary(namespace, pool)))
}

// publish creates a summary through the summary CRDs
// (testdata/summary-crds): mci-apiserver's own API is read-only.
func publish(ctx context.Context, client dynamic.Interface, obj runtime.Object) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	o := &unstructured.Unstructured{Object: u}
	o.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
	resource := apiExportSummaries
	o.SetKind("InferencePoolExportSummary")
	if _, ok := obj.(*v1alpha1.InferenceClusterSummary); ok {
		resource = apiClusterSummaries
		o.SetKind("InferenceClusterSummary")
	}
	_, err = client.Resource(resource).Namespace(o.GetNamespace()).Create(ctx, o, metav1.CreateOptions{})
	return err
}

func exportSummary(namespace, pool string) *v1alpha1.InferencePoolExportSummary {
	return &v1alpha1.InferencePoolExportSummary{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: pool},
		Status: v1alpha1.InferencePoolExportSummaryStatus{
			RoutingMode:      v1alpha1.RoutingModeEndpoint,
			TargetPortNumber: 8000,
		},
	}
}

// memberProxy reaches the cluster of config through a plain HTTP proxy
// on loopback, which answers itself the requests intercept takes.
func memberProxy(t *testing.T, config *rest.Config, intercept func(http.ResponseWriter, *http.Request) bool) *rest.Config {
	t.Helper()
	target, err := url.Parse(config.Host)
	require.NoError(t, err)
	transport, err := rest.TransportFor(config)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = transport
	proxy.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if intercept == nil || !intercept(w, r) {
			proxy.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}
}

// summariesOf lists what the Cache reads of member's summaries.
func summariesOf(c *Cache, member string) []*v1alpha1.InferencePoolExportSummary {
	for _, m := range c.Snapshot().Members {
		if m.Name == member && m.Summaries != nil {
			all, _ := m.Summaries.List(labels.Everything())
			return all
		}
	}
	return nil
}
