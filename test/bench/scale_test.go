package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/test/bench/crdfanout"
	"github.com/mci-dev/mci/test/quantile"
)

const scaleNS = "scale"

// listPath is the REST path of a namespaced LIST of gvr.
func listPath(gvr schema.GroupVersionResource, ns string) string {
	return fmt.Sprintf("/apis/%s/%s/namespaces/%s/%s", gvr.Group, gvr.Version, ns, gvr.Resource)
}

// rawList GETs a LIST as bytes, without decoding, so that what is timed is
// the server and the transfer, the same for both systems.
func (e *env) rawList(ctx context.Context, cluster, path string) ([]byte, error) {
	return e.kube[cluster].Discovery().RESTClient().Get().AbsPath(path).SetHeader("Accept", "application/json").DoRaw(ctx)
}

// countItems counts the items of a JSON LIST and how many list cluster in
// status.clusters (any cluster when cluster is "").
func countItems(body []byte, cluster string) (items, complete int, err error) {
	var l struct {
		Items []struct {
			Status struct {
				Clusters []struct {
					Name string `json:"name"`
				} `json:"clusters"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return 0, 0, err
	}
	for _, it := range l.Items {
		for _, c := range it.Status.Clusters {
			if cluster == "" || c.Name == cluster {
				complete++
				break
			}
		}
	}
	return len(l.Items), complete, nil
}

// waitServed polls cluster-b's LIST at path until it holds want items, each
// with a status entry (the baseline writes status after the object).
func (e *env) waitServed(b *testing.B, path string, want int, timeout time.Duration) time.Duration {
	b.Helper()
	start := time.Now()
	last := ""
	err := pollEvery(2*time.Second, timeout, func() bool {
		body, err := e.rawList(context.Background(), "cluster-b", path)
		if err != nil {
			last = err.Error()
			return false
		}
		items, complete, err := countItems(body, "")
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%d items, %d with a status, of %d", items, complete, want)
		return complete >= want
	})
	require.NoError(b, err, "%s: %s", path, last)
	return time.Since(start)
}

func pollEvery(interval, timeout time.Duration, cond func() bool) error {
	err := wait.PollUntilContextTimeout(context.Background(), interval, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		return fmt.Errorf("not true after %s: %w", timeout, err)
	}
	return nil
}

// waitExportedStatus waits until every member's pools in ns (perCluster of
// them, and the anchor in cluster-a) carry mci's Exported entry, and
// returns how long that took.
func (e *env) waitExportedStatus(b *testing.B, ns string, perCluster int, timeout time.Duration) time.Duration {
	b.Helper()
	start := time.Now()
	done := map[string]bool{}
	require.NoError(b, pollFor(timeout, func() bool {
		for _, name := range e.names {
			if done[name] {
				continue
			}
			pools, err := e.mci[name].InferencePoolV1().InferencePools(ns).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				return false
			}
			written := 0
			for _, p := range pools.Items {
				if slices.ContainsFunc(p.Status.Parents, func(ps poolv1.ParentStatus) bool {
					return ps.ControllerName == v1alpha1.ControllerName && ps.ParentRef.Kind == v1alpha1.ExportedParentKind
				}) {
					written++
				}
			}
			if written < perCluster {
				return false
			}
			done[name] = true
		}
		return true
	}), "Exported status of every pool")
	return time.Since(start)
}

// benchScale: unrelated objects, then PoolsPerCluster exported pools in
// every member, then the baseline's custom resources for the same pools in
// cluster-b; memory at each step, LIST of everything, and many watchers.
func benchScale(b *testing.B, e *env) {
	n := len(e.names)
	const unrelatedNS = "unrelated"
	e.namespaceEverywhere(b, scaleNS)
	e.namespaceEverywhere(b, unrelatedNS)
	benchPoolNamespaceWatches(b, e)
	if cfg.Unrelated > 0 {
		benchUnrelated(b, e, unrelatedNS)
	}

	growth, want := benchPoolsMemory(b, e)
	basePath := benchBaselineState(b, e, growth, want)
	benchList(b, e, basePath, want)
	benchWatchers(b, e)

	for _, mode := range []string{modeSummary, modeFull} {
		obs := observer(mode)
		results.add("memory", fmt.Sprintf("%s mode: mci-apiserver live heap, end of the scale run, %d clusters", mode, n), "MiB", float64(e.stableHeap(b, obs))/mib, obs)
		results.add("memory", fmt.Sprintf("%s mode: mci-apiserver RSS, end of the scale run, %d clusters", mode, n), "MiB", float64(e.rss(b, obs))/mib, obs)
	}
}

// watchClients returns k dynamic clients of cluster-b, each with its own
// connections (a dialer of its own keeps client-go from sharing one
// transport), so many watches are not multiplexed on one HTTP/2
// connection.
func (e *env) watchClients(b *testing.B, k int) []dynamic.Interface {
	b.Helper()
	out := make([]dynamic.Interface, k)
	for i := range out {
		cfg := rest.CopyConfig(e.cfg["cluster-b"])
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		cfg.Dial = d.DialContext
		out[i] = dynamic.NewForConfigOrDie(cfg)
	}
	return out
}

// benchWatchers opens cfg.Watchers watches of cluster-b's imports (through
// the aggregator) and as many of the baseline's custom resources, then
// toggles the export of one pool in cluster-a: both systems react to the
// same change, and each change is timed until every watcher of each
// system has seen it.
func benchWatchers(b *testing.B, e *env) {
	ctx := context.Background()
	w := max(cfg.Watchers, 1)
	_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(scaleNS).Create(ctx, pool(scaleNS, "watched", false), metav1.CreateOptions{})
	require.NoError(b, err)
	heapBefore := e.stableHeap(b, "cluster-b")
	clients := e.watchClients(b, (w+49)/50)
	open := func(gvr schema.GroupVersionResource) []watch.Interface {
		ws := make([]watch.Interface, w)
		require.NoError(b, parallel(w, 16, func(i int) error {
			ri := clients[i%len(clients)].Resource(gvr).Namespace(scaleNS)
			l, err := ri.List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				return err
			}
			ws[i], err = ri.Watch(ctx, metav1.ListOptions{ResourceVersion: l.GetResourceVersion(), AllowWatchBookmarks: true})
			return err
		}))
		b.Cleanup(func() {
			for _, x := range ws {
				if x != nil {
					x.Stop()
				}
			}
		})
		return ws
	}
	start := time.Now()
	mciWatches := open(importGVR)
	baseWatches := open(crdfanout.GVR)
	logf("opened %d watches of each kind in %s", w, time.Since(start).Round(time.Millisecond))
	heapWith := e.stableHeap(b, "cluster-b")
	results.fact(factHeapPerWatch, float64(int64(heapWith)-int64(heapBefore))/float64(w))
	results.add("list and watch", "mci-apiserver heap per open watch", "KiB", float64(int64(heapWith)-int64(heapBefore))/float64(w)/1024,
		fmt.Sprintf("%d watches of all imports of the namespace through the aggregator", w))

	// all waits until every watch of ws has delivered the change.
	all := func(ws []watch.Interface, t0 time.Time, seen func(watch.Event) bool) ([]time.Duration, error) {
		lat := make([]time.Duration, len(ws))
		errs := make([]error, len(ws))
		var wg sync.WaitGroup
		for i, x := range ws {
			wg.Go(func() {
				timeout := time.After(60 * time.Second)
				for {
					select {
					case ev, ok := <-x.ResultChan():
						if !ok {
							errs[i] = fmt.Errorf("watch %d closed", i)
							return
						}
						if seen(ev) {
							lat[i] = time.Since(t0)
							return
						}
					case <-timeout:
						errs[i] = fmt.Errorf("watch %d: no event in 60s", i)
						return
					}
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		return lat, nil
	}
	var mciP50, mciAll, baseP50, baseAll []time.Duration
	// A CPU profile of the serving replica over about the changes below
	// (each takes well under a second): what its CPU per change is spent on.
	profiled := e.saveCPUProfile(b, "cluster-b", "mci-apiserver-cpu-watchers.pb.gz", time.Duration(max(cfg.WatchChanges, 1))*time.Second)
	cpuBefore := e.cpuTime(b, "cluster-b")
	for i := range max(cfg.WatchChanges, 1) {
		on := i%2 == 0
		seen := func(ev watch.Event) bool {
			u, ok := named(ev, "watched")
			if !ok {
				return false
			}
			if !on {
				return ev.Type == watch.Deleted
			}
			listed, _ := importedFrom(u, "cluster-a")
			return ev.Type != watch.Deleted && listed
		}
		t0 := time.Now()
		var mciLat, baseLat []time.Duration
		var mciErr, baseErr error
		var wg sync.WaitGroup
		wg.Go(func() { mciLat, mciErr = all(mciWatches, t0, seen) })
		wg.Go(func() { baseLat, baseErr = all(baseWatches, t0, seen) })
		_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(scaleNS).Patch(ctx, "watched", types.MergePatchType, exportPatch(on), metav1.PatchOptions{})
		require.NoError(b, err)
		wg.Wait()
		require.NoError(b, mciErr, "mci watchers, change %d", i)
		require.NoError(b, baseErr, "baseline watchers, change %d", i)
		mciP50, mciAll = append(mciP50, median(mciLat)), append(mciAll, quantile.Nearest(mciLat, 100))
		baseP50, baseAll = append(baseP50, median(baseLat)), append(baseAll, quantile.Nearest(baseLat, 100))
		time.Sleep(200 * time.Millisecond) // paces the changes
	}
	cpu := e.cpuTime(b, "cluster-b") - cpuBefore
	profiled()
	note := fmt.Sprintf("%d watchers each; median over %d export changes seen by both systems at once", w, len(mciP50))
	results.add("list and watch", fmt.Sprintf("%d watchers: mci-apiserver CPU per change", w), "ms", ms(cpu/time.Duration(len(mciP50))),
		"cluster-b's serving replica, from /proc, 10 ms ticks: encoding, filtering and writing one event to every watcher")
	results.compare("list and watch", fmt.Sprintf("%d watchers: median watcher notified", w), "ms", ms(median(mciP50)), "CRD fan-out", ms(median(baseP50)), "", false, note)
	results.compare("list and watch", fmt.Sprintf("%d watchers: last watcher notified", w), "ms", ms(median(mciAll)), "CRD fan-out", ms(median(baseAll)), "", false, note)
}

// benchPoolsMemory creates PoolsPerCluster exported pools in every member,
// in parallel across members, and measures each mode's observer side by
// side: it returns each observer's heap growth and how many imports
// cluster-b serves.
func benchPoolsMemory(b *testing.B, e *env) (growth map[string]float64, want int) {
	ctx := context.Background()
	n := len(e.names)
	heapBefore, rssBefore := map[string]uint64{}, map[string]uint64{}
	for _, mode := range []string{modeSummary, modeFull} {
		heapBefore[mode], rssBefore[mode] = e.stableHeap(b, observer(mode)), e.rss(b, observer(mode))
	}
	total := n * cfg.PoolsPerCluster
	start := time.Now()
	require.NoError(b, parallel(total, cfg.Writers, func(i int) error {
		cluster := e.names[i%n]
		name := fmt.Sprintf("pool-%s-%05d", cluster, i/n)
		_, err := e.mci[cluster].InferencePoolV1().InferencePools(scaleNS).Create(ctx, pool(scaleNS, name, true), metav1.CreateOptions{})
		return err
	}))
	created := time.Since(start)
	want = (n-1)*cfg.PoolsPerCluster + 1 // every member's pools but cluster-b's own, and the anchor
	mciPath := listPath(importGVR, scaleNS)
	served := e.waitServed(b, mciPath, want, 10*time.Minute)
	logf("%d pools created in %s (%.0f/s); cluster-b served all %d imports %s after the last create", total, created.Round(time.Millisecond), float64(total)/created.Seconds(), want, served.Round(time.Millisecond))
	results.add("convergence", fmt.Sprintf("bulk: %d pools created in %d clusters, all %d imports served in cluster-b (summary mode)", total, n, want), "s", (created + served).Seconds(),
		fmt.Sprintf("from the first create; creating took %s at %.0f pools/s", created.Round(time.Millisecond), float64(total)/created.Seconds()))
	// The Exported status of every pool is part of the steady state: until
	// each member's leader has written it (at its client's 20 writes/s),
	// every member's mci-apiserver is still receiving the status updates.
	statused := e.waitExportedStatus(b, scaleNS, cfg.PoolsPerCluster, 10*time.Minute)
	results.add("convergence", fmt.Sprintf("bulk: Exported status written on all %d pools", total), "s", (created + statused).Seconds(),
		fmt.Sprintf("from the first create; each member's leader writes its %d pools' status at most 20 writes/s", cfg.PoolsPerCluster))
	growth = map[string]float64{}
	for _, mode := range []string{modeSummary, modeFull} {
		obs := observer(mode)
		heapAfter, rssAfter := e.stableHeap(b, obs), e.rss(b, obs)
		e.saveHeapProfile(b, obs, fmt.Sprintf("mci-apiserver-heap-pools-%s.pb.gz", mode))
		growth[mode] = float64(int64(heapAfter) - int64(heapBefore[mode]))
		perPool := growth[mode] / float64(total)
		results.fact(mode+"."+factHeapPerPool, perPool)
		target, met := "< 4 KiB", perPool < 4096
		if mode == modeSummary {
			target, met = "<= 1 KiB", perPool <= 1024
		}
		results.check("memory", mode+" mode: mci-apiserver heap per exported pool", "bytes", perPool, target, met,
			fmt.Sprintf("%d clusters x %d pools; %s's heap %.1f -> %.1f MiB", n, cfg.PoolsPerCluster, obs, float64(heapBefore[mode])/mib, float64(heapAfter)/mib))
		results.add("memory", mode+" mode: mci-apiserver RSS per exported pool", "bytes", float64(int64(rssAfter)-int64(rssBefore[mode]))/float64(total),
			fmt.Sprintf("RSS %.1f -> %.1f MiB (RSS keeps freed pages: coarse)", float64(rssBefore[mode])/mib, float64(rssAfter)/mib))
	}

	return growth, want
}

// benchBaselineState has the baseline write the same imports into
// cluster-b only (its cost in every other member is the same: each holds
// its own copy, so the ClusterSet-wide figure is cluster-b's times the
// members) and compares the whole ClusterSet's state; it returns the
// baseline's LIST path.
func benchBaselineState(b *testing.B, e *env, growth map[string]float64, want int) string {
	n := len(e.names)
	total := n * cfg.PoolsPerCluster
	start := time.Now()
	ctrl := e.startBaseline(b, scaleNS, []string{"cluster-b"})
	basePath := listPath(crdfanout.GVR, scaleNS)
	e.waitServed(b, basePath, want, 15*time.Minute)
	baseTook := time.Since(start)
	logf("the CRD fan-out baseline wrote %d imports into cluster-b in %s (%d writes)", want, baseTook.Round(time.Millisecond), ctrl.Writes())
	keys, size := e.etcdBytes(b, "/cluster-b/"+crdfanout.Group+"/"+crdfanout.GVR.Resource+"/")
	require.NotZero(b, keys, "no baseline imports found in etcd")
	perImport := float64(size) / float64(keys)
	results.fact(factEtcdPerImport, perImport)
	results.add("memory", "CRD fan-out: etcd bytes per import per member", "bytes", perImport, fmt.Sprintf("%d keys under cluster-b's prefix (latest revision; history until compaction comes on top)", keys))
	clusterSetBytes := perImport * float64(want) * float64(n)
	for _, mode := range []string{modeSummary, modeFull} {
		target, met := "", false
		if mode == modeSummary {
			target, met = "<= 0.5x", growth[mode]*float64(n) <= 0.5*clusterSetBytes
		}
		results.compare("memory", fmt.Sprintf("%s mode: state of %d exported pools, whole ClusterSet: mci heap (all %d replicas) vs baseline etcd (all members)", mode, total, n), "MiB",
			growth[mode]*float64(n)/mib, "CRD fan-out etcd", clusterSetBytes/mib, target, met,
			fmt.Sprintf("%s's heap growth x %d replicas (every replica in this mode caches every member's exports); the baseline's kube-apiservers also keep every import in their watch caches", observer(mode), n))
	}
	results.add("write amplification", fmt.Sprintf("CRD fan-out: writes to create the imports of %d pools in one member", want), "writes", float64(ctrl.Writes()),
		fmt.Sprintf("x %d members for the ClusterSet; mci: 0", n))
	results.add("convergence", fmt.Sprintf("bulk: CRD fan-out writes the %d imports of existing pools into one member", want), "s", baseTook.Seconds(),
		"from the controller's start (informers synced) until cluster-b lists them all with status; one member only")

	return basePath
}

// benchList: LIST of all imports through cluster-b's aggregator against
// the same number of custom resources from cluster-b's kube-apiserver,
// rounds alternating.
func benchList(b *testing.B, e *env, basePath string, want int) {
	ctx := context.Background()
	n := len(e.names)
	mciPath := listPath(importGVR, scaleNS)
	var mciList, crdList []time.Duration
	var mciBytes, crdBytes int
	for r := range max(cfg.ListRounds, 1) {
		for j := range 2 {
			path := mciPath
			if (r+j)%2 == 1 {
				path = basePath
			}
			t0 := time.Now()
			body, err := e.rawList(ctx, "cluster-b", path)
			d := time.Since(t0)
			require.NoError(b, err)
			items, _, err := countItems(body, "")
			require.NoError(b, err)
			require.GreaterOrEqual(b, items, want, path)
			if path == mciPath {
				mciList, mciBytes = append(mciList, d), len(body)
			} else {
				crdList, crdBytes = append(crdList, d), len(body)
			}
		}
	}
	results.fact(factListMsPer1k, ms(median(mciList))/float64(want)*1000)
	results.fact(factListBaseMsPer1k, ms(median(crdList))/float64(want)*1000)
	results.compare("list and watch", fmt.Sprintf("LIST of %d imports (%d clusters x %d pools)", want, n, cfg.PoolsPerCluster), "ms", ms(median(mciList)),
		"LIST of as many custom resources", ms(median(crdList)), "no slower", median(mciList) <= median(crdList),
		fmt.Sprintf("median of %d rounds each, alternating; %.1f MiB vs %.1f MiB of JSON", len(mciList), float64(mciBytes)/mib, float64(crdBytes)/mib))

}
