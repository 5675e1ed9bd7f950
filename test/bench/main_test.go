// Package bench measures mci against its alternatives on real local
// ClusterSets (test/localclusterset: etcd, a kube-apiserver and an mci-apiserver
// per cluster), each comparison interleaved in the same run (A, B, A, B)
// and reported as medians and percentiles:
//
//   - convergence: an export change in cluster-a seen by a watch through
//     cluster-b's kube-apiserver, against the single-hop floor (write and
//     watch on one kube-apiserver) and against the CRD fan-out baseline
//     (test/bench/crdfanout, the proposal's reference design);
//   - import parents: an HTTPRoute change in cluster-b until the parents of
//     its import follow in a watch through cluster-b's kube-apiserver,
//     against the single-hop floor (the route's own watch);
//   - write amplification: writes to member apiservers per export change
//     and per EPP readiness flap, mci against the baseline;
//   - LIST and WATCH at scale: all imports through the aggregator against
//     the same custom resources, and many watchers of each;
//   - memory: mci-apiserver heap and RSS per member and per exported pool,
//     unrelated Services and EndpointSlices, the baseline's etcd bytes;
//   - data path: requests through mci-sidecar and mci-epp against mci-epp
//     alone, and scheduling decisions per second;
//   - streamed responses (streams_test.go): the time between a streamed
//     completion's chunks and its total time through mci-sidecar, with
//     the response phase relayed, skipped and intercepted, against the
//     model server alone;
//   - summary mode against full mode (modes_test.go): both run side by
//     side in every ClusterSet; watches on a member's kube-apiserver by
//     origin, heap per mode, readiness flaps, a member restart's resync;
//   - the exporter's fan-out (fanout_test.go): as many readers of one
//     member's summaries as a large ClusterSet's importers, the time an
//     export change takes to reach each, what they cost the member's
//     mci-apiserver and kube-apiserver, and its restart with them all.
//
// `make bench` runs it with full sizes and `make bench-smoke` with tiny
// ones (MCI_BENCH_PROFILE=smoke); config_test.go lists the knobs. The table
// goes to stdout and to results.md and results.json in $MCI_BENCH_OUT
// (_output/bench by default). Nothing starts unless -bench is given, so
// `go test ./...` passes through.
package bench

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/mci-dev/mci/test/envoyclient"
)

var cfg sizes

func TestMain(m *testing.M) {
	envoyclient.RunIfChild(serveChild)
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	var err error
	if cfg, err = loadSizes(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	results.start(cfg)
	logf("profile %s: ClusterSets of %v clusters; results to %s", cfg.Profile, cfg.clusterSetSizes(), cfg.Out)
	code := m.Run()
	results.Failed = code != 0
	if err := results.write(cfg.Out); err != nil {
		fmt.Fprintln(os.Stderr, "bench: writing results:", err)
		code = 1
	}
	os.Exit(code)
}

// BenchmarkScheduling needs no ClusterSet: it runs first.
func BenchmarkScheduling(b *testing.B) {
	for _, pods := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) { benchScheduling(b, pods) })
	}
}

// BenchmarkClusterSet starts one ClusterSet per size, smallest first, and
// runs on each what belongs to that size. Each ClusterSet is stopped
// before the next starts, so they never compete for the machine.
func BenchmarkClusterSet(b *testing.B) {
	sizes := cfg.clusterSetSizes()
	idle := map[string]map[int]idleFigures{}
	for i, n := range sizes {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			e := startClusterSet(b, n)
			for _, mode := range []string{modeSummary, modeFull} {
				if idle[mode] == nil {
					idle[mode] = map[int]idleFigures{}
				}
				idle[mode][n] = measureIdle(b, e, mode)
			}
			if slices.Contains(cfg.ConvergenceClusters, n) {
				b.Run("convergence", func(b *testing.B) { benchConvergence(b, e) })
				b.Run("flap-convergence", func(b *testing.B) { benchFlapConvergence(b, e) })
				b.Run("import-parents", func(b *testing.B) { benchImportParents(b, e) })
				b.Run("watch-origins", func(b *testing.B) { benchWatchOrigins(b, e) })
				b.Run("member-restart", func(b *testing.B) { benchResync(b, e) })
			}
			if i == 0 {
				b.Run("write-amplification", func(b *testing.B) { benchWriteAmplification(b, e) })
				b.Run("data-path", func(b *testing.B) { benchDataPath(b, e) })
				b.Run("streams", func(b *testing.B) { benchStreams(b, e) })
				// A reader's cost at the exporter does not depend on the
				// ClusterSet's size: the smallest keeps the machine quietest.
				b.Run("exporter-fanout", func(b *testing.B) { benchExporterFanout(b, e) })
			}
			if i == len(sizes)-1 {
				// The storm runs at the largest size run.
				b.Run("reconnect-storm", func(b *testing.B) { benchReconnectStorm(b, e) })
			}
			if n == cfg.ScaleClusters {
				b.Run("scale", func(b *testing.B) { benchScale(b, e) })
			}
		})
	}
	for mode, byN := range idle {
		perMember(mode, byN)
	}
	for mode, p50 := range convergenceP50 {
		if len(p50) < 2 {
			continue
		}
		var ns []int
		for n := range p50 {
			ns = append(ns, n)
		}
		lo, hi := slices.Min(ns), slices.Max(ns)
		results.fact(mode+"."+factConvSlope, (p50[hi]-p50[lo])/float64(hi-lo))
	}
}
