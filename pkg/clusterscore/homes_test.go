package clusterscore

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
)

// establish serves each key twice in scope, in the order given.
func establish(h *Homes, keys []uint64, at time.Time) {
	for range 2 {
		for _, k := range keys {
			h.Served(scope, k, 0, at)
		}
	}
}

// shares counts the keys each cluster is home to.
func shares(t *testing.T, h *Homes, keys []uint64, names []string, caps []float64) map[string]int {
	t.Helper()
	ids := make([]uint32, len(names))
	for i, n := range names {
		ids[i] = promptprefix.ClusterID(n)
	}
	out := map[string]int{}
	for _, k := range keys {
		id, served := h.Home(scope, k, ids, caps, nil, epoch)
		require.Equal(t, 2, served)
		for i := range ids {
			if ids[i] == id {
				out[names[i]]++
			}
		}
	}
	return out
}

func TestHomesDealGroupsInEqualShares(t *testing.T) {
	keys := func(n int) []uint64 { return chain(99, n) }
	tests := []struct {
		name  string
		keys  int
		names []string
		caps  []float64
		want  map[string]int
	}{
		{name: "8 groups over 2 equal clusters: 4 each", keys: 8, names: []string{"a", "b"}, caps: []float64{2, 2}, want: map[string]int{"a": 4, "b": 4}},
		{name: "4 groups over 3 equal clusters: 2, 1, 1", keys: 4, names: []string{"a", "b", "c"}, caps: []float64{2, 2, 2}, want: nil},
		{name: "32 groups over 3 equal clusters: 11, 11, 10", keys: 32, names: []string{"a", "b", "c"}, caps: []float64{2, 2, 2}, want: nil},
		{name: "8 groups over clusters of 4, 2 and 2 pods: 4, 2, 2", keys: 8, names: []string{"a", "b", "c"}, caps: []float64{4, 2, 2}, want: map[string]int{"a": 4, "b": 2, "c": 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHomes(0, 0)
			establish(h, keys(tt.keys), epoch)
			got := shares(t, h, keys(tt.keys), tt.names, tt.caps)
			if tt.want != nil {
				assert.Equal(t, tt.want, got)
				return
			}
			least, most := tt.keys, 0
			for _, n := range tt.names {
				least, most = min(least, got[n]), max(most, got[n])
			}
			assert.LessOrEqual(t, most-least, 1, "shares within one group of each other: %v", got)
		})
	}
}

// Whatever the keys, equal clusters are dealt within one key of each
// other (shares rounded up would allow 4 keys over 3 clusters to go 2, 2
// and 0).
func TestHomesDealWithinOneWhateverTheKeys(t *testing.T) {
	names, caps := []string{"a", "b", "c"}, []float64{2, 2, 2}
	for n := 1; n <= 7; n++ {
		for seed := range uint64(100) {
			ks := chain(1000+seed*10+uint64(n), n)
			h := NewHomes(0, 0)
			establish(h, ks, epoch)
			got := shares(t, h, ks, names, caps)
			least, most := n, 0
			for _, name := range names {
				least, most = min(least, got[name]), max(most, got[name])
			}
			require.LessOrEqual(t, most-least, 1, "%d keys (seed %d): %v", n, seed, got)
		}
	}
}

