package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

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
	heap, rss uint64
	watches   float64
}

// measureIdle records cluster-b's mci-apiserver heap and RSS and the WATCH
// requests cluster-a's kube-apiserver serves, on a fresh ClusterSet.
func measureIdle(b *testing.B, e *env) idleFigures {
	b.Helper()
	n := len(e.names)
	f := idleFigures{heap: e.stableHeap(b, "cluster-b"), rss: e.rss(b, "cluster-b"), watches: e.watchConnections(b, "cluster-a")}
	results.add("memory", fmt.Sprintf("mci-apiserver live heap, idle, %d clusters", n), "MiB", float64(f.heap)/mib, "cluster-b's server, after a GC")
	results.add("memory", fmt.Sprintf("mci-apiserver RSS, idle, %d clusters", n), "MiB", float64(f.rss)/mib, "")
	results.add("list and watch", fmt.Sprintf("WATCH requests on one member kube-apiserver, %d clusters", n), "watches", f.watches,
		fmt.Sprintf("cluster-a, with %d mci-apiservers watching it", n))
	return f
}

// perMember derives the cost of one more member from the smallest and the
// largest ClusterSet: the slope, so that what does not depend on members
// cancels out.
func perMember(idle map[int]idleFigures) {
	var ns []int
	for n := range idle {
		ns = append(ns, n)
	}
	if len(ns) == 0 {
		return
	}
	slices.Sort(ns)
	lo, hi := ns[0], ns[len(ns)-1]
	results.fact(factHeapIdle, float64(idle[hi].heap))
	results.fact(factHeapIdleClusters, float64(hi))
	if lo == hi {
		return
	}
	d := float64(hi - lo)
	results.fact(factHeapPerMember, (float64(idle[hi].heap)-float64(idle[lo].heap))/d)
	results.fact(factWatchesPerReplica, (idle[hi].watches-idle[lo].watches)/d)
	note := fmt.Sprintf("slope between %d and %d clusters", lo, hi)
	results.add("memory", "mci-apiserver heap per member (idle)", "KiB", (float64(idle[hi].heap)-float64(idle[lo].heap))/d/1024, note)
	results.add("memory", "mci-apiserver RSS per member (idle)", "KiB", (float64(idle[hi].rss)-float64(idle[lo].rss))/d/1024, note)
	// Every cluster runs one mci-apiserver, and each watches every member:
	// one more cluster adds one watching replica to each member.
	results.add("list and watch", "WATCH requests per mci-apiserver replica on each member", "watches", (idle[hi].watches-idle[lo].watches)/d, note)
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
