package clusterscore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chain returns n chained block hashes starting from seed, as
// promptprefix.Blocks makes them.
func chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	h := seed
	for i := range out {
		h = max(h*6364136223846793005+1442695040888963407, 1)
		out[i] = h
	}
	return out
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
	o.Started("p", "a", epoch)
	o.Started("p", "a", epoch)
	o.FirstByte("p", "a", 100*time.Millisecond)
	o.FirstByte("p", "a", 300*time.Millisecond)
	o.Finished("p", "a", true)
	got := o.Observe("p", "a")
	assert.Equal(t, int64(1), got.InFlight)
	assert.Equal(t, int64(0), got.Awaiting, "both had their first byte")
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

// The floor is the least first byte of the latest 64 to 128, settled at
// the end of each window of 64: none before the first, and a move of less
// than 5 ms (or a fifth) is not taken, so that a floor near the edge of a
// distance class does not cross it back and forth. A cluster that moved
// further away shows it two windows later.
func TestObserverFloor(t *testing.T) {
	o := NewObserver(0)
	window := func(least time.Duration) {
		o.FirstByte("p", "a", least)
		for range floorWindow - 1 {
			o.FirstByte("p", "a", least+50*time.Millisecond)
		}
	}
	o.FirstByte("p", "a", 70*time.Millisecond)
	assert.Zero(t, o.Observe("p", "a").TTFBFloor, "not before a window is complete")
	for range floorWindow - 1 {
		o.FirstByte("p", "a", 90*time.Millisecond)
	}
	assert.Equal(t, 70*time.Millisecond, o.Observe("p", "a").TTFBFloor, "the least of the first window")
	window(73 * time.Millisecond)
	window(67 * time.Millisecond)
	window(74 * time.Millisecond)
	assert.Equal(t, 70*time.Millisecond, o.Observe("p", "a").TTFBFloor, "moves within 5 ms are not taken")
	window(120 * time.Millisecond)
	assert.Equal(t, 70*time.Millisecond, o.Observe("p", "a").TTFBFloor, "the window before still holds a faster one")
	window(120 * time.Millisecond)
	assert.Equal(t, 120*time.Millisecond, o.Observe("p", "a").TTFBFloor, "further away: taken after two windows")
	window(110 * time.Millisecond)
	assert.Equal(t, 120*time.Millisecond, o.Observe("p", "a").TTFBFloor, "10 ms is within a fifth of 120")
	assert.Zero(t, o.Observe("p", "b").TTFBFloor, "none measured")
}

// Awaiting counts the requests in flight still waiting for their first
// byte. A request that ends without one (refused, failed) cannot be told
// from one that had it: the count errs high, never low, and mends when
// the answered ones drain.
func TestObserverAwaiting(t *testing.T) {
	o := NewObserver(0.5)
	o.Started("p", "a", epoch)
	o.Started("p", "a", epoch)
	o.Started("p", "a", epoch)
	assert.Equal(t, int64(3), o.Observe("p", "a").Awaiting)
	o.FirstByte("p", "a", time.Millisecond)
	assert.Equal(t, int64(2), o.Observe("p", "a").Awaiting)
	o.Finished("p", "a", false) // the answered one
	assert.Equal(t, int64(2), o.Observe("p", "a").Awaiting)
	o.FirstByte("p", "a", time.Millisecond)
	o.Finished("p", "a", true) // one that failed before its first byte
	assert.Equal(t, int64(1), o.Observe("p", "a").Awaiting, "high by one: the answered one's count went with it")
	o.Finished("p", "a", false)
	assert.Equal(t, Observation{TTFB: o.Observe("p", "a").TTFB, TTFBSpread: o.Observe("p", "a").TTFBSpread, ErrorRatio: o.Observe("p", "a").ErrorRatio}, o.Observe("p", "a"), "drained: nothing in flight, nothing awaiting")
	o.FirstByte("p", "a", time.Millisecond) // a first byte with nothing in flight counts nothing
	assert.Equal(t, int64(0), o.Observe("p", "a").Awaiting)
	o.Started("p", "a", epoch)
	assert.Equal(t, int64(1), o.Observe("p", "a").Awaiting)
}

// AwaitingSince is when the longest awaiting request was sent, as if the
// answered ones were the first sent: a wait never overstated. Past the
// send times kept, the oldest kept stands for it.
func TestObserverAwaitingSince(t *testing.T) {
	o := NewObserver(0.5)
	assert.True(t, o.Observe("p", "a").AwaitingSince.IsZero(), "nothing sent")
	at := func(i int) time.Time { return epoch.Add(time.Duration(i) * time.Second) }
	for i := range 3 {
		o.Started("p", "a", at(i))
	}
	assert.Equal(t, at(0).UnixNano(), o.Observe("p", "a").AwaitingSince.UnixNano())
	o.FirstByte("p", "a", 10*time.Millisecond) // the one sent at 2, or so it counts as the first sent
	assert.Equal(t, at(1).UnixNano(), o.Observe("p", "a").AwaitingSince.UnixNano())
	o.FirstByte("p", "a", 10*time.Millisecond)
	o.FirstByte("p", "a", 10*time.Millisecond)
	assert.True(t, o.Observe("p", "a").AwaitingSince.IsZero(), "every one answered")
	for i := range sentKept + 4 {
		o.Started("p", "a", at(10+i))
	}
	assert.Equal(t, at(14).UnixNano(), o.Observe("p", "a").AwaitingSince.UnixNano(), "the oldest of the send times kept")

	// The first bytes' spread starts at half the first and halves with
	// each alike one at alpha 0.5: three of 10 ms.
	assert.Equal(t, 10*time.Millisecond, o.Observe("p", "a").TTFB)
	assert.Equal(t, 1250*time.Microsecond, o.Observe("p", "a").TTFBSpread)
}
