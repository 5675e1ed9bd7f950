package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/test/quantile"
)

const (
	fanoutNS = "fanout"
	// fanoutChanges are the export changes timed at each reader.
	fanoutChanges = 5
	// fanoutTarget is the p99 an export change may take to reach every
	// reader of a member with 1,000 importers; fanoutHeapTarget the
	// exporting mci-apiserver's heap per reader.
	fanoutTarget     = time.Second
	fanoutHeapTarget = 64 << 10
)

// fanoutPeriod is the least time each export change is given, with the
// readers connected or not, so that the CPU windows of the two compare.
func fanoutPeriod() time.Duration {
	if cfg.Profile == "smoke" {
		return 500 * time.Millisecond
	}
	return 2 * time.Second
}

// fanoutCost is what the exporting member's servers cost, measured once
// without the readers and once with them.
type fanoutCost struct {
	heap             uint64        // cluster-a's mci-apiserver live heap
	mciCPU, kubeCPU  time.Duration // over the export changes
	kubeRSS          uint64
	kubeHeap         float64 // go_memstats_heap_alloc_bytes: its profiling endpoints are off
	mciFDs, kubeFDs  int
	mciGoroutines    float64
	seen             []time.Duration // from each change's write to each reader's event
	lastOfEachChange []time.Duration
}

// benchExporterFanout: cfg.FanoutReaders readers of cluster-a's summaries
// (the summary-mode importers of an exporting member of a ClusterSet that
// size) are connected while one of its pools is exported and withdrawn in
// turn: how long until each reader's informer has each change, and what
// the readers cost cluster-a's mci-apiserver (live heap, CPU per change)
// and its kube-apiserver (whose aggregator proxies every watch: CPU and
// RSS), each against the same changes without them; then the reconnect
// storm with as many readers.
func benchExporterFanout(b *testing.B, e *env) {
	ctx := context.Background()
	k := max(cfg.FanoutReaders, 1)
	e.namespaceEverywhere(b, fanoutNS)
	_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(fanoutNS).Create(ctx, pool(fanoutNS, "fanout", true), metav1.CreateOptions{})
	require.NoError(b, err)
	summaries := e.mci["cluster-a"].InferenceV1alpha1().InferencePoolExportSummaries(fanoutNS)
	require.NoError(b, pollFor(time.Minute, func() bool {
		l, err := summaries.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) > 0
	}), "cluster-a publishes no summary of the fan-out pool")

	without := e.fanoutRound(b, nil)

	benchHeap, benchGoroutines := ownHeap()
	start := time.Now()
	readers := e.summaryReaders(b, k)
	connected := time.Since(start)
	heapAfter, goroutinesAfter := ownHeap()
	logf("%d summary readers of cluster-a connected and synced in %s", k, connected.Round(time.Millisecond))
	with := e.fanoutRound(b, readers)

	const section = "exporter fan-out"
	what := fmt.Sprintf("%d readers of one exporting member's summaries", k)
	perReader := func(with, without float64) float64 { return (with - without) / float64(k) }
	p50, p99, last := quantile.Nearest(with.seen, 50), quantile.Nearest(with.seen, 99), quantile.Nearest(with.seen, 100)
	note := fmt.Sprintf("%d changes (the pool exported and withdrawn in turn), %d samples; from the write to each reader's informer event; the last reader of each change %v",
		fanoutChanges, len(with.seen), roundAll(with.lastOfEachChange))
	results.add(section, what+": export change at a reader, p50", "ms", ms(p50), note)
	results.check(section, what+": export change at a reader, p99", "ms", ms(p99), "at most 1 s", p99 <= fanoutTarget, "")
	results.add(section, what+": export change at the last reader", "ms", ms(last), "")

	heapPer := perReader(float64(with.heap), float64(without.heap))
	results.check(section, what+": exporting mci-apiserver's live heap per reader", "KiB", heapPer/1024, "at most 64 KiB", heapPer <= fanoutHeapTarget,
		fmt.Sprintf("after a GC, %.1f MiB without the readers and %.1f MiB with them; goroutines %.0f -> %.0f, descriptors %d -> %d",
			float64(without.heap)/mib, float64(with.heap)/mib, without.mciGoroutines, with.mciGoroutines, without.mciFDs, with.mciFDs))
	cpuNote := func(with, without time.Duration) string {
		return fmt.Sprintf("%s of CPU over %d changes (at least %s apart) with the readers, %s without", with, fanoutChanges, fanoutPeriod(), without)
	}
	results.add(section, what+": exporting mci-apiserver's CPU per reader per export change", "µs",
		perReader(float64(with.mciCPU.Microseconds()), float64(without.mciCPU.Microseconds()))/fanoutChanges, cpuNote(with.mciCPU, without.mciCPU))
	results.add(section, what+": exporting member's kube-apiserver CPU per reader per export change", "µs",
		perReader(float64(with.kubeCPU.Microseconds()), float64(without.kubeCPU.Microseconds()))/fanoutChanges,
		cpuNote(with.kubeCPU, without.kubeCPU)+"; its aggregator proxies every reader's watches")
	results.add(section, what+": exporting member's kube-apiserver RSS per reader", "KiB",
		perReader(float64(with.kubeRSS), float64(without.kubeRSS))/1024,
		fmt.Sprintf("%.0f MiB without the readers and %.0f MiB with them; heap (no GC: its profiling endpoints are off) %.0f -> %.0f MiB; descriptors %d -> %d",
			float64(without.kubeRSS)/mib, float64(with.kubeRSS)/mib, without.kubeHeap/mib, with.kubeHeap/mib, without.kubeFDs, with.kubeFDs))
	results.add(section, what+": the benchmark's own heap per reader", "KiB", perReader(float64(heapAfter), float64(benchHeap))/1024,
		fmt.Sprintf("client-go shared informer factories, 2 informers each, on connections of their own; %.1f goroutines per reader; connected and synced in %s",
			perReader(float64(goroutinesAfter), float64(benchGoroutines)), connected.Round(time.Millisecond)))

	e.reconnectStorm(b, fanoutNS, "fanout", readers)
}

