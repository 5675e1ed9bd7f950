package promptprefix

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

// chain returns n chained block hashes starting from seed, as Blocks
// makes them.
func chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	h := seed
	for i := range out {
		h = max(h*6364136223846793005+1442695040888963407, 1)
		out[i] = h
	}
	return out
}

func TestIndex(t *testing.T) {
	a, b, c := ClusterID("a"), ClusterID("b"), ClusterID("c")
	ids := []uint32{a, b, c}
	tests := []struct {
		name   string
		record func(x *Index)
		query  []uint64
		want   []int
	}{
		{
			name:   "an empty index matches nothing",
			record: func(*Index) {},
			query:  chain(1, 8),
			want:   []int{0, 0, 0},
		},
		{
			name:   "the cluster that served a prompt holds all its blocks",
			record: func(x *Index) { x.Record(chain(1, 8), a) },
			query:  chain(1, 8),
			want:   []int{8, 0, 0},
		},
		{
			name: "each cluster's longest cached prefix counts",
			record: func(x *Index) {
				x.Record(chain(1, 8)[:3], a)
				x.Record(chain(1, 8)[:6], b)
			},
			query: chain(1, 8),
			want:  []int{3, 6, 0},
		},
		{
			name: "a block cached without the blocks before it does not count",
			record: func(x *Index) {
				x.Record(chain(1, 8)[2:], c)
			},
			query: chain(1, 8),
			want:  []int{0, 0, 0},
		},
		{
			name: "a block keeps the four most recent clusters",
			record: func(x *Index) {
				for _, id := range []uint32{a, b, c, 7, 8} {
					x.Record(chain(1, 2), id)
				}
			},
			query: chain(1, 2),
			want:  []int{0, 2, 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewIndex(1024)
			tt.record(x)
			assert.Zero(t, x.Evicted())
			got := make([]int, len(ids))
			x.Match(tt.query, ids, got)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestIndexEvictsLeastRecentlyRecorded(t *testing.T) {
	x := NewIndex(16 * 128) // 16 sets of 8 per shard
	a := ClusterID("a")
	hot := chain(99, 4)
	x.Record(hot, a)
	for i := range 200 {
		x.Record(chain(uint64(i)+1000, 50), a)
		x.Record(hot, a) // served again and again: stays
	}
	got := []int{0}
	x.Match(hot, []uint32{a}, got)
	assert.Equal(t, []int{4}, got)
	got[0] = 0
	x.Match(chain(1000, 50), []uint32{a}, got)
	assert.Less(t, got[0], 50, "the oldest cold prefix was pushed out")
}

// TestIndexMemoryIsBounded records far more prefixes than the index
// holds and checks the bound three ways: the entries held, the bytes it
// reports, and the heap it actually grows.
func TestIndexMemoryIsBounded(t *testing.T) {
	const capacity = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := NewIndex(capacity)
	rng := rand.New(rand.NewPCG(1, 2))
	clusters := []uint32{ClusterID("a"), ClusterID("b"), ClusterID("c")}
	for range 20_000 {
		x.Record(chain(rng.Uint64(), 50), clusters[rng.IntN(3)]) // 1,000,000 blocks
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(x)

	assert.LessOrEqual(t, x.Len(), x.Capacity())
	assert.GreaterOrEqual(t, x.Len(), capacity*9/10, "a full index uses its room")
	assert.Equal(t, uint64(1_000_000-x.Len()), x.Evicted(), "every block recorded is held or was evicted")
	assert.Less(t, x.Capacity(), capacity+indexShards*indexWays)
	perPrefix := float64(x.Bytes()) / float64(x.Capacity())
	t.Logf("index of %d blocks: %d bytes (%.0f bytes per prefix, %.2f MiB per 100,000 prefixes)", x.Capacity(), x.Bytes(), perPrefix, perPrefix*100_000/(1<<20))
	assert.LessOrEqual(t, x.Bytes(), 33*x.Capacity())
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	assert.Less(t, grown, int64(x.Bytes())+1<<20, "the heap grew by %d bytes for an index of %d", grown, x.Bytes())
}

func TestHoldersAreTheClustersOfThePromptsDeepestBlockHeldAndOfItsKey(t *testing.T) {
	x := NewIndex(1 << 12)
	prompt := make([]uint64, 40)
	for i := range prompt {
		prompt[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	x.Record(prompt[:30], 1) // a conversation of 30 blocks at 1
	x.Record(prompt[:10], 2) // another of its group's at 2
	x.Record(prompt[:4], 3)  // its key alone at 3
	assert.Equal(t, []uint32{1, 3, 2}, x.Holders(prompt, 4, nil), "the deepest (1), then the key's, most recent first")
	assert.Equal(t, []uint32{2, 1, 3}, x.Holders(prompt[:10], 4, nil), "of a prompt of 10 blocks: block 10 is 2's and 1's")
	assert.Empty(t, x.Holders([]uint64{7, 8, 9}, 3, nil), "a prompt nothing holds")
	assert.Equal(t, []uint32{9, 3, 2, 1}, x.Holders(prompt[:4], 4, []uint32{9}), "appended to dst; the key is the deepest block, read once")
}
