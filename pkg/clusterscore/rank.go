package clusterscore

import (
	"cmp"
	"math"
	"slices"
	"strings"
)

// RankCandidates sets each candidate's Rank: its place, from 1, among
// cands by weight (the larger first), then name, then index, which is the
// order the pickers keep among candidates of one tier and total. A caller
// that keeps a backend's candidates ranks them once, when they change, so
// that a pick over many orders them without comparing names.
func RankCandidates(cands []Candidate) {
	idx := make([]int, len(cands))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		return cmp.Or(-cmp.Compare(cands[a].Weight, cands[b].Weight), strings.Compare(cands[a].Name, cands[b].Name), cmp.Compare(a, b))
	})
	for r, i := range idx {
		cands[i].Rank = int32(r + 1)
	}
}

// scoredKey is a kept candidate of a scored tier as sortRanked sorts it:
// its total (the larger first), then its rank.
type scoredKey struct {
	total float64
	rank  int32
	i     int32
}

// sortRanked sorts idx as sort does, without comparing names or following
// pointers: the candidates are put in their tiers by counting, each
// rotating tier sorted by rank alone and each scored tier by total and
// rank, both unique keys, so that the order is the one the comparison
// gives. It reports false, idx untouched, when some candidate is not
// ranked (RankCandidates), idx is not ascending, or a scored total is
// NaN, which only the stable sort orders as before.
func (o *orderer) sortRanked(idx []int, sc *scratch) bool {
	var count [2 * staleTiers]int
	for k, i := range idx {
		s := &o.slots[i]
		if o.cands[i].Rank <= 0 || (k > 0 && idx[k-1] >= i) || s.tier < 0 || int(s.tier) >= len(count) || (!o.p.rotates(s.tier) && math.IsNaN(s.total)) {
			return false
		}
		count[s.tier]++
	}
	var start [2*staleTiers + 1]int
	for t := range count {
		start[t+1] = start[t] + count[t]
	}
	byTier := append(sc.byTier[:0], idx...)
	next := start
	for _, i := range idx {
		t := o.slots[i].tier
		byTier[next[t]] = i
		next[t]++
	}
	sc.byTier = byTier
	for t := range count {
		if run := byTier[start[t]:start[t+1]]; len(run) > 1 {
			o.sortTier(int8(t), run, sc)
		}
	}
	copy(idx, byTier)
	return true
}

// sortTier sorts run, the candidates of one tier: by rank in a rotating
// tier, else by total then rank.
func (o *orderer) sortTier(tier int8, run []int, sc *scratch) {
	if o.p.rotates(tier) {
		packed := sc.packed[:0]
		for _, i := range run {
			packed = append(packed, uint64(o.cands[i].Rank)<<32|uint64(i))
		}
		slices.Sort(packed)
		for k, v := range packed {
			run[k] = int(uint32(v))
		}
		sc.packed = packed
		return
	}
	keys := sc.scored[:0]
	for _, i := range run {
		keys = append(keys, scoredKey{total: o.slots[i].total, rank: o.cands[i].Rank, i: int32(i)})
	}
	slices.SortFunc(keys, func(a, b scoredKey) int {
		switch {
		case a.total > b.total:
			return -1
		case b.total > a.total:
			return 1
		}
		return cmp.Compare(a.rank, b.rank)
	})
	for k, key := range keys {
		run[k] = int(key.i)
	}
	sc.scored = keys
}
