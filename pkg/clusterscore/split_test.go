package clusterscore

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// splitFixture is PrefixAffinity over a, b and c, equal, with one group's
// key established at its home, and the clusters' EPPs counting the
// requests they route over 30 seconds of picks: this sidecar's at the
// rates given (per second, by cluster name) and another importer's,
// othersRate a second at each, so that the shares know each one's part
// of all the requests and stay equal (the other importer's traffic is
// the same at each).
type splitFixture struct {
	*affinityFixture
	home string
	now  time.Time
}

func newSplitFixture(t *testing.T, rates map[string]float64) *splitFixture {
	return newSplitFixtureWith(t, rates, othersRate)
}

// newSplitFixtureWith is newSplitFixture with another importer sending
// others requests a second to each cluster.
func newSplitFixtureWith(t *testing.T, rates map[string]float64, others float64) *splitFixture {
	f := &splitFixture{affinityFixture: newAffinityFixture(t), now: epoch}
	group := f.conversation(0, 4)
	for range 2 {
		req := f.at(group, false)
		order, err := f.order(t, req)
		require.NoError(t, err)
		f.mem.Served(req, order[0])
		f.home = order[0]
	}
	for s := range 30 {
		f.now = epoch.Add(time.Duration(s) * time.Second)
		f.countWith(rates, others)
		_, err := f.order(t, f.at(group, false))
		require.NoError(t, err)
	}
	return f
}

// othersRate is the requests a second another importer sends each
// cluster in the fixture: 6 of every 16 with the rates of most tests,
// well above splitUnseenAbove.
const othersRate = 2

// countWith sets each cluster's EPP counts at f.now, as scraped: this
// sidecar's requests (relayed from "", the fixture's requests' cluster)
// at rates since epoch, and another importer's at others.
func (f *splitFixture) countWith(rates map[string]float64, others float64) {
	n := f.now.Sub(epoch).Seconds()
	for i := range f.cands {
		f.cands[i].Pool.UpdatedAt = f.now
		f.cands[i].Pool.RelayedRequests = nil
		if rates != nil {
			f.cands[i].Pool.RelayedRequests = map[string]float64{"": rates[f.cands[i].Name] * n, "cluster-x": others * n}
		}
	}
}

// conversation is the blocks of conversation c's prompt of the fixture's
// group: the group's 8 shared blocks, then turns blocks of its own.
func (f *splitFixture) conversation(c uint64, turns int) []uint64 {
	return append(slices.Clone(f.blocks[:8]), chain(1000+c, turns)...)
}

func (f *splitFixture) at(blocks []uint64, opens bool) *Request {
	req := f.req()
	req.Now, req.Blocks, req.Opens = f.now, blocks, opens
	return req
}

// route picks for req, records it served where it led, and returns where
// and how.
func (f *splitFixture) route(t *testing.T, req *Request) (string, HomeOutcome) {
	t.Helper()
	order, err := f.order(t, req)
	require.NoError(t, err)
	f.mem.Served(req, order[0])
	return order[0], req.Home.Outcome
}

func TestConversationsOpenedAtAHomeOverItsShareGoElsewhereAndStayThere(t *testing.T) {
	others := func(home string) (under, over string) {
		var rest []string
		for _, n := range []string{"a", "b", "c"} {
			if n != home {
				rest = append(rest, n)
			}
		}
		return rest[0], rest[1]
	}
	// The home's EPP counts 6 requests a second of this sidecar's, the
	// others 1 and 3, and each 2 of another importer's: the home serves
	// half of all the requests, 17 points above a third.
	probe := newSplitFixture(t, nil)
	under, busier := others(probe.home)
	rates := map[string]float64{probe.home: 6, under: 1, busier: 3}
	f := newSplitFixture(t, rates)
	require.Equal(t, probe.home, f.home, "the same key, the same home")

	to, outcome := f.route(t, f.at(f.conversation(1, 1), true))
	assert.Equal(t, HomeSplit, outcome)
	assert.Equal(t, under, to, "the cluster furthest below its share")

	to, outcome = f.route(t, f.at(f.conversation(1, 3), false))
	assert.Equal(t, HomeFollowed, outcome, "its next turn")
	assert.Equal(t, under, to)
	to, outcome = f.route(t, f.at(f.conversation(1, 5), false))
	assert.Equal(t, HomeFollowed, outcome, "and the one after")
	assert.Equal(t, under, to)

	// A turn of a conversation that went home is not moved: its history
	// is at home, and only conversations that open are split.
	to, outcome = f.route(t, f.at(f.conversation(2, 2), false))
	assert.Equal(t, HomeAtHome, outcome)
	assert.Equal(t, f.home, to)
	to, outcome = f.route(t, f.at(f.conversation(2, 4), false))
	assert.Equal(t, HomeAtHome, outcome)
	assert.Equal(t, f.home, to)
}

