package clusterscore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// reporting gives the fixture's cluster name a prefix summary holding the
// first n of blocks, as its EPP would publish after routing traffic this
// sidecar did not see.
func reporting(f *affinityFixture, name string, blocks []uint64, n int) {
	s := promptprefix.NewSummary(n)
	for _, b := range blocks[:n] {
		s.Add(b)
	}
	pool := *f.cand(name).Pool
	pool.Prefixes = s
	f.cand(name).Pool = &pool
}

// TestReportedPrefixes: what the exporting clusters' EPPs report their
// servers hold counts beside what this sidecar sent them.
func TestReportedPrefixes(t *testing.T) {
	modelBlocks := chain(7, 16)
	for _, tt := range []struct {
		name string
		// setup makes the fixture's situation; home is where the key's
		// rendezvous order would put it.
		setup       func(f *affinityFixture, home string) string
		wantOutcome HomeOutcome
		// want is the cluster that leads; "" for the home.
		want string
	}{
		{
			name: "a key new to the sidecar goes where an EPP reports its prefix, not where the rotation would deal it",
			setup: func(f *affinityFixture, home string) string {
				other := otherThan(home)
				reporting(f, other, modelBlocks, 16)
				return other
			},
			wantOutcome: HomeReported,
		},
		{
			name: "of two reporting EPPs, the one holding more of the prompt",
			setup: func(f *affinityFixture, home string) string {
				other := otherThan(home)
				reporting(f, home, modelBlocks, 6)
				reporting(f, other, modelBlocks, 12)
				return other
			},
			wantOutcome: HomeReported,
		},
		{
			name: "an EPP that reports less than the home key's blocks does not place the key",
			setup: func(f *affinityFixture, home string) string {
				reporting(f, otherThan(home), modelBlocks, homeKeyBlocks-1)
				return ""
			},
			wantOutcome: HomeDealt,
		},
		{
			name: "a report read with pool metrics gone stale counts for nothing",
			setup: func(f *affinityFixture, home string) string {
				other := otherThan(home)
				reporting(f, other, modelBlocks, 16)
				f.cand(other).Pool.UpdatedAt = epoch.Add(-time.Hour)
				return ""
			},
			wantOutcome: HomeDealt,
		},
		{
			name: "a key the sidecar has served keeps its home whatever an EPP reports",
			setup: func(f *affinityFixture, home string) string {
				req := f.req()
				known(f, req, home)
				reporting(f, otherThan(home), modelBlocks, 16)
				return home
			},
			wantOutcome: HomeAtHome,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			home := homeOf(f.blocks, "a", "b", "c")
			want := tt.setup(f, home)
			req := f.req()
			req.ModelBlocks = modelBlocks
			var ex Explanation
			order, err := f.p.Pick(req, f.cands, nil, nil, &ex)
			require.NoError(t, err)
			assert.Equal(t, tt.wantOutcome, ex.Home.Outcome, ex.String())
			if want != "" {
				assert.Equal(t, want, f.cands[order[0]].Name, ex.String())
			}
		})
	}

	t.Run("the prefix score is the longer of the memory's and the report's", func(t *testing.T) {
		f := newAffinityFixture(t)
		withConfig(t, f, scorersOnly)
		req := f.req()
		req.ModelBlocks = modelBlocks
		f.mem.Prefixes.Record(req.Blocks[:4], promptprefix.ClusterID("a"))
		f.mem.Prefixes.Record(req.Blocks[:16], promptprefix.ClusterID("b"))
		reporting(f, "a", modelBlocks, 8)
		reporting(f, "b", modelBlocks, 2)
		reporting(f, "c", modelBlocks, 12)
		var ex Explanation
		_, err := f.p.Pick(req, f.cands, nil, nil, &ex)
		require.NoError(t, err)
		for name, want := range map[string]float64{"a": 8.0 / 16, "b": 1, "c": 12.0 / 16} {
			assert.InDelta(t, want, ex.Clusters[clusterIndex(f, name)].Scores[routingpolicy.ScorePrefixCache], 1e-9, "%s: %s", name, ex.String())
		}
	})
}

// otherThan is a cluster of the fixture other than name.
func otherThan(name string) string {
	if name == "a" {
		return "b"
	}
	return "a"
}

func clusterIndex(f *affinityFixture, name string) int {
	for i := range f.cands {
		if f.cands[i].Name == name {
			return i
		}
	}
	panic(name)
}

func TestTheExplanationSaysWhatEachEPPReports(t *testing.T) {
	f := newAffinityFixture(t)
	modelBlocks := chain(7, 16)
	reporting(f, "a", modelBlocks, 8)
	reporting(f, "b", modelBlocks, 0)
	req := f.req()
	req.ModelBlocks = modelBlocks
	var ex Explanation
	_, err := f.p.Pick(req, f.cands, nil, nil, &ex)
	require.NoError(t, err)
	assert.Contains(t, ex.String(), ",reported=8", ex.String())
	assert.Contains(t, ex.String(), ",reported=0", ex.String())
	assert.Contains(t, ex.String(), ",reported=none", "c's EPP publishes no summary: %s", ex.String())

	// A request whose prompt was not read against summaries says nothing
	// of them.
	req = f.req()
	_, err = f.p.Pick(req, f.cands, nil, nil, &ex)
	require.NoError(t, err)
	assert.NotContains(t, ex.String(), "reported=")
}

// TestPrefixReportsOffReadsTheMemoryAlone: HubReference, as the hub it
// stands for, and any configuration with prefix-reports=off.
func TestPrefixReportsOffReadsTheMemoryAlone(t *testing.T) {
	modelBlocks := chain(7, 16)
	f := newAffinityFixture(t)
	withConfig(t, f, "prefix-cache=3,in-flight=1,queue=1,home-bound=2,prefix-reports=off")
	home := homeOf(f.blocks, "a", "b", "c")
	reporting(f, otherThan(home), modelBlocks, 16)
	req := f.req()
	req.ModelBlocks = modelBlocks
	var ex Explanation
	_, err := f.p.Pick(req, f.cands, nil, nil, &ex)
	require.NoError(t, err)
	assert.Equal(t, HomeDealt, ex.Home.Outcome, ex.String())
	assert.NotContains(t, ex.String(), "reported=")
	for _, c := range ex.Clusters {
		assert.Zero(t, c.Scores[routingpolicy.ScorePrefixCache], ex.String())
	}
}