// Among equally near clusters, the extras go to those whose share lost
// most in the rounding down: unequal shares (Shares levels them against
// traffic the sidecar does not place) are met as closely as the keys
// allow, whatever the keys.
func TestHomesDealTheExtrasToTheSharesRoundedDownMost(t *testing.T) {
	names := []string{"a", "b", "c"}
	tests := []struct {
		name string
		keys int
		caps []float64
		want map[string]int
	}{
		{name: "6 groups at shares 0.23, 0.47, 0.30 (1.4, 2.8, 1.8 keys): 1, 3, 2", keys: 6, caps: []float64{0.23, 0.47, 0.30}, want: map[string]int{"a": 1, "b": 3, "c": 2}},
		{name: "8 groups at shares 0.08, 0.84, 0.08 (0.64, 6.72, 0.64 keys): 0, 7, 1 or 1, 7, 0", keys: 8, caps: []float64{0.08, 0.84, 0.08}, want: map[string]int{"b": 7}},
		{name: "8 groups over clusters of 4, 2 and 2 pods: 4, 2, 2", keys: 8, caps: []float64{4, 2, 2}, want: map[string]int{"a": 4, "b": 2, "c": 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := range uint64(50) {
				ks := chain(700+seed*16+uint64(tt.keys), tt.keys)
				h := NewHomes(0, 0)
				establish(h, ks, epoch)
				got := shares(t, h, ks, names, tt.caps)
				for name, n := range tt.want {
					require.Equal(t, n, got[name], "seed %d: %v", seed, got)
				}
				require.Equal(t, tt.keys, got["a"]+got["b"]+got["c"])
			}
		})
	}
}

// The keys beyond equal shares go to the nearest clusters: 8 groups over
// 3 equal clusters, one of them further away, leave it 2 whatever the
// keys; with all alike it takes 3 in some draws, as any may. The shares
// rounded down are kept: a further cluster still takes its share.
func TestHomesDealTheExtrasToTheNearest(t *testing.T) {
	names, caps := []string{"a", "b", "c"}, []float64{2, 2, 2}
	ids := []uint32{promptprefix.ClusterID("a"), promptprefix.ClusterID("b"), promptprefix.ClusterID("c")}
	count := func(h *Homes, ks []uint64, far []uint8) map[string]int {
		out := map[string]int{}
		for _, k := range ks {
			id, _ := h.Home(scope, k, ids, caps, far, epoch)
			out[names[slices.Index(ids, id)]]++
		}
		return out
	}
	tests := []struct {
		name     string
		keys     int
		far      []uint8
		cAtMost  int
		cAtLeast int
		// exact, when set, is the deal every draw gives.
		exact map[string]int
	}{
		{name: "8 groups, c further: c takes its 2", keys: 8, far: []uint8{0, 0, 2}, cAtMost: 2, cAtLeast: 2},
		{name: "7 groups, c further: c takes its 2, the one extra goes to a or b", keys: 7, far: []uint8{0, 0, 1}, cAtMost: 2, cAtLeast: 2},
		{name: "2 groups, c further: a and b take them", keys: 2, far: []uint8{0, 0, 1}, cAtMost: 0, cAtLeast: 0},
		{name: "4 groups, b and c further, c furthest: a 2, b 1, c 1", keys: 4, far: []uint8{0, 1, 2}, cAtMost: 1, cAtLeast: 1, exact: map[string]int{"a": 2, "b": 1, "c": 1}},
		{name: "8 groups, all alike: c takes 2 or 3", keys: 8, far: nil, cAtMost: 3, cAtLeast: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sawExtraAtC := false
			for seed := range uint64(50) {
				ks := chain(500+seed*16+uint64(tt.keys), tt.keys)
				h := NewHomes(0, 0)
				establish(h, ks, epoch)
				got := count(h, ks, tt.far)
				require.GreaterOrEqual(t, got["c"], tt.cAtLeast, "seed %d: %v", seed, got)
				require.LessOrEqual(t, got["c"], tt.cAtMost, "seed %d: %v", seed, got)
				least, most := tt.keys, 0
				for _, n := range names {
					least, most = min(least, got[n]), max(most, got[n])
				}
				require.LessOrEqual(t, most-least, 1, "seed %d: within one of each other: %v", seed, got)
				sawExtraAtC = sawExtraAtC || got["c"] == 3
				if tt.exact != nil {
					require.Equal(t, tt.exact, got, "seed %d", seed)
				}
			}
			if tt.far == nil {
				assert.True(t, sawExtraAtC, "with all alike, c takes an extra in some draws")
			}
		})
	}
}

