package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterset"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mciinformers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

// reflectorBackoffGrown is how long a member partition lasts, from the
// cut, for it to matter that mci's link gate holds the member informers'
// requests: without the gate, client-go's reflectors, failing from the
// cut, would by then wait longer than healBound between attempts. Their
// backoff starts at 0.8s and doubles, each wait jittered up to twice its
// base, so the fourth wait (6.4s or more) has begun by
// 2*(0.8+1.6+3.2) = 11.2s.
const reflectorBackoffGrown = 12 * time.Second

// healBound is how soon after a heal every view must be back to the
// truth: the target is 2s; the bound allows for a loaded 2-core
// machine running three clusters, and the measured figure is logged.
const healBound = 5 * time.Second

// linkThreshold is --member-unreachable-after in the link ClusterSet:
// longer than the 3s of the fault ClusterSet so that a member behind a 2s
// link, which answers every probe in about 2s, is slow and not down.
const linkThreshold = 5 * time.Second

const linkNS = "links"

// linkSet is a ClusterSet of three clusters with a controllable proxy on
// every link between an mci-apiserver and a member (Options.Links), for
// the scenarios where one cluster loses one member while the others still
// see it. cluster-a and cluster-c export pools; an informer in every
// cluster watches its imports through the aggregator, as mci-sidecar does.
type linkSet struct {
	cs       *localclusterset.ClusterSet
	clusters map[string]*cluster
	// informers watch each cluster's imports through its aggregator.
	informers map[string]cache.SharedIndexInformer
	// exports are the pools each cluster exports, as the test made them:
	// the truth every view must come back to.
	exports map[string]map[string]bool
	// unreachable are the members each cluster's replicas cannot reach,
	// as the test arranged it.
	unreachable map[string]map[string]bool
}

func startLinkSet(t *testing.T) *linkSet {
	t.Helper()
	cs := startClusterSet(t, "mci-e2e-links-", localclusterset.Options{
		Clusters:               []string{"cluster-a", "cluster-b", "cluster-c"},
		Replicas:               2,
		MemberUnreachableAfter: linkThreshold,
		Links:                  true,
	})
	l := &linkSet{
		cs: cs, clusters: map[string]*cluster{}, informers: map[string]cache.SharedIndexInformer{},
		exports:     map[string]map[string]bool{"cluster-a": {}, "cluster-c": {}},
		unreachable: map[string]map[string]bool{},
	}
	ctx := t.Context()
	for _, name := range cs.Names() {
		l.clusters[name] = clientsIn(t, cs, name)
		l.clusters[name].createNamespace(t, ctx, linkNS)
		l.unreachable[name] = map[string]bool{}
	}
	for exporter := range l.exports {
		c := l.clusters[exporter]
		c.createEPPService(t, ctx, linkNS, "127.0.0.9")
		c.setEPPEndpoint(t, ctx, linkNS, true)
	}
	l.export(t, ctx, "cluster-a", "a-1")
	l.export(t, ctx, "cluster-a", "a-2")
	l.export(t, ctx, "cluster-c", "c-1")
	for _, name := range cs.Names() {
		factory := mciinformers.NewSharedInformerFactoryWithOptions(l.clusters[name].mci, 0, mciinformers.WithNamespace(linkNS))
		inf := factory.Inference().V1alpha1().InferencePoolImports().Informer()
		l.informers[name] = inf
		infCtx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go inf.RunWithContext(infCtx)
		syncCtx, syncCancel := context.WithTimeout(ctx, convergence)
		require.True(t, cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced), "the informer of %s must sync through the aggregator", name)
		syncCancel()
	}
	l.requireConverged(t, ctx, convergence)
	return l
}

func (l *linkSet) link(t *testing.T, watcher, member string) *localclusterset.Link {
	t.Helper()
	link, err := l.cs.MemberLink(watcher, member)
	require.NoError(t, err)
	return link
}

