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

// sortRanked sorts idx as sort does, without comparing names or following
// pointers: the candidates are taken in rank order (their ranks are a
// permutation) and counted into their tiers, which leaves each tier in
// rank order, the order of a rotating tier; each scored tier is then
// sorted by total, stably, by the bytes of its totals (sortByTotal). The
// keys (tier, then total, then rank) are unique, so this is the order the
// comparison gives, in time linear in the candidates. It reports false,
// idx untouched, when the candidates are not ranked (RankCandidates), idx
// is not ascending, or a scored total is NaN, which only the stable sort
// orders as before.
func (o *orderer) sortRanked(idx []int, sc *scratch) bool {
	var count [2 * staleTiers]int
	byRank := slices.Grow(sc.byRank[:0], len(o.cands))[:len(o.cands)]
	sc.byRank = byRank
	clear(byRank)
	for k, i := range idx {
		s, r := &o.slots[i], int(o.cands[i].Rank)
		if r <= 0 || r > len(byRank) || byRank[r-1] != 0 || (k > 0 && idx[k-1] >= i) ||
			s.tier < 0 || int(s.tier) >= len(count) || (!o.p.rotates(s.tier) && math.IsNaN(s.total)) {
			return false
		}
		byRank[r-1] = int32(i) + 1
		count[s.tier]++
	}
	var start [2*staleTiers + 1]int
	for t := range count {
		start[t+1] = start[t] + count[t]
	}
	next := start
	for _, i := range byRank {
		if i != 0 {
			t := o.slots[i-1].tier
			idx[next[t]] = int(i - 1)
			next[t]++
		}
	}
	for t := range count {
		if run := idx[start[t]:start[t+1]]; len(run) > 1 && !o.p.rotates(int8(t)) {
			sortByTotal(run, o.slots, sc)
		}
	}
	return true
}

// sortByTotal sorts run by total, the larger first, keeping the order of
// equal totals: a radix sort of the totals' bytes, least significant
// first, that skips the bytes every total shares.
func sortByTotal(run []int, slots []slot, sc *scratch) {
	keys := slices.Grow(sc.keys[:0], 2*len(run))[:2*len(run)]
	cur := slices.Grow(sc.runs[:0], 2*len(run))[:2*len(run)]
	sc.keys, sc.runs = keys, cur
	keys, spare := keys[:len(run)], keys[len(run):]
	cur, other := cur[:len(run)], cur[len(run):]
	var hist [8][256]int
	for k, i := range run {
		keys[k], cur[k] = descending(slots[i].total), i
		for d := range hist {
			hist[d][byte(keys[k]>>(8*d))]++
		}
	}
	for d := range hist {
		h := &hist[d]
		if h[byte(keys[0]>>(8*d))] == len(keys) {
			continue // every total has this byte
		}
		sum := 0
		for b, c := range h {
			h[b], sum = sum, sum+c
		}
		for k, key := range keys {
			b := byte(key >> (8 * d))
			spare[h[b]], other[h[b]] = key, cur[k]
			h[b]++
		}
		keys, spare, cur, other = spare, keys, other, cur
	}
	copy(run, cur)
}

// descending is a total as an unsigned key that orders the larger total
// first; -0 is 0, as the comparison finds them equal.
func descending(total float64) uint64 {
	if total == 0 {
		total = 0
	}
	b := math.Float64bits(total)
	if b>>63 == 1 {
		return b // negative: the more negative, the larger the key
	}
	return ^b &^ (1 << 63)
}
