package clusterscore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaterFill(t *testing.T) {
	tests := []struct {
		name   string
		caps   []float64
		others []float64
		load   float64
		want   []float64
	}{
		{name: "no other traffic: capacity's shares", caps: []float64{2, 2, 4}, others: []float64{0, 0, 0}, load: 8, want: []float64{0.25, 0.25, 0.5}},
		{name: "60% of the traffic from two exporters' own users: the importing cluster takes what levels the three", caps: []float64{1, 1, 1}, others: []float64{3, 0, 3}, load: 4, want: []float64{1.0 / 12, 10.0 / 12, 1.0 / 12}},
		{name: "a cluster above the level gets none", caps: []float64{1, 1, 1}, others: []float64{9, 0, 0}, load: 4, want: []float64{0, 0.5, 0.5}},
		{name: "leveled per unit of capacity", caps: []float64{1, 3}, others: []float64{2, 2}, load: 4, want: []float64{0, 1}},
		{name: "the same other traffic everywhere: capacity's shares", caps: []float64{1, 1}, others: []float64{5, 5}, load: 2, want: []float64{0.5, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := waterFill(tt.caps, tt.others, tt.load)
			require.Len(t, got, len(tt.want))
			sum := 0.0
			for i := range got {
				assert.InDelta(t, tt.want[i], got[i], 1e-9, "share %d: %v", i, got)
				sum += got[i]
			}
			assert.InDelta(t, 1, sum, 1e-9)
		})
	}
}

// sharesFixture is three equal candidates, b the local one, whose EPPs
// count the requests they route by relaying cluster (counts), scraped at
// at.
func sharesFixture(at time.Time, counts ...map[string]float64) []Candidate {
	cands := []Candidate{{Name: "a"}, {Name: "b", Local: true}, {Name: "c"}}
	for i := range cands {
		cands[i].Pool = freshPool(0, 0.1)
		cands[i].Pool.UpdatedAt = at
		if counts != nil {
			cands[i].Pool.RelayedRequests = counts[i]
		}
	}
	return cands
}

// offerEach has s offer the shares of the candidates made by scrape for
// every second from first to last, as picks do, and returns the last.
func offerEach(s *Shares, first, last int, scrape func(i int) []Candidate) []float64 {
	var shares []float64
	for i := first; i <= last; i++ {
		at := epoch.Add(time.Duration(i) * time.Second)
		cands := scrape(i)
		slots := make([]slot, len(cands))
		for k := range slots {
			slots[k].measured = true
		}
		caps := []float64{2, 2, 2}
		shares, _ = s.offer(&Request{Now: at, Scope: scope, Cluster: "importer"}, cands, []int{0, 1, 2}, slots, caps)
	}
	return shares
}

func TestSharesLevelTheOtherTraffic(t *testing.T) {
	// rate counts, at second i, the requests routed at the given rates
	// per second: this cluster's (to each of a, b, c) and the others'.
	rate := func(own, others [3]float64) func(i int) []Candidate {
		return func(i int) []Candidate {
			n := float64(i)
			return sharesFixture(epoch.Add(time.Duration(i)*time.Second),
				map[string]float64{"importer": own[0] * n, "": others[0] * n},
				map[string]float64{"": own[1] * n, "cluster-x": others[1] * n},
				map[string]float64{"importer": own[2] * n, "": others[2] * n})
		}
	}
	tests := []struct {
		name string
		// scrape makes the candidates of second i; seconds how long.
		scrape  func(i int) []Candidate
		seconds int
		want    []float64
	}{
		{name: "EPPs that count nothing (upstream EPPs): capacity's shares, exactly",
			scrape: func(i int) []Candidate { return sharesFixture(epoch.Add(time.Duration(i) * time.Second)) }, seconds: 60,
			want: []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}},
		{name: "no other traffic: capacity's shares (no new deal)",
			scrape: rate([3]float64{3, 3, 3}, [3]float64{0, 0, 0}), seconds: 60, want: []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}},
		{name: "60% of the traffic from a's and c's own users: the local cluster b is offered most, a and c what levels them",
			scrape: rate([3]float64{2, 4, 2}, [3]float64{6, 0, 6}), seconds: 60, want: []float64{5.0 / 64, 53.0 / 64, 5.0 / 64}},
		{name: "another importing cluster's traffic at the local cluster counts as other traffic: b, which it fills beyond the level, keeps the least share",
			scrape: rate([3]float64{2, 2, 2}, [3]float64{0, 4, 0}), seconds: 60, want: []float64{32.0 / 64, 1.0 / 64, 32.0 / 64}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := offerEach(NewShares(), 0, tt.seconds, tt.scrape)
			assert.InDeltaSlice(t, tt.want, got, 1e-9, "%v", got)
		})
	}
}

