package clusterscore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// BenchmarkPick is a pick over 3 clusters, every scorer on (the target is
// under 20 µs of CPU): a 64-block prompt (4 KiB) whose first half one
// cluster served, a pinned session, observations and fresh metrics for
// every cluster.
func BenchmarkPick(b *testing.B) {
	all := "prefix-cache=3,session=2,in-flight=1,latency=1,errors=1,queue=1,kv-cache=1,weight=1"
	for _, bc := range []struct{ name, config string }{
		{"all-scorers", all},
		{"all-scorers-two-choices", all + ",pick=two-choices"},
		{routingpolicy.PrefixAffinity, routingpolicy.PrefixAffinity},
		{routingpolicy.PrefixAffinity + "-established-groups", routingpolicy.PrefixAffinity},
		{routingpolicy.MetricsBased, routingpolicy.MetricsBased},
		{routingpolicy.HealthBased, routingpolicy.HealthBased},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f := newAffinityFixture(b)
			cfg, err := routingpolicy.Parse(bc.config)
			require.NoError(b, err)
			p, err := New(cfg, f.p.thresholds, f.mem)
			require.NoError(b, err)
			req := f.req()
			req.Blocks, req.Session = chain(7, 64), "alice"
			f.mem.Prefixes.Record(req.Blocks[:32], promptprefix.ClusterID("b"))
			f.mem.Sessions.Pin(scope, "alice", "c", epoch)
			if strings.HasSuffix(bc.name, "-established-groups") {
				// 64 groups of prompts dealt to their homes, this
				// request's among them.
				for g := range 64 {
					f.mem.Served(&Request{Now: epoch, Scope: scope, Blocks: chain(uint64(1000+g), 4)}, "a")
					f.mem.Served(&Request{Now: epoch, Scope: scope, Blocks: chain(uint64(1000+g), 4)}, "a")
				}
				f.mem.Served(req, "b")
				f.mem.Served(req, "b")
			}
			for _, c := range f.cands {
				f.mem.Observed.Started(scope, c.Name, epoch)
				f.mem.Observed.FirstByte(scope, c.Name, 0)
			}
			rot := NewRotation(f.cands)
			order := make([]int, 0, len(f.cands))
			b.ReportAllocs()
			for b.Loop() {
				order, err = p.Pick(req, f.cands, rot, order[:0], nil)
				if err != nil || len(order) != 3 {
					b.Fatal(order, err)
				}
			}
		})
	}
}

// BenchmarkPickParallel is BenchmarkPick's PrefixAffinity from every core,
// recording each pick, as concurrent ext_proc streams do.
func BenchmarkPickParallel(b *testing.B) {
	f := newAffinityFixture(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := f.req()
		req.Blocks = chain(7, 64)
		order := make([]int, 0, 3)
		for pb.Next() {
			var err error
			order, err = f.p.Pick(req, f.cands, nil, order[:0], nil)
			if err != nil {
				b.Fatal(err)
			}
			f.mem.Served(req, f.cands[order[0]].Name)
		}
	})
}

// BenchmarkExplainedPick is a PrefixAffinity pick with its explanation
// formatted, as a debug log or response header would have it.
func BenchmarkExplainedPick(b *testing.B) {
	f := newAffinityFixture(b)
	req := f.req()
	var ex Explanation
	order := make([]int, 0, 3)
	b.ReportAllocs()
	for b.Loop() {
		order, _ = f.p.Pick(req, f.cands, nil, order[:0], &ex)
		_ = ex.String()
	}
}

// BenchmarkServed records a 64-block prompt and pins its session.
func BenchmarkServed(b *testing.B) {
	f := newAffinityFixture(b)
	req := f.req()
	req.Blocks, req.Session = chain(7, 64), "alice"
	b.ReportAllocs()
	for b.Loop() {
		f.mem.Served(req, "b")
	}
}

// BenchmarkPickAtScale is BenchmarkDecideAtScale's pick alone (the
// pipeline, without the sidecar's request, state and candidates): a
// PrefixAffinity pick over 1,000 candidates, all serving and measured,
// ranked and with their ids as the routing table makes them, the memory
// warm with 64 groups of prompts served twice each, the request's among
// them. unobserved is the benchmark's case, no request sent yet; observed
// the running sidecar's, every cluster having had requests and first
// bytes, so that each one's observations are read.
func BenchmarkPickAtScale(b *testing.B) {
	for _, observed := range []bool{false, true} {
		name := "unobserved"
		if observed {
			name = "observed"
		}
		b.Run(name, func(b *testing.B) {
			mem := NewMemory(DefaultMemoryOptions())
			p, err := New(routingpolicy.Named()[routingpolicy.PrefixAffinity], scheduling.DefaultConfig(), mem)
			require.NoError(b, err)
			cands := make([]Candidate, 1000)
			for i := range cands {
				name := fmt.Sprintf("cluster-%04d", i)
				cands[i] = Candidate{Name: name, Weight: 1, Health: HealthServing, ID: promptprefix.ClusterID(name),
					Pool: &PoolMetrics{AverageQueue: float64(i % 3), AverageKVCache: 0.2, ReadyPods: 4, UpdatedAt: epoch}}
			}
			RankCandidates(cands)
			rot := NewRotation(cands)
			order := make([]int, 0, len(cands))
			for range 2 {
				for g := range 64 {
					req := Request{Now: epoch, Scope: scope, Blocks: chain(uint64(1000+g), 64)}
					order, err = p.Pick(&req, cands, rot, order[:0], nil)
					require.NoError(b, err)
					mem.Served(&req, cands[order[0]].Name)
				}
			}
			if observed {
				for i := range cands {
					mem.Observed.Started(scope, cands[i].Name, epoch)
					mem.Observed.FirstByte(scope, cands[i].Name, time.Duration(100+i%7)*time.Millisecond)
				}
			}
			req := Request{Now: epoch, Scope: scope, Blocks: chain(1007, 64)}
			b.ReportAllocs()
			for b.Loop() {
				order, err = p.Pick(&req, cands, rot, order[:0], nil)
				if err != nil || len(order) != len(cands) {
					b.Fatal(len(order), err)
				}
			}
		})
	}
}

// BenchmarkObserverExchange is what one request costs the Observer: its
// Started, FirstByte and Finished, each of which publishes the cluster's
// observation for the picks to read (observed.publish).
func BenchmarkObserverExchange(b *testing.B) {
	o := NewObserver(DefaultEWMAAlpha)
	b.ReportAllocs()
	for b.Loop() {
		o.Started(scope, "a", epoch)
		o.FirstByte(scope, "a", 40*time.Millisecond)
		o.Finished(scope, "a", false)
	}
}
