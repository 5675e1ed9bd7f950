package clusterscore

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// unseenScenarios are the routing benchmark's workloads of traffic the
// sidecar does not see, in the simulation: the first workload of the
// family on 3 clusters, 30% or 60% of its requests from the first and
// last clusters' own users (half each), who send to their own cluster.
func unseenScenarios() []simScenario {
	var out []simScenario
	for _, direct := range []float64{0.3, 0.6} {
		s := affinityFamily()[0]
		s.name = fmt.Sprintf("%.0f%% direct, %s", 100*direct, s.name)
		s.clusters = 3
		s.profile.Users = []workload.Population{{Entry: "", Share: 1 - direct}, {Entry: "cluster-a", Share: direct / 2}, {Entry: "cluster-c", Share: direct / 2}}
		out = append(out, s)
	}
	return out
}

// TestSharesLevelTrafficTheSidecarDoesNotSee plays traffic the sidecar
// does not see, with 1 and 3 replicas. Without the EPPs' counts of the
// requests they route by relaying cluster (upstream EPPs), PrefixAffinity
// deals its keys by capacity and the importing users' cluster takes 0.21
// (30% direct) and 0.14 (60%) of all the requests where a third is its
// share. With them, over the second half of the run (the first is the
// shares' warm-up, as the routing benchmark's uncounted run is), each of
// the equal clusters is within 7 points of a third (within 5 but for
// one cluster of one case: 8 groups of unequal traffic dealt by count
// leave a group's worth), and PrefixAffinity keeps at least 0.95 of the
// oracle's hit ratio on the requests it routes.
func TestSharesLevelTrafficTheSidecarDoesNotSee(t *testing.T) {
	for _, s := range unseenScenarios() {
		t.Run(s.name, func(t *testing.T) {
			reqs := s.prepare(t)
			oracle := s.play(reqs, &groupOracle{pinned: map[int]int{}})
			for _, replicas := range []int{1, 3} {
				uncounted := s
				uncounted.uncounted = true
				uncounted.play(reqs, newPipelineRouter(t, routingAffinity, replicas))
				before := laterShares(reqs, s.clusters)
				got := s.play(reqs, newPipelineRouter(t, routingAffinity, replicas))
				shares := laterShares(reqs, s.clusters)
				t.Logf("%d replicas: shares of all requests %.3f (without counts %.3f), routed hit ratio %.3f (oracle %.3f)",
					replicas, shares, before, got.routedHit, oracle.routedHit)
				for i, share := range shares {
					assert.LessOrEqual(t, math.Abs(share-1.0/3), 0.07, "%d replicas: cluster %d's share of all the requests within 7 points of a third", replicas, i)
				}
				assert.GreaterOrEqual(t, got.routedHit, 0.95*oracle.routedHit, "%d replicas: at least 0.95 of the oracle's routed hit ratio", replicas)
			}
		})
	}
}

// laterShares are the shares of the n clusters in the second half of the
// requests played last.
func laterShares(reqs []*simRequest, n int) []float64 {
	shares := make([]float64, n)
	later := reqs[len(reqs)/2:]
	for _, r := range later {
		shares[r.cluster] += 1 / float64(len(later))
	}
	return shares
}