func (l *linkSet) export(t *testing.T, ctx context.Context, exporter, name string) {
	t.Helper()
	_, err := l.clusters[exporter].mci.InferencePoolV1().InferencePools(linkNS).Create(ctx, exportedPool(linkNS, name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	l.exports[exporter][name] = true
}

// want is what cluster in must serve: an import per pool another cluster
// exports, that cluster's entry Ready, or ClusterUnreachable where the
// test cut the link.
func (l *linkSet) want(in string) string {
	var lines []string
	for exporter, pools := range l.exports {
		if exporter == in {
			continue
		}
		reason := v1alpha1.ReasonReady
		if l.unreachable[in][exporter] {
			reason = v1alpha1.ReasonClusterUnreachable
		}
		for pool := range pools {
			lines = append(lines, pool+"="+exporter+":"+reason)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// views returns cluster in's imports as a fresh LIST through the
// aggregator and as its informer holds them.
func (l *linkSet) views(ctx context.Context, in string) (listed, informed string, err error) {
	list, err := l.clusters[in].mci.InferenceV1alpha1().InferencePoolImports(linkNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", err
	}
	objs := make([]*v1alpha1.InferencePoolImport, 0, len(list.Items))
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	var stored []*v1alpha1.InferencePoolImport
	for _, o := range l.informers[in].GetStore().List() {
		stored = append(stored, o.(*v1alpha1.InferencePoolImport))
	}
	return importState(objs), importState(stored), nil
}

// converged reports whether, in every cluster, the informer equals a
// fresh LIST and both equal what the test arranged.
func (l *linkSet) converged(ctx context.Context) (bool, string) {
	var bad []string
	for _, in := range slices.Sorted(maps.Keys(l.clusters)) {
		listed, informed, err := l.views(ctx, in)
		if err != nil {
			bad = append(bad, in+": "+err.Error())
			continue
		}
		if want := l.want(in); listed != want || informed != want {
			bad = append(bad, fmt.Sprintf("%s: want [%s], LIST [%s], informer [%s]", in, want, listed, informed))
		}
	}
	return len(bad) == 0, strings.Join(bad, "; ")
}

// waitConverged waits up to timeout for converged and returns how long it
// took.
func (l *linkSet) waitConverged(t *testing.T, ctx context.Context, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	waitfor.Eventually(t, ctx, timeout, l.converged)
	return time.Since(start)
}

// waitListed waits until cluster in's LIST holds an entry starting with
// prefix and returns how long that took.
func (l *linkSet) waitListed(t *testing.T, ctx context.Context, in, prefix string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	waitfor.Eventually(t, ctx, timeout, func(ctx context.Context) (bool, string) {
		listed, _, err := l.views(ctx, in)
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(" "+listed, " "+prefix), listed
	})
	return time.Since(start)
}

// noneUnreachable checks that cluster in's LIST flags no member.
func (l *linkSet) noneUnreachable(in string) func(context.Context) (bool, string) {
	return func(ctx context.Context) (bool, string) {
		listed, _, err := l.views(ctx, in)
		if err != nil {
			return false, err.Error()
		}
		return !strings.Contains(listed, v1alpha1.ReasonClusterUnreachable), listed
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func (l *linkSet) requireConverged(t *testing.T, ctx context.Context, timeout time.Duration) {
	t.Helper()
	l.waitConverged(t, ctx, timeout)
}

// sample runs check every 100ms until stop is closed and counts the
// times it failed, keeping the first failure.
func sample(ctx context.Context, check func(context.Context) (bool, string)) (stop func() (n, failed int, first string)) {
	var n, failed atomic.Int64
	var first atomic.Value
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ok, why := check(ctx)
			n.Add(1)
			if !ok {
				failed.Add(1)
				first.CompareAndSwap(nil, why)
			}
		}
	}()
	return func() (int, int, string) {
		close(done)
		<-finished
		s, _ := first.Load().(string)
		return int(n.Load()), int(failed.Load()), s
	}
}

// clusterView checks that in's LIST equals what the test arranged.
func (l *linkSet) clusterView(in string) func(context.Context) (bool, string) {
	return func(ctx context.Context) (bool, string) {
		listed, _, err := l.views(ctx, in)
		if err != nil {
			return false, err.Error()
		}
		return listed == l.want(in), listed
	}
}

// replicaRuntime reads go_goroutines and go_memstats_heap_alloc_bytes of
// each mci-apiserver replica from its /metrics. The readers are made once
// and reused: a new client per reading would open a new connection each
// time, which the server keeps (and counts goroutines for) while idle.
func replicaRuntime(t *testing.T, ctx context.Context, readers []replicaMetric) (goroutines, heapMiB []float64) {
	t.Helper()
	for _, read := range readers {
		goroutines = append(goroutines, read(t, ctx, "go_goroutines"))
		heapMiB = append(heapMiB, read(t, ctx, "go_memstats_heap_alloc_bytes")/(1<<20))
	}
	return goroutines, heapMiB
}

// TestLinkFaults runs the link scenarios one after the other on one
// ClusterSet; each heals its link and requires every view to be back to
// the truth before the next.
func TestLinkFaults(t *testing.T) {
	l := startLinkSet(t)
	ctx := t.Context()

	t.Run("a member partitioned from one cluster is flagged only there and every view is back within seconds of the heal", func(t *testing.T) {
		link := l.link(t, "cluster-b", "cluster-a")
		others := sample(ctx, func(ctx context.Context) (bool, string) {
			okA, whyA := l.clusterView("cluster-a")(ctx)
			okC, whyC := l.clusterView("cluster-c")(ctx)
			return okA && okC, "cluster-a [" + whyA + "] cluster-c [" + whyC + "]"
		})
		link.Cut()
		cut := time.Now()
		defer func() { _ = link.Heal() }()
		l.unreachable["cluster-b"]["cluster-a"] = true
		waitfor.Eventually(t, ctx, 4*linkThreshold+10*time.Second, l.clusterView("cluster-b"))
		flagged := time.Since(cut)
		n, failed, first := others()
		// A change cluster-b cannot see while cut off, but cluster-c can.
		l.export(t, ctx, "cluster-a", "a-3")
		waitfor.Eventually(t, ctx, convergence, l.clusterView("cluster-c"))
		// The partition is the scenario: it lasts until ungated retries
		// would have backed off past healBound.
		time.Sleep(time.Until(cut.Add(reflectorBackoffGrown)))
		partitioned := time.Since(cut)

		require.NoError(t, link.Heal())
		l.unreachable["cluster-b"]["cluster-a"] = false
		seen := l.waitListed(t, ctx, "cluster-b", "a-3=", 60*time.Second)
		took := l.waitConverged(t, ctx, 60*time.Second) + seen
		t.Logf("partition cluster-b -/- cluster-a: flagged in cluster-b after %s (threshold %s); partition lasted %s; "+
			"heal -> the change made meanwhile listed in cluster-b in %s, every view (informer and fresh LIST, 3 clusters) equal to the truth in %s (target 2s); "+
			"cluster-a and cluster-c views wrong in %d of %d samples until it was flagged",
			flagged.Round(10*time.Millisecond), linkThreshold, partitioned.Round(100*time.Millisecond),
			seen.Round(10*time.Millisecond), took.Round(10*time.Millisecond), failed, n)
		assert.LessOrEqual(t, took, healBound, "every view must equal the truth soon after the heal")
		assert.Zero(t, failed, "only the partitioned cluster may flag the member; first wrong view: %s", first)
		assert.LessOrEqual(t, flagged, linkThreshold+time.Second, "a cut link is flagged within the threshold + 1s")
	})

	t.Run("a blackholed member is flagged within the threshold and costs its watcher no goroutines or memory", func(t *testing.T) {
		link := l.link(t, "cluster-b", "cluster-a")
		require.NoError(t, link.Blackhole())
		holed := time.Now()
		defer func() { _ = link.Heal() }()
		l.unreachable["cluster-b"]["cluster-a"] = true
		waitfor.Eventually(t, ctx, 4*linkThreshold+10*time.Second, l.clusterView("cluster-b"))
		flagged := time.Since(holed)
		assert.LessOrEqual(t, flagged, linkThreshold+time.Second, "a blackholed member is flagged within the threshold + 1s")

		// Runtime of cluster-b's replicas while the member stays
		// blackholed: every 2s for 24s after a 4s settling. The sleeps
		// pace a measurement: the window holds four probe cycles of the
		// blackholed member (each waits out the probe timeout, the 5s
		// threshold, then 1s), so that a leak per probe or per held
		// request would show as growth.
		time.Sleep(4 * time.Second)
		readers := replicaMetrics(t, l.cs, "cluster-b")
		var goroutines, heap [][]float64 // [sample][replica]
		for i := range 13 {
			if i > 0 {
				time.Sleep(2 * time.Second)
			}
			g, h := replicaRuntime(t, ctx, readers)
			goroutines, heap = append(goroutines, g), append(heap, h)
		}
		require.NoError(t, link.Heal())
		l.unreachable["cluster-b"]["cluster-a"] = false
		took := l.waitConverged(t, ctx, 60*time.Second)
		for r := range goroutines[0] {
			var g, h []float64
			for i := range goroutines {
				g, h = append(g, goroutines[i][r]), append(h, heap[i][r])
			}
			early, late := median(g[:3]), median(g[len(g)-3:])
			// The heap in use swings with each GC cycle (up to twice the
			// live heap): the least reading of each half of the window
			// approximates the live heap after a collection.
			half := len(h) / 2
			earlyHeap, lateHeap := slices.Min(h[:half]), slices.Min(h[half:])
			t.Logf("blackhole cluster-b -> cluster-a: replica %d goroutines %v (median first 6s %.0f, last 6s %.0f), heap MiB least of first 12s %.1f, of last 12s %.1f (max %.1f) over 24s",
				r, g, early, late, earlyHeap, lateHeap, slices.Max(h))
			assert.LessOrEqual(t, late, early*1.1+5, "replica %d: goroutines grew while a member was blackholed", r)
			assert.LessOrEqual(t, lateHeap, earlyHeap*1.2+2, "replica %d: heap grew while a member was blackholed", r)
		}
		t.Logf("blackhole cluster-b -> cluster-a: flagged after %s (threshold %s); heal -> every view equal to the truth in %s",
			flagged.Round(10*time.Millisecond), linkThreshold, took.Round(10*time.Millisecond))
		assert.LessOrEqual(t, took, healBound, "every view must equal the truth soon after the heal")
	})

	t.Run("a slow link to a member keeps imports correct and does not hold back other members", func(t *testing.T) {
		// Baseline: how long an export in cluster-c takes to be listed in
		// cluster-b with every link healthy.
		l.export(t, ctx, "cluster-c", "c-base")
		baseline := l.waitListed(t, ctx, "cluster-b", "c-base=", convergence)
		link := l.link(t, "cluster-b", "cluster-a")
		defer func() { _ = link.Heal() }()
		for i, latency := range []time.Duration{500 * time.Millisecond, 2 * time.Second} {
			require.NoError(t, link.Latency(latency, latency/10))
			slowed := time.Now()
			flags := sample(ctx, l.noneUnreachable("cluster-b"))
			// One probe interval and one exchange over the slow link: from
			// here every probe of cluster-a pays the latency, before the
			// exports whose listing is measured.
			time.Sleep(latency + time.Second)
			slowPool, healthyPool := fmt.Sprintf("a-slow-%d", i), fmt.Sprintf("c-healthy-%d", i)
			l.export(t, ctx, "cluster-a", slowPool)
			l.export(t, ctx, "cluster-c", healthyPool)
			healthy := l.waitListed(t, ctx, "cluster-b", healthyPool+"=", convergence)
			slow := l.waitListed(t, ctx, "cluster-b", slowPool+"=", convergence) + healthy
			took := l.waitConverged(t, ctx, convergence)
			// Probes and watches go on at this latency: cluster-b flags no
			// member until the threshold and a probe interval have passed
			// since the link slowed (the least a flag would take).
			window := max(time.Until(slowed.Add(linkThreshold+time.Second)), waitfor.Interval)
			waitfor.Consistently(t, ctx, window, l.noneUnreachable("cluster-b"))
			n, flagged, first := flags()
			t.Logf("latency %s (±%s) cluster-b -> cluster-a: export in healthy cluster-c listed in cluster-b after %s (baseline %s), in slow cluster-a after %s; all views equal the truth after %s; samples of cluster-b flagging a member: %d of %d",
				latency, latency/10, healthy.Round(10*time.Millisecond), baseline.Round(10*time.Millisecond), slow.Round(10*time.Millisecond), took.Round(10*time.Millisecond), flagged, n)
			assert.Zero(t, flagged, "a slow member is not an unreachable one; first: %s", first)
			assert.Less(t, healthy, baseline+2*time.Second, "a slow member must not hold back the others")
		}
		require.NoError(t, link.Heal())
		l.waitConverged(t, ctx, convergence)
	})

	t.Run("a client cut off from the aggregator catches up after the heal", func(t *testing.T) {
		// An informer in cluster-c that reaches its kube-apiserver (and so
		// the aggregator) through ClientLink: the client's own partition.
		cfg, err := l.cs.ClientConfig("cluster-c")
		require.NoError(t, err)
		// The client's requests that got no answer: its reflector's
		// attempts through the cut link.
		var failures atomic.Int64
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return failureCounter{next: rt, failures: &failures}
		})
		factory := mciinformers.NewSharedInformerFactoryWithOptions(mciclient.NewForConfigOrDie(cfg), 0, mciinformers.WithNamespace(linkNS))
		inf := factory.Inference().V1alpha1().InferencePoolImports().Informer()
		infCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go inf.RunWithContext(infCtx)
		require.True(t, cache.WaitForCacheSync(ctx.Done(), inf.HasSynced))
		informed := func(ctx context.Context) (bool, string) {
			var stored []*v1alpha1.InferencePoolImport
			for _, o := range inf.GetStore().List() {
				stored = append(stored, o.(*v1alpha1.InferencePoolImport))
			}
			got := importState(stored)
			return got == l.want("cluster-c"), got
		}
		waitfor.Eventually(t, ctx, convergence, informed)

		link, err := l.cs.ClientLink("cluster-c")
		require.NoError(t, err)
		failuresBefore := failures.Load()
		link.Cut()
		cut := time.Now()
		defer func() { _ = link.Heal() }()
		l.export(t, ctx, "cluster-a", "while-client-cut")
		// Healed once two of the client's attempts failed through the cut
		// (the second after a backoff wait): it is in its backoff and has
		// missed the export, which it must catch up on.
		waitfor.Eventually(t, ctx, 30*time.Second, func(context.Context) (bool, string) {
			n := failures.Load() - failuresBefore
			return n >= 2, fmt.Sprintf("%d of the client's requests failed since the cut", n)
		})
		partitioned := time.Since(cut)
		require.NoError(t, link.Heal())
		healed := time.Now()
		// client-go's reflector retries on its own backoff (up to 30s
		// between attempts): the figure is the client's, not mci's.
		waitfor.Eventually(t, ctx, 45*time.Second, informed)
		t.Logf("client link to cluster-c cut for %s: heal -> the client's informer equal to the truth in %s (client-go's reflector backoff)",
			partitioned.Round(10*time.Millisecond), time.Since(healed).Round(10*time.Millisecond))
		l.waitConverged(t, ctx, convergence)
	})

	t.Run("a replica restart during a member partition during a Secret rotation loses no import", func(t *testing.T) {
		a, b := l.clusters["cluster-a"], l.clusters["cluster-b"]
		ka, err := l.cs.Cluster("cluster-a")
		require.NoError(t, err)
		server, err := l.cs.MemberServer("cluster-b", "cluster-a")
		require.NoError(t, err)
		secretWith := func(reader string) *corev1.Secret {
			kubeconfig := tokenKubeconfig(t, "cluster-a", server, ka.Config.CAData, memberReaderToken(t, ctx, a, reader, t))
			return &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "member-cluster-a", Namespace: localclusterset.MCIAPIServerNamespace, Labels: map[string]string{clusterset.MemberClusterLabel: "cluster-a"}},
				Data:       map[string][]byte{clusterset.MemberKubeconfigKey: kubeconfig},
			}
		}
		// cluster-b reaches cluster-a through a Secret rather than its
		// kubeconfig directory, through the same link.
		joins := secretJoinsIn(t, l.cs, "cluster-b", "cluster-a")
		_, err = b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Create(ctx, secretWith("link-reader-1"), metav1.CreateOptions{})
		require.NoError(t, err)
		dirFile := filepath.Join(l.cs.MemberKubeconfigDir("cluster-b"), "cluster-a.kubeconfig")
		require.NoError(t, os.Rename(dirFile, filepath.Join(l.cs.Dir, "cluster-b-cluster-a.kubeconfig.parked")))
		waitSecretJoinsIn(t, l.cs, "cluster-b", "cluster-a", joins)
		l.waitConverged(t, ctx, convergence)

		var deleted atomic.Int64
		handle, err := l.informers["cluster-b"].AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { deleted.Add(1) }})
		require.NoError(t, err)
		defer func() { _ = l.informers["cluster-b"].RemoveEventHandler(handle) }()

		link := l.link(t, "cluster-b", "cluster-a")
		link.Cut()
		defer func() { _ = link.Heal() }()
		l.unreachable["cluster-b"]["cluster-a"] = true
		waitfor.Eventually(t, ctx, 4*linkThreshold+10*time.Second, l.clusterView("cluster-b"))
		// Each replica, asked directly, must keep cluster-a's pools
		// (flagged) from here to the heal: replica 0 through the
		// rotation, replica 1 also through its restart.
		replicas := l.replicaViews(t, "cluster-b")
		// Each replica flags on its own clock: sample once both have.
		waitfor.Eventually(t, ctx, 4*linkThreshold, func(ctx context.Context) (bool, string) {
			var states []string
			ok := true
			for _, view := range replicas {
				got, err := view(ctx)
				ok = ok && err == nil && got == l.want("cluster-b")
				states = append(states, fmt.Sprintf("[%s %v]", got, err))
			}
			return ok, strings.Join(states, " ")
		})
		// What each replica serves while it is ready (what a Service in
		// front of them would send clients to).
		var keptBy []func() (int, int, string)
		for r, view := range replicas {
			keptBy = append(keptBy, sample(ctx, func(ctx context.Context) (bool, string) {
				if ready, _ := l.cs.MCIAPIServerReplicaReady(ctx, "cluster-b", r); !ready {
					return true, "" // stopped, starting or unready: not serving
				}
				got, err := view(ctx)
				if err != nil {
					return true, ""
				}
				return got == l.want("cluster-b"), got
			}))
		}

		// The rotation while partitioned: a new token, the old one revoked.
		rotated := secretWith("link-reader-2")
		current, err := b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Get(ctx, rotated.Name, metav1.GetOptions{})
		require.NoError(t, err)
		rotated.ResourceVersion = current.ResourceVersion
		_, err = b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Update(ctx, rotated, metav1.UpdateOptions{})
		require.NoError(t, err)
		a.deleteServiceAccount(t, ctx, "link-reader-1")
		// A replica restarts meanwhile, and the rotated member waits past
		// the threshold, after which a replacement that cannot list was
		// swapped in. The restarted replica has never listed cluster-a:
		// it must stay unready rather than serve cluster-a's pools as
		// gone while replica 0 serves them (until --member-remove-after,
		// 5 minutes here, when every replica would agree they are).
		require.NoError(t, l.cs.StopMCIAPIServerReplica("cluster-b", 1))
		require.NoError(t, l.cs.LaunchMCIAPIServerReplica("cluster-b", 1))
		// Watched past the threshold, when the replacement that cannot
		// list is swapped in, and a probe interval and a readiness check
		// more.
		var why string
		waitfor.Consistently(t, ctx, linkThreshold+2*time.Second, func(ctx context.Context) (bool, string) {
			var ready bool
			ready, why = l.cs.MCIAPIServerReplicaReady(ctx, "cluster-b", 1)
			return !ready, "a replica started during the partition is ready before it listed cluster-a: " + why
		})
		n, wrong, first := keptBy[0]()
		nRestarted, wrongRestarted, firstRestarted := keptBy[1]()

		require.NoError(t, link.Heal())
		healed := time.Now()
		l.unreachable["cluster-b"]["cluster-a"] = false
		took := l.waitConverged(t, ctx, 60*time.Second)
		waitfor.Eventually(t, ctx, 60*time.Second, func(ctx context.Context) (bool, string) {
			return l.cs.MCIAPIServerReplicaReady(ctx, "cluster-b", 1)
		})
		readyAfterHeal := time.Since(healed)
		// Connected with the rotated token: the first one is revoked.
		l.export(t, ctx, "cluster-a", "after-rotation")
		l.waitConverged(t, ctx, convergence)
		t.Logf("overlap (partition cluster-b -/- cluster-a, Secret rotated, replica 1 of cluster-b restarted): replica 0 views without cluster-a's flagged pools in %d of %d samples; "+
			"restarted replica 1, while ready, in %d of %d (first: %s); replica 1 unready during the partition (%s), ready %s after the heal; imports deleted in cluster-b's informer: %d; heal -> every view equal to the truth in %s",
			wrong, n, wrongRestarted, nRestarted, firstRestarted, why, readyAfterHeal.Round(10*time.Millisecond), deleted.Load(), took.Round(10*time.Millisecond))
		assert.Zero(t, wrong, "replica 0 dropped cluster-a's last known pools when the rotated credentials could not list; first: %s", first)
		assert.Zero(t, wrongRestarted, "restarted replica 1 served without cluster-a's pools while ready; first: %s", firstRestarted)
		assert.Zero(t, deleted.Load(), "an informer of cluster-b saw imports deleted: a replica served the partitioned member's pools as gone")
		assert.LessOrEqual(t, took, healBound, "every view must equal the truth soon after the heal")
	})
}

