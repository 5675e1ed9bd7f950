package clusterset

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/imports"
)

// A hostile member, one real kube-apiserver serving the summary resources
// as CRDs so that it publishes whatever the test writes, as a compromised
// member's mci-apiserver could: too many summaries, a summary of a
// megabyte, too many namespaces, changes faster than its rate, a list
// over the response cap, and a cluster summary that names another
// cluster. Each one freezes it at that limit (and a fresh read takes its
// place once it is back within them); meanwhile the import of a
// well-behaved member stays served and unflagged, and this process's
// heap stays under a cap.
//
// The sizes are scaled down from the ones a fleet would see (10^5
// summaries, 10^6 namespaces, 1,000 changes a second) to what a 2-core CI
// machine writes into one kube-apiserver within a minute, with limits
// scaled down alike: each scenario crosses its limit by the same margin.
// MCI_HOSTILE_SCALE multiplies the sizes and limits (a bench run:
// MCI_HOSTILE_SCALE=20).
func TestAHostileMemberIsFrozenAtItsLimitsAndTheOthersAreUnaffected(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	scale := 1
	if s := os.Getenv("MCI_HOSTILE_SCALE"); s != "" {
		var err error
		scale, err = strconv.Atoi(s)
		require.NoError(t, err, "MCI_HOSTILE_SCALE")
	}
	defer restoreModeTimings(time.Second)()
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(4*scale)*time.Minute)
	defer cancel()

	local := summaryServingCluster(t, ctx)
	writer := rest.CopyConfig(local)
	writer.QPS, writer.Burst = 1000, 1000
	kube := kubernetes.NewForConfigOrDie(writer)
	dyn := dynamic.NewForConfigOrDie(writer)
	const shared = "shared"
	for _, ns := range []string{shared, "flood"} {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	// The well-behaved member exports shared/pool, read in full mode.
	good := wellBehavedMember(t, ctx, local, writer, shared)
	// The hostile member publishes its cluster summary and one export.
	publishSummaries(t, ctx, writer, "hostile", "flood", "legit")
	hostile := memberProxy(t, local, nil)

	// The response cap is not reached here: it must exceed the 16 MiB
	// client-go allows one watch event (TestResponsesFromAMemberAreBounded
	// checks it).
	limits := Limits{
		Objects:         100 * scale,
		Bytes:           int64(512<<10) * int64(scale),
		Namespaces:      100 * scale,
		EventsPerSecond: 40,
		EventBurst:      80,
		ResponseBytes:   DefaultLimits.ResponseBytes,
		FreezeRetry:     2 * time.Second,
	}
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 5 * time.Second, RemoveAfter: time.Minute, Limits: limits}, func(Event) {})
	go func() {
		_ = cache.Run(ctx, staticSource{
			"good":    {rest: asAnotherCluster(good, "good-cluster-id"), fingerprint: "1"},
			"hostile": {rest: asAnotherCluster(hostile, "hostile-cluster-id"), fingerprint: "1"},
		})
	}()
	require.Eventually(t, func() bool {
		h := cache.member("hostile")
		return cache.Ready() == nil && h != nil && h.mode == modeSummary && len(summariesOf(cache, "hostile")) == 1
	}, time.Minute, 50*time.Millisecond, "both members listed, the hostile one in summary mode")

	// goodImported says the well-behaved member's pool is imported and
	// its cluster unflagged.
	goodImported := func() bool {
		imp, ok := imports.Import(cache.Snapshot(), shared, "pool")
		if !ok {
			return false
		}
		for _, c := range imp.Status.Clusters {
			if c.Name == "good" {
				return readyReasonOf(c.Conditions) != v1alpha1.ReasonClusterUnreachable
			}
		}
		return false
	}
	require.True(t, goodImported())

	// The process holds the test's clients too; the Cache's share of it
	// is a few MiB.
	const heapCap = 64 << 20
	var maxHeap uint64
	frozenAt := func(reason string) {
		t.Helper()
		start := time.Now()
		require.Eventually(t, func() bool {
			got, _, _ := cache.member("hostile").quota.state()
			return got == reason
		}, time.Minute, 20*time.Millisecond, "frozen at %s", reason)
		v := memberView(cache, "hostile")
		require.NotNil(t, v.Unreachable, "a frozen member is flagged")
		assert.Contains(t, v.Unreachable.Message, "frozen since")
		assert.True(t, goodImported(), "the well-behaved member's import is unaffected")
		assert.NoError(t, cache.Ready(), "a frozen member does not hold readiness")
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		maxHeap = max(maxHeap, ms.HeapAlloc)
		assert.Less(t, ms.HeapAlloc, uint64(heapCap), "heap under its cap")
		t.Logf("frozen at %s %s after it was sent; heap %d MiB", reason, time.Since(start).Round(10*time.Millisecond), ms.HeapAlloc>>20)
	}
	thawed := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			got, _, _ := cache.member("hostile").quota.state()
			return got == "" && cache.member("hostile").hasSynced()
		}, time.Minute, 50*time.Millisecond, "read again once back within its limits")
		assert.True(t, goodImported())
	}
	exports := dyn.Resource(apiExportSummaries)
	clusters := dyn.Resource(apiClusterSummaries)

	// Too many summaries, sent slower than the change rate.
	pace := time.NewTicker(time.Second / time.Duration(limits.EventsPerSecond/2))
	for i := range limits.Objects + 10 {
		<-pace.C
		require.NoError(t, publish(ctx, dyn, exportSummary("flood", fmt.Sprintf("s-%d", i))))
	}
	pace.Stop()
	frozenAt(quotaObjects)
	held := len(summariesOf(cache, "hostile"))
	assert.LessOrEqual(t, held, limits.Objects+1, "nothing past the summary that crossed the limit is applied")
	t.Logf("%d summaries sent, %d held", limits.Objects+10, held)
	require.NoError(t, exports.Namespace("flood").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	require.NoError(t, publish(ctx, dyn, exportSummary("flood", "legit")))
	thawed()

	// A summary of a megabyte.
	big := exportSummary("flood", "big")
	big.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Big", Message: strings.Repeat("x", int(limits.Bytes)+1)}}
	require.NoError(t, publish(ctx, dyn, big))
	frozenAt(quotaBytes)
	require.NoError(t, exports.Namespace("flood").Delete(ctx, "big", metav1.DeleteOptions{}))
	thawed()

	// Too many namespaces.
	many := make([]string, limits.Namespaces+1)
	for i := range many {
		many[i] = fmt.Sprintf("ns-%05d", i)
	}
	patchNamespaces(t, ctx, clusters, "hostile", many)
	frozenAt(quotaNamespaces)
	patchNamespaces(t, ctx, clusters, "hostile", []string{"flood"})
	thawed()

	// Changes faster than its rate, past its burst, from a few writers at
	// once, until the member is frozen.
	var writers errgroup.Group
	for w := range 8 {
		writers.Go(func() error {
			for i := 0; i < limits.EventBurst*5; i++ {
				if got, _, _ := cache.member("hostile").quota.state(); got != "" {
					return nil
				}
				if _, err := exports.Namespace("flood").Patch(ctx, "legit", types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{"w%d":"%d"}}}`, w, i), metav1.PatchOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(t, writers.Wait())
	frozenAt(quotaEventRate)
	thawed()

	// A cluster summary that names another cluster.
	require.NoError(t, clusters.Delete(ctx, "hostile", metav1.DeleteOptions{}))
	require.NoError(t, publish(ctx, dyn, &v1alpha1.InferenceClusterSummary{
		ObjectMeta: metav1.ObjectMeta{Name: "good"},
		Status:     v1alpha1.InferenceClusterSummaryStatus{Namespaces: []string{shared}},
	}))
	frozenAt(quotaIdentity)
	_, err := cache.member("hostile").namespaceLister().Get(shared)
	assert.Error(t, err, "the namespaces of a summary naming another cluster are not read")
	assert.Empty(t, summariesOf(cache, "hostile"), "nothing a member speaking for another cluster sent is served, not even as last known data")
	assert.True(t, goodImported(), "the cluster it speaks for keeps its own import")
	t.Logf("largest heap after a freeze: %d MiB (cap %d MiB)", maxHeap>>20, heapCap>>20)
}

func patchNamespaces(t *testing.T, ctx context.Context, clusters dynamic.NamespaceableResourceInterface, name string, namespaces []string) {
	t.Helper()
	quoted := make([]string, len(namespaces))
	for i, ns := range namespaces {
		quoted[i] = strconv.Quote(ns)
	}
	_, err := clusters.Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"namespaces":[`+strings.Join(quoted, ",")+`]}}`), metav1.PatchOptions{})
	require.NoError(t, err)
}

func memberView(c *Cache, name string) imports.Member {
	for _, m := range c.Snapshot().Members {
		if m.Name == name {
			return m
		}
	}
	return imports.Member{}
}

func readyReasonOf(conditions []metav1.Condition) string {
	for _, c := range conditions {
		if c.Type == "Ready" {
			return c.Reason
		}
	}
	return ""
}

// replacingMember is the member being read afresh in name's place, nil
// when there is none.
func (c *Cache) replacingMember(name string) *member {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.replacing[name]
}

// wellBehavedMember exports pool "pool" of namespace ns (which must exist)
// from the cluster writer reaches, and returns local behind a proxy that
// says it publishes no summaries, so that it is read in full mode: the
// member the hostile tests set beside a hostile one.
func wellBehavedMember(t *testing.T, ctx context.Context, local, writer *rest.Config, ns string) *rest.Config {
	t.Helper()
	_, err := mciclient.NewForConfigOrDie(writer).InferencePoolV1().InferencePools(ns).Create(ctx, &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool", Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": "pool"}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return memberProxy(t, local, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/apis/"+v1alpha1.SchemeGroupVersion.String() {
			http.NotFound(w, r)
			return true
		}
		return false
	})
}
