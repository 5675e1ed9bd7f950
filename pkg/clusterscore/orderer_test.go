package clusterscore

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// TestOrdererCompareIsLess holds the orderer's one-pass comparison, which
// sorts more than a handful of candidates, to less, which sorts the
// others and says what the order is: over random candidates of every
// picker (ties of tier, total and weight; totals that are not
// comparable), compare(a, b) is -1 exactly where less(a, b), 1 exactly
// where less(b, a), and the stable sorts by either agree.
func TestOrdererCompareIsLess(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for trial := range 500 {
		picker := []routingpolicy.Picker{routingpolicy.PickMaxScore, routingpolicy.PickRoundRobin, routingpolicy.PickChain, routingpolicy.PickTwoChoices}[trial%4]
		n := 2 + rng.IntN(60)
		if trial%2 == 0 {
			n = 17 + rng.IntN(60) // sorted by pdqsort, unless a total is NaN
		}
		o := orderer{p: &Pipeline{cfg: routingpolicy.Config{Picker: picker}}, cands: make([]Candidate, n), slots: make([]slot, n)}
		for i := range n {
			o.cands[i] = Candidate{Name: fmt.Sprintf("c%03d", rng.IntN(1000)), Weight: int64(rng.IntN(3))}
			o.slots[i] = slot{tier: int8(rng.IntN(3) + 4*rng.IntN(2)), total: float64(rng.IntN(4)) / 2}
			if rng.IntN(20) == 0 {
				o.slots[i].total = math.NaN()
			}
		}
		for a := range n {
			for b := range n {
				want := 0
				switch {
				case o.less(a, b):
					want = -1
				case o.less(b, a):
					want = 1
				}
				require.Equal(t, want, o.compare(a, b), "trial %d: %d vs %d", trial, a, b)
			}
		}
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		byLess := slices.Clone(idx)
		stableByLess(&o, byLess)
		o.sort(idx)
		require.Equal(t, byLess, idx, "trial %d", trial)
	}
}

// TestRankedSortIsTheSort holds the sort of ranked candidates
// (sortRanked: counted into tiers, packed keys, no names compared) to the
// stable sort by less, which says what the order is: over random
// candidates of every picker, with ties of tier, total, weight and name,
// totals that are not comparable (where it must decline, and the stable
// sort orders) and as many candidates as a fleet's, the orders are the
// same.
func TestRankedSortIsTheSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 17))
	pickers := []routingpolicy.Picker{routingpolicy.PickMaxScore, routingpolicy.PickRoundRobin, routingpolicy.PickChain, routingpolicy.PickTwoChoices}
	ranked := 0
	for trial := range 400 {
		n := 17 + rng.IntN(80)
		if trial%20 == 0 {
			n = 1000 + rng.IntN(50)
		}
		o := orderer{p: &Pipeline{cfg: routingpolicy.Config{Picker: pickers[trial%4]}}, cands: make([]Candidate, n), slots: make([]slot, n), sc: &scratch{}}
		for i := range n {
			o.cands[i] = Candidate{Name: fmt.Sprintf("c%03d", rng.IntN(n)), Weight: int64(rng.IntN(3))}
			o.slots[i] = slot{tier: int8(rng.IntN(4) + 4*rng.IntN(2)), total: float64(rng.IntN(6)) / 2}
			if rng.IntN(10) == 0 {
				o.slots[i].total = -o.slots[i].total // -0 is 0
			}
			if trial%5 == 0 && rng.IntN(200) == 0 {
				o.slots[i].total = math.NaN()
			}
		}
		RankCandidates(o.cands)
		var idx []int
		for i := range n {
			if rng.IntN(8) != 0 {
				idx = append(idx, i)
			}
		}
		want := slices.Clone(idx)
		stableByLess(&o, want)
		got := slices.Clone(idx)
		if o.sortRanked(got, o.sc) {
			ranked++
		} else {
			require.Equal(t, idx, got, "trial %d: declined, left as it was", trial)
			o.sort(got)
		}
		require.Equal(t, want, got, "trial %d (%v, %d candidates)", trial, o.p.cfg.Picker, n)
	}
	require.Greater(t, ranked, 300, "most trials sorted by rank")
}

// stableByLess sorts idx stably by o.less: the order the orderer's sorts
// are held to.
func stableByLess(o *orderer, idx []int) {
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case o.less(a, b):
			return -1
		case o.less(b, a):
			return 1
		}
		return 0
	})
}

// TestSortsByTotalAreTheStableSort holds both sorts of a scored tier by
// total, by counting few values (sortByFewTotals) and by radix
// (radixByTotal), to the stable sort by total, the larger first: over
// random runs whose totals take from one value to more than the counting
// sort takes (where it must decline, the run untouched), with -0 beside
// 0, negative totals, totals all distinct, and totals that differ only
// in the low half of their keys.
func TestSortsByTotalAreTheStableSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 31))
	counted := 0
	for trial := range 600 {
		n := 2 + rng.IntN(300)
		values := 1 + trial%(fewTotals+8)
		slots := make([]slot, n+10)
		for i := range slots {
			slots[i].total = float64(rng.IntN(values))/7 - 1
			switch {
			case trial%9 == 0:
				slots[i].total = rng.Float64() * 10 // all distinct
			case trial%9 == 1:
				// Distinct totals that the high half of their keys does
				// not tell apart: runs of many, sorted by the whole key.
				slots[i].total = math.Nextafter(1.5, 2) + float64(rng.IntN(values*3))*1e-12
			case rng.IntN(15) == 0:
				slots[i].total = math.Copysign(0, -1)
			}
		}
		run := rng.Perm(len(slots))[:n]
		want := slices.Clone(run)
		slices.SortStableFunc(want, func(a, b int) int { return -cmp.Compare(slots[a].total, slots[b].total) })
		byRadix := slices.Clone(run)
		radixByTotal(byRadix, slots, &scratch{})
		require.Equal(t, want, byRadix, "trial %d: radix", trial)
		byCount := slices.Clone(run)
		if sortByFewTotals(byCount, slots, &scratch{}) {
			counted++
			require.Equal(t, want, byCount, "trial %d: counted, %d values", trial, values)
		} else {
			require.Equal(t, run, byCount, "trial %d: declined, left as it was", trial)
			require.Greater(t, distinctTotals(slots, run), fewTotals, "trial %d: declined %d values", trial, values)
		}
	}
	require.Greater(t, counted, 400, "most trials counted")
}

// distinctTotals is how many values the totals of run's slots take, -0
// counted as 0.
func distinctTotals(slots []slot, run []int) int {
	seen := map[float64]bool{}
	for _, i := range run {
		seen[slots[i].total+0] = true
	}
	return len(seen)
}