// Two replicas that served the same groups in another order deal them
// alike; a group that joins moves few of the others; a group not served
// for the TTL is forgotten.
func TestHomesAgreeAndMoveLittle(t *testing.T) {
	names, caps := []string{"a", "b", "c"}, []float64{2, 2, 2}
	ks := chain(7, 12)
	one, two := NewHomes(0, time.Minute), NewHomes(0, time.Minute)
	establish(one, ks, epoch)
	reversed := make([]uint64, len(ks))
	for i, k := range ks {
		reversed[len(ks)-1-i] = k
	}
	establish(two, reversed, epoch)
	before := shares(t, one, ks, names, caps)
	assert.Equal(t, before, shares(t, two, ks, names, caps))

	ids := []uint32{promptprefix.ClusterID("a"), promptprefix.ClusterID("b"), promptprefix.ClusterID("c")}
	homeOf := func(h *Homes, k uint64) uint32 { id, _ := h.Home(scope, k, ids, caps, nil, epoch); return id }
	was := map[uint64]uint32{}
	for _, k := range ks {
		was[k] = homeOf(one, k)
	}
	establish(one, chain(8, 1), epoch)
	moved := 0
	for _, k := range ks {
		if homeOf(one, k) != was[k] {
			moved++
		}
	}
	assert.LessOrEqual(t, moved, 2, "groups moved by a 13th")

	id, served := one.Home(scope, ks[0], ids, caps, nil, epoch.Add(2*time.Minute))
	assert.Zero(t, id)
	assert.Zero(t, served, "forgotten a TTL after its last request")
	assert.Zero(t, one.Len())
	assert.Empty(t, one.scopes, "a scope's assignment and version go with its last key")
}

// A group that stopped sending leaves the dealing once idle: not served
// for DefaultHomeIdle while its scope served others. The groups that send
// are then dealt in equal shares among themselves, not around the silent
// ones (a system prompt rolled out over the old one: 43 old groups, 6
// new). A pause of the whole scope idles nothing, and an idle group's
// next request brings it back.
func TestHomesDealTheGroupsThatSend(t *testing.T) {
	ids := []uint32{promptprefix.ClusterID("a"), promptprefix.ClusterID("b"), promptprefix.ClusterID("c")}
	caps := []float64{2, 2, 2}
	count := func(h *Homes, keys []uint64, now time.Time) map[uint32]int {
		out := map[uint32]int{}
		for _, k := range keys {
			id, _ := h.Home(scope, k, ids, caps, nil, now)
			require.NotZero(t, id, "key %x has a home", k)
			out[id]++
		}
		return out
	}

	old, fresh := chain(21, 43), chain(22, 6)
	h := NewHomes(0, 0)
	establish(h, old, epoch)
	later := epoch.Add(DefaultHomeIdle + time.Second)
	for range 10 { // 120 requests of the scope after the old groups' last
		establish(h, fresh, later)
	}
	assert.Equal(t, map[uint32]int{ids[0]: 2, ids[1]: 2, ids[2]: 2}, count(h, fresh, later),
		"the 6 groups that send, in equal shares")
	assert.Len(t, h.scopes[scope].assigned.keys, 6, "the old groups are out of the dealing")

	back := later.Add(time.Second)
	h.Served(scope, old[0], 0, back)
	assert.Equal(t, 7, sumOf(count(h, append([]uint64{old[0]}, fresh...), back)))
	assert.Len(t, h.scopes[scope].assigned.keys, 7, "an idle group's request brings it back")
	// Asked for when the idleness is looked at again, before Served
	// records the request: dealt all the same.
	asked := back.Add(DefaultHomeIdle / 2)
	id, _ := h.Home(scope, old[1], ids, caps, nil, asked)
	assert.NotZero(t, id, "an idle group asked for has its home at once")

	paused := NewHomes(0, 0)
	ks := chain(23, 12)
	establish(paused, ks, epoch)
	before := count(paused, ks, epoch)
	version := paused.scopes[scope].version
	assert.Equal(t, before, count(paused, ks, epoch.Add(2*DefaultHomeIdle)), "a pause of the whole scope")
	assert.Equal(t, version, paused.scopes[scope].version, "no key left the dealing in the pause")
}

