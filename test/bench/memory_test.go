package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/scheduling"
)

const mib = 1 << 20

// idleFigures are what one ClusterSet size costs before any pool exists.
type idleFigures struct {
	heap, rss        uint64
	watches, proxied float64
}

// measureIdle records the heap and RSS of mode's observer's mci-apiserver
// and the WATCH requests cluster-a's kube-apiserver serves from its
// storage (watches) and proxies to its mci-apiserver (proxied), on a fresh
// ClusterSet.
func measureIdle(b *testing.B, e *env, mode string) idleFigures {
	b.Helper()
	n := len(e.names)
	obs := observer(mode)
	f := idleFigures{heap: e.stableHeap(b, obs), rss: e.rss(b, obs)}
	f.proxied, f.watches = split(e.watchCounts(b, "cluster-a").requests)
	results.add("memory", fmt.Sprintf("%s mode: mci-apiserver live heap, idle, %d clusters", mode, n), "MiB", float64(f.heap)/mib, obs+"'s server, after a GC")
	results.add("memory", fmt.Sprintf("%s mode: mci-apiserver RSS, idle, %d clusters", mode, n), "MiB", float64(f.rss)/mib, "")
	if mode == modeSummary {
		results.add("list and watch", fmt.Sprintf("WATCH requests on one member kube-apiserver, %d clusters", n), "watches", f.watches+f.proxied,
			fmt.Sprintf("cluster-a: %.0f on its storage, %.0f proxied to its mci-apiserver; read by %d summary-mode and %d full-mode mci-apiservers and its own",
				f.watches, f.proxied, len(readersOf(e.names, "cluster-a", modeSummary)), len(readersOf(e.names, "cluster-a", modeFull))))
	}
	return f
}

// perMember derives the cost of one more member in mode from the smallest
// and the largest ClusterSet: the slope, so that what does not depend on
// members cancels out. The watches per replica come from benchWatchOrigins,
// which tells the replicas of each mode apart.
func perMember(mode string, idle map[int]idleFigures) {
	var ns []int
	for n := range idle {
		ns = append(ns, n)
	}
	if len(ns) == 0 {
		return
	}
	slices.Sort(ns)
	lo, hi := ns[0], ns[len(ns)-1]
	results.fact(mode+"."+factHeapIdle, float64(idle[hi].heap))
	results.fact(mode+"."+factHeapIdleClusters, float64(hi))
	if lo == hi {
		return
	}
	d := float64(hi - lo)
	results.fact(mode+"."+factHeapPerMember, (float64(idle[hi].heap)-float64(idle[lo].heap))/d)
	note := fmt.Sprintf("slope between %d and %d clusters", lo, hi)
	results.add("memory", mode+" mode: mci-apiserver heap per member (idle)", "KiB", (float64(idle[hi].heap)-float64(idle[lo].heap))/d/1024, note)
	results.add("memory", mode+" mode: mci-apiserver RSS per member (idle)", "KiB", (float64(idle[hi].rss)-float64(idle[lo].rss))/d/1024, note)
}

// createUnrelated creates count Services, each with an EndpointSlice of two
// endpoints, that no pool uses, in ns. The Services are headless (no
// cluster IP to allocate: half the writes, and the allocator's range would
// not hold 20,000 of them); mci caches them trimmed either way.
func createUnrelated(ctx context.Context, kube kubernetes.Interface, ns string, count, writers int) error {
	return parallel(count, writers, func(i int) error {
		name := fmt.Sprintf("svc-%05d", i)
		_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name, "tier": "backend"}, Annotations: map[string]string{"owner": "team-" + name}},
			Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone,
				Selector:  map[string]string{"app": name},
				Ports:     []corev1.ServicePort{{Name: "http", Port: 8080}, {Name: "metrics", Port: 9090}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		_, err = kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"192.0.2.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name + "-a", Namespace: ns}},
				{Addresses: []string{"192.0.2.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name + "-b", Namespace: ns}},
			},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		}, metav1.CreateOptions{})
		return err
	})
}