// fanoutRound exports and withdraws the fan-out pool fanoutChanges times
// in turn, each change given at least fanoutPeriod and, with readers,
// until every reader has it, and measures the exporting member's servers
// around it. It leaves the pool exported.
func (e *env) fanoutRound(b *testing.B, readers []summaryWatcher) fanoutCost {
	b.Helper()
	ctx := context.Background()
	var c fanoutCost
	c.heap = e.stableHeap(b, "cluster-a")
	m := e.mciMetrics(b, "cluster-a")
	c.mciGoroutines = m.Sum("go_goroutines", nil)
	km, err := e.apiServerMetrics(ctx, "cluster-a")
	require.NoError(b, err)
	c.kubeHeap = km.Sum("go_memstats_heap_alloc_bytes", nil)
	kubePID, mciPID := e.kubePID(b, "cluster-a"), e.mciPID(b, "cluster-a")
	c.kubeRSS = procRSS(b, kubePID)
	c.kubeFDs, c.mciFDs = openFiles(b, kubePID), openFiles(b, mciPID)

	// The first event of a reader's informer about a summary in fanoutNS
	// since the change was made, in Unix nanoseconds.
	first := make([]atomic.Int64, len(readers))
	var handled []cache.InformerSynced
	for i, r := range readers {
		mark := func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if s, ok := obj.(*v1alpha1.InferencePoolExportSummary); ok && s.Namespace == fanoutNS {
				first[i].CompareAndSwap(0, time.Now().UnixNano())
			}
		}
		reg, err := r.exports.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) { mark(obj) }, DeleteFunc: mark})
		require.NoError(b, err)
		handled = append(handled, reg.HasSynced)
		b.Cleanup(func() { _ = r.exports.RemoveEventHandler(reg) })
	}
	// Every handler has been told of what its informer holds, and every
	// reader holds the pool exported, as the changes start from.
	syncCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	require.True(b, cache.WaitForCacheSync(syncCtx.Done(), handled...), "the fan-out's event handlers did not sync")
	require.NoError(b, pollFor(time.Minute, func() bool {
		for _, r := range readers {
			if !r.hasSummaryIn(fanoutNS) {
				return false
			}
		}
		return true
	}), "the fan-out pool's summary at every reader")

	pools := e.mci["cluster-a"].InferencePoolV1().InferencePools(fanoutNS)
	mciCPU, kubeCPU := processCPU(b, mciPID), processCPU(b, kubePID)
	for i := range fanoutChanges {
		exported := i%2 == 1
		for j := range first {
			first[j].Store(0)
		}
		t0 := time.Now()
		_, err := pools.Patch(ctx, "fanout", types.MergePatchType, exportPatch(exported), metav1.PatchOptions{})
		require.NoError(b, err)
		if len(readers) > 0 {
			require.NoError(b, pollEvery(5*time.Millisecond, time.Minute, func() bool {
				for j, r := range readers {
					if first[j].Load() == 0 || r.hasSummaryIn(fanoutNS) != exported {
						return false
					}
				}
				return true
			}), "change %d (exported=%v) did not reach every reader", i, exported)
			var last time.Duration
			for j := range first {
				d := time.Duration(first[j].Load() - t0.UnixNano())
				c.seen = append(c.seen, d)
				last = max(last, d)
			}
			c.lastOfEachChange = append(c.lastOfEachChange, last)
		}
		time.Sleep(time.Until(t0.Add(fanoutPeriod())))
	}
	c.mciCPU, c.kubeCPU = processCPU(b, mciPID)-mciCPU, processCPU(b, kubePID)-kubeCPU
	// Leave the pool exported, as it was found.
	_, err = pools.Patch(ctx, "fanout", types.MergePatchType, exportPatch(true), metav1.PatchOptions{})
	require.NoError(b, err)
	return c
}

// ownHeap is the benchmark process's live heap after a collection, and
// its goroutines.
func ownHeap() (heap uint64, goroutines int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, runtime.NumGoroutine()
}

// openFiles counts process pid's open descriptors, from /proc.
func openFiles(b *testing.B, pid int) int {
	b.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(b, err)
	return len(fds)
}

func roundAll(d []time.Duration) []time.Duration {
	out := make([]time.Duration, len(d))
	for i, v := range d {
		out[i] = v.Round(time.Millisecond)
	}
	return out
}
