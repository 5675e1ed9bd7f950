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
// equal totals: by counting when the totals take a few values
// (sortByFewTotals), else by a radix sort of their bytes (radixByTotal).
func sortByTotal(run []int, slots []slot, sc *scratch) {
	if !sortByFewTotals(run, slots, sc) {
		radixByTotal(run, slots, sc)
	}
}

// fewTotals is how many distinct totals sortByFewTotals sorts; the
// table that finds them has twice as many places.
const fewTotals = 32

// sortByFewTotals sorts run as radixByTotal does when its totals take at
// most fewTotals values, which candidates that no scorer tells apart
// (unmeasured, never sent to, holding none of the prompt) make common: it
// finds each candidate's value in a small hash table, sorts the values,
// and places the candidates in run's order after the candidates of the
// larger values, so that equal totals keep their order. It reports false,
// run untouched, for more values.
func sortByFewTotals(run []int, slots []slot, sc *scratch) bool {
	var (
		table  [2 * fewTotals]uint8 // a value's place in keys, plus one
		keys   [fewTotals]uint64
		counts [fewTotals]int
		n      int
	)
	which := slices.Grow(sc.which[:0], len(run))[:len(run)]
	sc.which = which
	last, lastAt := uint64(0), -1
	for k, i := range run {
		key := descending(slots[i].total)
		if lastAt < 0 || key != last {
			h := (key * 0x9e3779b97f4a7c15) >> 58 // 6 bits: len(table)
			for table[h] != 0 && keys[table[h]-1] != key {
				h = (h + 1) % uint64(len(table))
			}
			if table[h] == 0 {
				if n == fewTotals {
					return false
				}
				keys[n], n = key, n+1
				table[h] = uint8(n)
			}
			last, lastAt = key, int(table[h]-1)
		}
		which[k] = uint8(lastAt)
		counts[lastAt]++
	}
	placeByValue(run, which, keys[:n], counts[:n], sc)
	return true
}

// placeByValue places run's candidates, of values keys[which[k]] (each
// counts times), by value, ascending, in run's order among equal values.
func placeByValue(run []int, which []uint8, keys []uint64, counts []int, sc *scratch) {
	var order, start [fewTotals]int
	for v := range keys {
		order[v] = v
	}
	byKey := order[:len(keys)]
	for a := 1; a < len(byKey); a++ { // a handful: insertion
		for b := a; b > 0 && keys[byKey[b]] < keys[byKey[b-1]]; b-- {
			byKey[b], byKey[b-1] = byKey[b-1], byKey[b]
		}
	}
	next := 0
	for _, v := range byKey {
		start[v], next = next, next+counts[v]
	}
	out := slices.Grow(sc.runs[:0], len(run))[:len(run)]
	sc.runs = out
	for k, i := range run {
		out[start[which[k]]] = i
		start[which[k]]++
	}
	copy(run, out)
}

// radixByTotal sorts run by total, the larger first, keeping the order of
// equal totals: a radix sort of the high half of the totals' keys, least
// significant byte first, that skips the bytes every total shares, then
// each run of equal high halves sorted by the whole key (sortByKey). The
// high half holds the sign, the exponent and 20 bits of the fraction:
// totals it does not tell apart differ by about a millionth of their
// value, and are few, while sorting every byte of the totals that the
// latency score makes all distinct took twice the passes, a fifth of a
// pick over 1,000 clusters.
func radixByTotal(run []int, slots []slot, sc *scratch) {
	keys := slices.Grow(sc.keys[:0], 2*len(run))[:2*len(run)]
	cur := slices.Grow(sc.runs[:0], 2*len(run))[:2*len(run)]
	sc.keys, sc.runs = keys, cur
	keys, spare := keys[:len(run)], keys[len(run):]
	cur, other := cur[:len(run)], cur[len(run):]
	var hist [4][256]int
	for k, i := range run {
		keys[k], cur[k] = descending(slots[i].total), i
		for d := range hist {
			hist[d][byte(keys[k]>>(32+8*d))]++
		}
	}
	for d := range hist {
		h := &hist[d]
		if h[byte(keys[0]>>(32+8*d))] == len(keys) {
			continue // every total has this byte
		}
		sum := 0
		for b, c := range h {
			h[b], sum = sum, sum+c
		}
		for k, key := range keys {
			b := byte(key >> (32 + 8*d))
			spare[h[b]], other[h[b]] = key, cur[k]
			h[b]++
		}
		keys, spare, cur, other = spare, keys, other, cur
	}
	for lo := 0; lo < len(keys); {
		hi := lo + 1
		for hi < len(keys) && keys[hi]>>32 == keys[lo]>>32 {
			hi++
		}
		if hi-lo > 1 {
			sortByKey(keys[lo:hi], cur[lo:hi])
		}
		lo = hi
	}
	copy(run, cur)
}

// sortByKey sorts keys ascending, and idx with them, keeping the order of
// equal keys: untouched when they are in order already (equal totals, the
// common case), by insertion for a handful, else by the stable sort.
func sortByKey(keys []uint64, idx []int) {
	if slices.IsSorted(keys) {
		return
	}
	if len(keys) <= maxStack {
		for a := 1; a < len(keys); a++ {
			for b := a; b > 0 && keys[b] < keys[b-1]; b-- {
				keys[b], keys[b-1] = keys[b-1], keys[b]
				idx[b], idx[b-1] = idx[b-1], idx[b]
			}
		}
		return
	}
	type keyed struct {
		key uint64
		i   int
	}
	pairs := make([]keyed, len(keys))
	for k := range keys {
		pairs[k] = keyed{keys[k], idx[k]}
	}
	slices.SortStableFunc(pairs, func(a, b keyed) int { return cmp.Compare(a.key, b.key) })
	for k, p := range pairs {
		keys[k], idx[k] = p.key, p.i
	}
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
