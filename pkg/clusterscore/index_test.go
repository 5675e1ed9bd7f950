package clusterscore

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chain returns n chained block hashes starting from seed, as PromptBlocks
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

func TestPrefixIndex(t *testing.T) {
	a, b, c := ClusterID("a"), ClusterID("b"), ClusterID("c")
	ids := []uint32{a, b, c}
	tests := []struct {
		name   string
		record func(x *PrefixIndex)
		query  []uint64
		want   []int
	}{
		{
			name:   "an empty index matches nothing",
			record: func(*PrefixIndex) {},
			query:  chain(1, 8),
			want:   []int{0, 0, 0},
		},
		{
			name:   "the cluster that served a prompt holds all its blocks",
			record: func(x *PrefixIndex) { x.Record(chain(1, 8), a) },
			query:  chain(1, 8),
			want:   []int{8, 0, 0},
		},
		{
			name: "each cluster's longest cached prefix counts",
			record: func(x *PrefixIndex) {
				x.Record(chain(1, 8)[:3], a)
				x.Record(chain(1, 8)[:6], b)
			},
			query: chain(1, 8),
			want:  []int{3, 6, 0},
		},
		{
			name: "a block cached without the blocks before it does not count",
			record: func(x *PrefixIndex) {
				x.Record(chain(1, 8)[2:], c)
			},
			query: chain(1, 8),
			want:  []int{0, 0, 0},
		},
		{
			name: "a block keeps the four most recent clusters",
			record: func(x *PrefixIndex) {
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
			x := NewPrefixIndex(1024)
			tt.record(x)
			assert.Zero(t, x.Evicted())
			got := make([]int, len(ids))
			x.Match(tt.query, ids, got)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestPrefixIndexEvictsLeastRecentlyRecorded(t *testing.T) {
	x := NewPrefixIndex(16 * 128) // 16 sets of 8 per shard
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

// TestPrefixIndexMemoryIsBounded records far more prefixes than the index
// holds and checks the bound three ways: the entries held, the bytes it
// reports, and the heap it actually grows.
func TestPrefixIndexMemoryIsBounded(t *testing.T) {
	const capacity = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := NewPrefixIndex(capacity)
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

func TestSessions(t *testing.T) {
	s := NewSessions(2, time.Minute)
	s.Pin("ns/pool", "alice", "a", epoch)
	s.Pin("ns/pool", "bob", "b", epoch)
	assert.Equal(t, "a", s.Cluster("ns/pool", "alice", epoch.Add(time.Minute)), "pinned until the TTL")
	assert.Empty(t, s.Cluster("ns/other", "alice", epoch), "sessions are per scope")
	assert.Empty(t, s.Cluster("ns/pool", "alice", epoch.Add(time.Minute+1)), "expired")
	assert.Equal(t, 1, s.Len(), "an expired pin is forgotten when read")

	s.Pin("ns/pool", "bob", "c", epoch.Add(2*time.Minute))
	s.Pin("ns/pool", "carol", "a", epoch.Add(2*time.Minute))
	s.Pin("ns/pool", "dave", "a", epoch.Add(2*time.Minute))
	assert.Equal(t, 2, s.Len(), "bounded")
	assert.Empty(t, s.Cluster("ns/pool", "bob", epoch.Add(2*time.Minute)), "the least recently pinned went first")
	assert.Equal(t, "a", s.Cluster("ns/pool", "dave", epoch.Add(2*time.Minute)))
	s.Pin("ns/pool", "", "a", epoch)
	assert.Equal(t, 2, s.Len(), "no session, no pin")
}

func TestSessionKey(t *testing.T) {
	headers := map[string]string{"x-session-id": " s1 ", "cookie": "theme=dark; sid=s2"}
	get := func(name string) string { return headers[name] }
	tests := []struct {
		name string
		spec SessionSpec
		want string
	}{
		{name: "the header's value", spec: SessionSpec{Header: "x-session-id", Cookie: "sid"}, want: "s1"},
		{name: "the cookie when the header is absent", spec: SessionSpec{Header: "x-user", Cookie: "sid"}, want: "s2"},
		{name: "nothing configured, no session", spec: SessionSpec{}, want: ""},
		{name: "a missing cookie, no session", spec: SessionSpec{Cookie: "other"}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, tt.spec.Key(get)) })
	}
	long := SessionSpec{Header: "h"}.Key(func(string) string { return string(make([]byte, 1000)) })
	assert.Len(t, long, maxSessionKey)
}

func TestObserver(t *testing.T) {
	o := NewObserver(0.5)
	assert.Equal(t, Observation{}, o.Observe("p", "a"))
	o.Started("p", "a")
	o.Started("p", "a")
	o.FirstByte("p", "a", 100*time.Millisecond)
	o.FirstByte("p", "a", 300*time.Millisecond)
	o.Finished("p", "a", true)
	got := o.Observe("p", "a")
	assert.Equal(t, int64(1), got.InFlight)
	assert.Equal(t, 200*time.Millisecond, got.TTFB)
	assert.InDelta(t, 0.5, got.ErrorRatio, 1e-9)
	o.Finished("p", "a", false)
	o.Finished("p", "a", false) // one Finished too many does not go below 0
	assert.Equal(t, int64(0), o.Observe("p", "a").InFlight)
	assert.Equal(t, Observation{}, o.Observe("q", "a"), "observations are per scope")
	o.Retain(func(scope, cluster string) bool { return false })
	assert.Equal(t, Observation{}, o.Observe("p", "a"))
	require.NotNil(t, NewObserver(7), "a bad alpha takes the default")
}