// Of the clusters below their share, a split conversation goes to the one
// that holds the most of its prompt, whose cache saves that much of its
// prefill, and of those that hold as much, the furthest below. In the
// fixture every cluster already holds the group's prefix; here the one
// less far below has also served a conversation that opened the same way.
func TestConversationsSplitGoWhereMostOfTheirPromptIs(t *testing.T) {
	probe := newSplitFixture(t, nil)
	var under, below string
	for _, n := range []string{"a", "b", "c"} {
		if n != probe.home {
			under, below = below, n
		}
	}
	// With the other importer's requests, the home serves half of all
	// the requests, below 31% and under 19%: both below a third.
	f := newSplitFixture(t, map[string]float64{probe.home: 6, under: 1, below: 3})
	opening := f.conversation(1, 1)
	f.mem.Served(f.at(opening, true), below)

	to, outcome := f.route(t, f.at(opening, true))
	assert.Equal(t, HomeSplit, outcome)
	assert.Equal(t, below, to, "the cluster below its share that holds the most of the prompt, not the one furthest below")

	to, outcome = f.route(t, f.at(f.conversation(2, 1), true))
	assert.Equal(t, HomeSplit, outcome)
	assert.Equal(t, under, to, "holding as much as the others, the furthest below")
}

func TestConversationsStayHomeWhereTheSharesAreNotKnownOrHeld(t *testing.T) {
	probe := newSplitFixture(t, nil)
	others := map[string]float64{"a": 3, "b": 3, "c": 3}
	busyHome := func(home string) map[string]float64 {
		r := map[string]float64{"a": 1, "b": 1, "c": 1}
		r[home] = 6
		return r
	}
	for _, tc := range []struct {
		name   string
		rates  func(home string) map[string]float64
		others float64
	}{
		{"EPPs that count nothing (upstream EPPs)", func(string) map[string]float64 { return nil }, othersRate},
		{"a home at its share", func(string) map[string]float64 { return others }, othersRate},
		{"a home within the margin above its share (1.3 points)", func(home string) map[string]float64 {
			r := map[string]float64{"a": 3, "b": 3, "c": 3}
			r[home] = 3.3
			return r
		}, othersRate},
		// The home serves 75% of all the requests, but the sidecar places
		// all of them: its bound sheds its groups' own traffic.
		{"no traffic the sidecar does not place", busyHome, 0},
		{"less than a tenth of the traffic the sidecar does not place (9%)", busyHome, 0.27},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newSplitFixtureWith(t, tc.rates(probe.home), tc.others)
			to, outcome := f.route(t, f.at(f.conversation(1, 1), true))
			assert.Equal(t, HomeAtHome, outcome)
			assert.Equal(t, f.home, to)
		})
	}
}

func TestMovedForgetsTheOlderGeneration(t *testing.T) {
	m := NewMoved(2)
	m.Record(1, 10)
	m.Record(2, 20)
	m.Record(1, 11) // known: no new generation
	assert.Equal(t, uint32(11), m.To(1))
	m.Record(3, 30) // the generation of 1 and 2 becomes the older
	assert.Equal(t, uint32(20), m.To(2))
	assert.Equal(t, uint32(30), m.To(3))
	m.Record(4, 40)
	m.Record(5, 50) // 1 and 2 forgotten
	assert.Zero(t, m.To(1))
	assert.Zero(t, m.To(2))
	assert.Equal(t, uint32(30), m.To(3))
	assert.Equal(t, uint32(40), m.To(4))
	assert.Equal(t, uint32(50), m.To(5))
}
