package clusterscore

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
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