func sumOf(m map[uint32]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// When a home cannot take a request of an established key, the key's
// second home is its home in the dealing of the same keys over the other
// clusters: the groups of a cluster that is full or out are dealt to the
// others in equal shares (with their own groups, within one of each
// other), the same on every replica that saw the same groups.
func TestHomesDealAHomesGroupsOverTheOthers(t *testing.T) {
	names, caps := []string{"a", "b", "c"}, []float64{2, 2, 2}
	ids := []uint32{promptprefix.ClusterID("a"), promptprefix.ClusterID("b"), promptprefix.ClusterID("c")}
	ks := chain(11, 12)
	one, two := NewHomes(0, 0), NewHomes(0, 0)
	establish(one, ks, epoch)
	establish(two, ks[6:], epoch)
	establish(two, ks[:6], epoch)
	homes := shares(t, one, ks, names, caps)
	for out, name := range names {
		after := map[string]int{}
		for _, k := range ks {
			home, _ := one.Home(scope, k, ids, caps, nil, epoch)
			if home != ids[out] {
				after[names[slices.Index(ids, home)]]++
				continue
			}
			second := one.Second(scope, k, home, ids, caps, nil)
			require.NotZero(t, second, "a second home for every established key")
			require.NotEqual(t, ids[out], second)
			assert.Equal(t, second, two.Second(scope, k, home, ids, caps, nil), "replicas agree")
			after[names[slices.Index(ids, second)]]++
		}
		var counts []int
		for _, n := range names {
			if n != name {
				counts = append(counts, after[n])
			}
		}
		assert.LessOrEqual(t, max(counts[0], counts[1])-min(counts[0], counts[1]), 1,
			"without %s, the others' groups within one of each other (homes %v, after %v)", name, homes, after)
	}
	assert.Zero(t, one.Second(scope, chain(12, 1)[0], ids[0], ids, caps, nil), "no second home for a key not established")
}

// TestAPinnedKeyStaysWhereItsPrefixWasReported: a key placed where an EPP
// reported its prefix is established at once and assigned there, counted
// in that cluster's share, so that the other keys are dealt around it; a
// pin to a cluster that is no longer a candidate is dealt as any key.
func TestAPinnedKeyStaysWhereItsPrefixWasReported(t *testing.T) {
	ids := []uint32{promptprefix.ClusterID("a"), promptprefix.ClusterID("b")}
	caps := []float64{1, 1}
	var keys []uint64
	for i := range 6 {
		keys = append(keys, uint64(1000+i)*0x9e3779b97f4a7c15)
	}
	h := NewHomes(0, 0)
	establish(h, keys[1:], epoch)
	// Pinned to whichever cluster the dealing would not have given it.
	dealt, _ := h.Home(scope, keys[1], ids, caps, nil, epoch)
	pinned := ids[0]
	if dealt == ids[0] {
		pinned = ids[1]
	}
	h.Served(scope, keys[1]^1, pinned, epoch)
	home, served := h.Home(scope, keys[1]^1, ids, caps, nil, epoch)
	assert.Equal(t, 1, served)
	assert.Equal(t, pinned, home, "established from its first request, at its pin")
	all := append(slices.Clone(keys[1:]), keys[1]^1)
	count := map[uint32]int{}
	for _, k := range all {
		id, _ := h.Home(scope, k, ids, caps, nil, epoch)
		count[id]++
	}
	assert.Equal(t, 3, count[ids[0]], "the pin counts in its cluster's share: %v", count)
	assert.Equal(t, 3, count[ids[1]], "the pin counts in its cluster's share: %v", count)

	// Its cluster gone, the key is dealt among those left.
	onlyOther := []uint32{promptprefix.ClusterID("c")}
	home, _ = h.Home(scope, keys[1]^1, onlyOther, []float64{1}, nil, epoch)
	assert.Equal(t, onlyOther[0], home)
}
