package clusterscore

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// manyCandidates are n serving candidates with fresh metrics, of 1 to 4
// ready pods, the one at local the local one (-1: none).
func manyCandidates(n, local int) []Candidate {
	cands := make([]Candidate, n)
	for i := range cands {
		cands[i] = Candidate{Name: fmt.Sprintf("cluster-%04d", i), Weight: 1, Health: HealthServing, Pool: freshPool(0, 0.2), Local: i == local}
		cands[i].Pool.ReadyPods = 1 + i%4
	}
	return cands
}

func TestFirstByHashIsTheRendezvousOrderWithEqualWeights(t *testing.T) {
	ids := make([]uint32, 200)
	for i := range ids {
		ids[i] = promptprefix.ClusterID(fmt.Sprintf("cluster-%04d", i))
	}
	for key := uint64(1); key < 50; key++ {
		var want []int
		rest := slices.Clone(ids)
		for range sampleHomes {
			k := firstByRendezvous(key, rest, nil, -1)
			want = append(want, slices.Index(ids, rest[k]))
			rest = slices.Delete(rest, k, k+1)
		}
		top, n := firstByHash(key, ids)
		assert.Equal(t, want, top[:n], "key %d", key)
	}
	top, n := firstByHash(7, ids[:1])
	assert.Equal(t, []int{0}, top[:n], "fewer ids than the homes sampled")
}

func TestSampleHoldsTheCandidatesAPickCanChoose(t *testing.T) {
	assert.Nil(t, NewSampler(manyCandidates(SampleAbove, -1)), "a pick orders all of a few")
	cands := manyCandidates(1000, 17)
	s := NewSampler(cands)
	require.NotNil(t, s)
	mem := NewMemory(DefaultMemoryOptions())
	p, err := New(routingpolicy.Named()[routingpolicy.PrefixAffinity], scheduling.DefaultConfig(), mem)
	require.NoError(t, err)
	require.True(t, p.Samples())
	blocks := chain(42, 24)
	holder := cands[512].Name
	mem.Prefixes.Record(blocks[:20], promptprefix.ClusterID(holder))
	req := &Request{Now: epoch, Scope: scope, Blocks: blocks}
	at := p.Sample(req, s, nil)
	assert.True(t, req.Sampled)
	assert.LessOrEqual(t, len(at), 1+sampleHomes+2*promptprefix.HolderClusters+1+sampleRandom)
	seen := map[int]bool{}
	for _, i := range at {
		assert.False(t, seen[i], "%d twice", i)
		seen[i] = true
	}
	assert.True(t, seen[17], "the local candidate")
	top, n := firstByHash(homeKey(blocks), s.ids)
	require.Equal(t, sampleHomes, n)
	for _, i := range top[:n] {
		assert.True(t, seen[i], "the key's rendezvous order: %d", i)
	}
	assert.True(t, seen[512], "the cluster that served the prompt")
	assert.Greater(t, len(at), 1+sampleHomes+1+sampleRandom/2, "drawn at random besides")

	// A session's cluster, with the session scorer.
	withSessions, err := New(routingpolicy.Config{Name: "s", Filters: []routingpolicy.Filter{routingpolicy.FilterHealth}, Scorers: []routingpolicy.WeightedScorer{{Scorer: routingpolicy.ScoreSession, Weight: 1}}, Picker: routingpolicy.PickMaxScore}, scheduling.DefaultConfig(), mem)
	require.NoError(t, err)
	mem.Sessions.Pin(scope, "alice", cands[900].Name, epoch)
	assert.Contains(t, withSessions.Sample(&Request{Now: epoch, Scope: scope, Session: "alice"}, s, nil), 900)

	// Pipelines that rotate over every candidate do not sample.
	rr, err := New(routingpolicy.Named()[routingpolicy.HealthBased], scheduling.DefaultConfig(), mem)
	require.NoError(t, err)
	assert.False(t, rr.Samples())
}

// Over samples, an established key's requests go to the same home, the
// first of its rendezvous order over every candidate, whatever was drawn
// at random; and to the next of that order when the home is filtered out.
func TestSampledPicksKeepTheKeysHome(t *testing.T) {
	cands := manyCandidates(1000, -1)
	s := NewSampler(cands)
	mem := NewMemory(DefaultMemoryOptions())
	p, err := New(routingpolicy.Named()[routingpolicy.PrefixAffinity], scheduling.DefaultConfig(), mem)
	require.NoError(t, err)
	blocks := chain(7, 24)
	order, _ := firstByHash(homeKey(blocks), s.ids)
	pick := func() (string, HomeOutcome) {
		req := &Request{Now: epoch, Scope: scope, Blocks: blocks, Criticality: scheduling.Standard}
		at := p.Sample(req, s, nil)
		sample := make([]Candidate, len(at))
		for k, i := range at {
			sample[k] = cands[i]
		}
		idx, err := p.Pick(req, sample, nil, nil, nil)
		require.NoError(t, err)
		require.NotEmpty(t, idx)
		mem.Served(req, sample[idx[0]].Name)
		return sample[idx[0]].Name, req.Home.Outcome
	}
	pick() // new: dealt wherever the scores lead
	for range 20 {
		to, outcome := pick()
		assert.Equal(t, HomeAtHome, outcome)
		assert.Equal(t, cands[order[0]].Name, to)
	}
	cands[order[0]].Health = HealthNotServing
	for range 20 {
		to, _ := pick()
		assert.Equal(t, cands[order[1]].Name, to, "its second")
	}
}