// The shares move only when one moved by a step: once leveled against a
// cluster's own users, a rate of theirs that wanders (1 and 3 requests a
// second, 10 seconds each in turn) deals no key anew.
func TestSharesFollowAShiftNotItsNoise(t *testing.T) {
	s := NewShares()
	// a's own users' requests by second i: 1 a second, and 2 more in
	// every other 10 seconds.
	wandering := func(i int) float64 { return float64(i) + 2*float64(i/20*10+max(i%20-10, 0)) }
	wobble := func(i int) []Candidate {
		n := float64(i)
		return sharesFixture(epoch.Add(time.Duration(i)*time.Second),
			map[string]float64{"importer": 3 * n, "": wandering(i)},
			map[string]float64{"": 3 * n},
			map[string]float64{"importer": 3 * n, "": 0})
	}
	first := offerEach(s, 0, 60, wobble)
	require.Less(t, first[0], 0.3, "leveled against a's own users: %v", first)
	for i := 61; i < 120; i++ {
		require.Equal(t, first, offerEach(s, i, i, wobble), "second %d", i)
	}
}

// Counts read across a pause in the sidecar's picks are not a rate: the
// routing benchmark runs other routings between two of PrefixAffinity's,
// and their requests, sent through the clusters' own gateways, would read
// as the clusters' own users'.
func TestSharesSkipThePauses(t *testing.T) {
	s := NewShares()
	counts := func(others float64) func(i int) []Candidate {
		return func(i int) []Candidate {
			n := float64(i)
			return sharesFixture(epoch.Add(time.Duration(i)*time.Second),
				map[string]float64{"importer": 3 * n, "": others},
				map[string]float64{"": 3 * n},
				map[string]float64{"importer": 3 * n, "": 0})
		}
	}
	before := offerEach(s, 0, 30, counts(0))
	// 30 s without a pick, during which a's own gateway routed 600.
	after := offerEach(s, 60, 90, counts(600))
	assert.Equal(t, before, after)
	// Without the pause, the same 600 are a's own users' and move a's share.
	moved := offerEach(NewShares(), 0, 30, func(i int) []Candidate { return counts(float64(20 * i))(i) })
	assert.Less(t, moved[0], before[0]-0.1, "%v", moved)
}

func TestSharesRetainForgetsThePoolsGone(t *testing.T) {
	s := NewShares()
	offerEach(s, 0, 0, func(i int) []Candidate { return sharesFixture(epoch) })
	require.Contains(t, s.scopes, scope)
	s.Retain(func(sc string) bool { return sc != scope })
	assert.NotContains(t, s.scopes, scope)
}

// A table that puts another cluster at a candidate's place starts that
// cluster's rates anew: the counts of the cluster before are not its.
func TestSharesStartAnewForAnotherClusterAtAPlace(t *testing.T) {
	s := NewShares()
	scrape := func(last string, othersAtLast float64) func(i int) []Candidate {
		return func(i int) []Candidate {
			n := float64(i)
			cands := sharesFixture(epoch.Add(time.Duration(i)*time.Second),
				map[string]float64{"importer": 3 * n, "": 0},
				map[string]float64{"": 3 * n},
				map[string]float64{"importer": 3 * n, "": othersAtLast})
			cands[2].Name = last
			return cands
		}
	}
	offerEach(s, 0, 30, scrape("c", 0))
	// d's EPP has counted 10,000 requests of its own users since it
	// started, none of them now.
	got := offerEach(s, 31, 40, scrape("d", 10000))
	assert.Greater(t, got[2], 0.25, "d's counts are not a rate over c's: %v", got)
}