// failureCounter counts the requests of a client that got no answer.
type failureCounter struct {
	next     http.RoundTripper
	failures *atomic.Int64
}

func (f failureCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(req)
	if err != nil {
		f.failures.Add(1)
	}
	return resp, err
}

// replicaViews returns, per mci-apiserver replica of cluster, a LIST of
// its imports asked of that replica directly (not through the front).
func (l *linkSet) replicaViews(t *testing.T, cluster string) []func(context.Context) (string, error) {
	t.Helper()
	c, err := l.cs.Cluster(cluster)
	require.NoError(t, err)
	var out []func(context.Context) (string, error)
	for _, port := range c.MCIAPIServerReplicaPorts {
		config := rest.CopyConfig(c.Config)
		config.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
		config.TLSClientConfig.CAData = l.cs.MCIServingCA()
		config.TLSClientConfig.CAFile = ""
		config.Timeout = 5 * time.Second
		client := mciclient.NewForConfigOrDie(config)
		out = append(out, func(ctx context.Context) (string, error) {
			list, err := client.InferenceV1alpha1().InferencePoolImports(linkNS).List(ctx, metav1.ListOptions{})
			if err != nil {
				return "", err
			}
			objs := make([]*v1alpha1.InferencePoolImport, 0, len(list.Items))
			for i := range list.Items {
				objs = append(objs, &list.Items[i])
			}
			return importState(objs), nil
		})
	}
	return out
}

// secretJoinsIn counts, in the log of each of watcher's mci-apiserver
// replicas, the connections to member made from a member Secret.
func secretJoinsIn(t *testing.T, cs *localclusterset.ClusterSet, watcher, member string) []int {
	t.Helper()
	var counts []int
	for _, p := range cs.Processes() {
		if !strings.HasPrefix(p.Name, watcher+"-mci-apiserver") {
			continue
		}
		data, err := os.ReadFile(p.Log)
		require.NoError(t, err)
		n := 0
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "Member joined the ClusterSet") && strings.Contains(line, `member="`+member+`"`) && strings.Contains(line, `source="secret`) {
				n++
			}
		}
		counts = append(counts, n)
	}
	return counts
}

func waitSecretJoinsIn(t *testing.T, cs *localclusterset.ClusterSet, watcher, member string, before []int) {
	t.Helper()
	waitfor.Eventually(t, t.Context(), convergence, func(context.Context) (bool, string) {
		now := secretJoinsIn(t, cs, watcher, member)
		for i := range now {
			if now[i] <= before[i] {
				return false, fmt.Sprintf("connections from a Secret per replica: %v, before %v", now, before)
			}
		}
		return true, ""
	})
}