// benchScheduling counts the scheduling decisions per second of the EPP's
// filter chain (pkg/scheduling) over pods candidates with a spread of
// queues, KV cache and adapters, cycling through critical, standard and
// sheddable requests. It times its own loop for cfg.SchedulingTime: the
// run's -benchtime is 1x.
func benchScheduling(b *testing.B, pods int) {
	r := rand.New(rand.NewPCG(uint64(pods), 0))
	now := time.Now()
	adapters := []string{"lora-a", "lora-b", "lora-c", "lora-d", "lora-e", "lora-f"}
	cands := make([]*scheduling.Metrics, pods)
	for i := range cands {
		m := &scheduling.Metrics{
			WaitingQueue: r.IntN(100), KVCacheUsage: r.Float64(),
			ActiveAdapters: sets.New[string](), WaitingAdapters: sets.New[string](), MaxLoRA: 4, UpdatedAt: now,
		}
		for range r.IntN(5) {
			m.ActiveAdapters.Insert(adapters[r.IntN(len(adapters))])
		}
		cands[i] = m
	}
	reqs := []scheduling.Request{
		{Criticality: scheduling.Critical, Adapter: "lora-c"},
		{Criticality: scheduling.Critical, Adapter: "lora-z"},
		{Criticality: scheduling.Standard},
		{Criticality: scheduling.Sheddable, Adapter: "lora-c"},
	}
	s := scheduling.New(scheduling.DefaultConfig(), rand.NewPCG(1, 2))
	decisions := 0
	start := time.Now()
	for time.Since(start) < cfg.SchedulingTime {
		for i := range 1000 {
			_, _ = s.Schedule(reqs[i%len(reqs)], cands, now)
		}
		decisions += 1000
	}
	rate := float64(decisions) / time.Since(start).Seconds()
	results.add("scheduling", fmt.Sprintf("EPP scheduling decisions per second, %d pods", pods), "decisions/s", rate,
		fmt.Sprintf("one goroutine; %.1f µs per decision", 1e6/rate))
}

// benchPoolNamespaceWatches: one exported pool in a new namespace of
// cluster-a makes every mci-apiserver that watches cluster-a's objects
// (full mode, and cluster-a's own) open its Service and EndpointSlice
// watches there; summary-mode readers open none.
func benchPoolNamespaceWatches(b *testing.B, e *env) {
	ctx := context.Background()
	n := len(e.names)
	watchers := len(readersOf(e.names, "cluster-a", modeFull)) + 1
	storage := func() float64 {
		_, s := split(e.watchCounts(b, "cluster-a").requests)
		return s
	}
	before := storage()
	_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(scaleNS).Create(ctx, pool(scaleNS, "anchor", true), metav1.CreateOptions{})
	require.NoError(b, err)
	after := before
	_ = pollFor(20*time.Second, func() bool {
		after = storage()
		return after-before >= float64(2*watchers)
	})
	// A second more for watches beyond two per watcher: the figure is a
	// count, and the sleep is its window.
	time.Sleep(time.Second)
	after = storage()
	perNS := (after - before) / float64(watchers)
	results.fact(modeFull+"."+factWatchesPerPoolNS, perNS)
	results.fact(modeSummary+"."+factWatchesPerPoolNS, 0)
	results.add("list and watch", "full mode: storage WATCH requests per replica per member namespace holding pools", "watches", perNS,
		fmt.Sprintf("cluster-a's storage WATCH requests %.0f -> %.0f when its first pool in a namespace appeared, %d clusters, %d of whose mci-apiservers watch cluster-a's objects (full mode and its own); summary-mode readers open none", before, after, n, watchers))
}

// benchUnrelated creates unrelated Services and EndpointSlices in
// cluster-a, first where no pool is, then beside the pools, and measures
// each mode's observer.
func benchUnrelated(b *testing.B, e *env, unrelatedNS string) {
	ctx := context.Background()
	n := len(e.names)
	for _, where := range []struct{ ns, label string }{{unrelatedNS, "in a namespace without pools"}, {scaleNS, "beside exported pools"}} {
		before := map[string]uint64{}
		for _, mode := range []string{modeSummary, modeFull} {
			before[mode] = e.stableHeap(b, observer(mode))
		}
		start := time.Now()
		require.NoError(b, createUnrelated(ctx, e.kube["cluster-a"], where.ns, cfg.Unrelated, cfg.Writers))
		took := time.Since(start)
		logf("%d unrelated Services+EndpointSlices %s created in %s (%.0f objects/s)", cfg.Unrelated, where.label, took.Round(time.Millisecond), float64(2*cfg.Unrelated)/took.Seconds())
		for _, mode := range []string{modeSummary, modeFull} {
			obs := observer(mode)
			growth := float64(int64(e.stableHeap(b, obs)) - int64(before[mode]))
			per := growth / float64(cfg.Unrelated)
			if where.ns == scaleNS {
				results.fact(mode+"."+factHeapPerUnrelated, per)
			}
			note := fmt.Sprintf("%d in cluster-a; %s's mci-apiserver heap %+.1f MiB; linear, so 10,000 per member x %d members costs %.1f MiB", cfg.Unrelated, obs, growth/mib, n, per*10000*float64(n)/mib)
			name := mode + " mode: heap per unrelated Service+EndpointSlice of another member, " + where.label
			if mode == modeSummary {
				// Target 0: stableHeap settles within 1 MiB, so anything
				// under 1 MiB in all is within its noise.
				noise := float64(mib) / float64(cfg.Unrelated)
				results.check("memory", name, "bytes", per, fmt.Sprintf("0 (noise +-%.0f)", noise), per <= noise, note)
			} else {
				results.add("memory", name, "bytes", per, note)
			}
		}
	}
}
