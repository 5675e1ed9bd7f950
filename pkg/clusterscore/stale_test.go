package clusterscore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// A cluster that the control plane cannot reach is known from its last
// known data only (Candidate.Stale). Its EPP may well answer: it takes
// requests when no other cluster can, and only then, under every named
// configuration.
func TestAStaleClusterTakesRequestsOnlyWhenNoOtherCan(t *testing.T) {
	for name, cfg := range routingpolicy.Named() {
		if name == routingpolicy.LocalFirst {
			continue // the local pool leads whatever the others are
		}
		t.Run(name, func(t *testing.T) {
			p, err := New(cfg, scheduling.DefaultConfig(), NewMemory(DefaultMemoryOptions()))
			require.NoError(t, err)
			cands := []Candidate{
				{Name: "a", Weight: 1, Health: HealthServing, Pool: freshPool(0, 0.1), Stale: true},
				{Name: "b", Weight: 1, Health: HealthServing, Pool: freshPool(3, 0.5)},
			}
			rot := NewRotation(cands)
			for range 4 {
				order, err := p.Pick(&Request{Now: epoch, Scope: scope, Criticality: scheduling.Standard}, cands, rot, nil, nil)
				require.NoError(t, err)
				assert.Equal(t, []int{1, 0}, order, "the reachable cluster first, however loaded; the stale one to fail over to")
			}

			cands[1].Health = HealthNotServing
			order, err := p.Pick(&Request{Now: epoch, Scope: scope, Criticality: scheduling.Standard}, cands, NewRotation(cands), nil, nil)
			require.NoError(t, err)
			want := []int{0}
			if !p.has[routingpolicy.FilterHealth] {
				want = []int{1, 0} // health is not looked at
			}
			assert.Equal(t, want, order, "with no other cluster able to, the stale one takes the request")
		})
	}
}

// A stale cluster is no yardstick for the others' load: an idle one must
// not take the reachable clusters' affinity away.
func TestAStaleClusterDoesNotWithholdTheOthersAffinity(t *testing.T) {
	f := newAffinityFixture(t)
	f.cands = append(f.cands, Candidate{Name: "stale", Weight: 1, Health: HealthServing, Pool: freshPool(0, 0), Stale: true})
	for _, c := range f.cands[:3] {
		c := f.cand(c.Name)
		c.Pool = freshPool(4, 0.3) // 4 waiting per pod: beyond the margin of the stale one
	}
	f.mem.Served(f.req(), "b")
	// Ties among a, b and c are broken at random: without its affinity,
	// b would lead about a third of the picks.
	for range 10 {
		order, err := f.order(t, f.req())
		require.NoError(t, err)
		assert.Equal(t, "b", order[0], "b holds the prompt's prefix and is as loaded as a and c")
		assert.Equal(t, "stale", order[len(order)-1])
	}
}
