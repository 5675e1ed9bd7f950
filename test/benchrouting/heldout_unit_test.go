package benchrouting

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The held-out seeds are ten, apart from the tuning seeds and from the
// seeds of the named workloads, and each names one workload.
func TestHeldOutSeedsAreApart(t *testing.T) {
	assert.Len(t, heldOutSeeds, 10)
	for _, s := range heldOutSeeds {
		assert.NotContains(t, tuningSeeds, s, "seed %d is both held out and for tuning", s)
		for name, w := range family {
			assert.NotEqual(t, w.Profile.Seed, s, "seed %d is the named workload %s's", s, name)
		}
		w, ok := specOf(heldOutName(s))
		require.True(t, ok)
		assert.Equal(t, s, w.Profile.Seed)
	}
	assert.ElementsMatch(t, heldOutOrder(), func() []string {
		var out []string
		for _, s := range heldOutSeeds {
			out = append(out, heldOutName(s))
		}
		return out
	}(), "every held-out workload runs once")
	smoke, _ := specOf(smokeHeldOut())
	assert.Equal(t, [2]int{family["shared-prompts"].ServersPerCluster, family["shared-prompts"].Batch}, [2]int{smoke.ServersPerCluster, smoke.Batch},
		"the smoke's held-out workload runs on shared-prompts's servers, without a restart")
}

// The drawn workloads are valid, drivable on 2 cores, and their
// parameters spread wide: loads below 70% and past saturation, few and
// many groups, short and long prompts and conversations, one-shot shares
// from none to half.
func TestDrawnWorkloadsSpreadWide(t *testing.T) {
	var loads, oneShot []float64
	var groups, system, turns []int
	c := defaultConfig("full")
	assert.Equal(t, drawn(heldOutSeeds[0]), draw(heldOutSeeds[0]), "a seed draws the same workload every time")
	for _, s := range append(slices.Clone(tuningSeeds), heldOutSeeds...) {
		w := drawn(s)
		p, _, err := calibrated(c, w)
		require.NoError(t, err, "seed %d", s)
		require.NoError(t, p.Validate())
		assert.LessOrEqual(t, p.Rate, 30.0, "seed %d: a rate a 2-core machine drives", s)
		assert.NotEmpty(t, w.Summary)
		loads, oneShot = append(loads, w.Load), append(oneShot, w.Profile.OneShotShare)
		groups, system, turns = append(groups, w.Profile.Groups), append(system, w.Profile.SystemTokens), append(turns, w.Profile.Turns)
	}
	assert.Less(t, slices.Min(loads), 0.7)
	assert.Greater(t, slices.Max(loads), 1.0, "past the servers' saturation")
	assert.LessOrEqual(t, slices.Min(groups), 8)
	assert.GreaterOrEqual(t, slices.Max(groups), 40)
	assert.LessOrEqual(t, slices.Min(system), 500)
	assert.GreaterOrEqual(t, slices.Max(system), 3000)
	assert.LessOrEqual(t, slices.Min(turns), 5)
	assert.GreaterOrEqual(t, slices.Max(turns), 12)
	assert.Less(t, slices.Min(oneShot), 0.1)
	assert.Greater(t, slices.Max(oneShot), 0.5)
}

func TestSummarizeHeldOut(t *testing.T) {
	pr := func(hit, p50, p99 float64) *policyResult {
		return &policyResult{PrefixHit: hit, TTFTP50: p50, TTFTP99: p99}
	}
	r := &results{
		Config: config{Workloads: []string{"shared-prompts", "held-out-9101", "held-out-9102", "held-out-9103"}},
		Workloads: map[string]*workloadResult{
			"shared-prompts": {Policies: map[string]*policyResult{mciPolicy: pr(0.1, 900, 900), hubPolicy: pr(0.5, 100, 100), oraclePolicy: pr(0.6, 90, 90)}},
			// Meets all three targets: p99 within 1.1 x the hub's.
			"held-out-9101": {Policies: map[string]*policyResult{mciPolicy: pr(0.5, 100, 210), hubPolicy: pr(0.4, 120, 200), oraclePolicy: pr(0.6, 90, 150)}},
			// Misses the hit ratio by a third: the worst.
			"held-out-9102": {Policies: map[string]*policyResult{mciPolicy: pr(0.3, 100, 200), hubPolicy: pr(0.45, 110, 200), oraclePolicy: pr(0.5, 90, 150)}},
			// No oracle ran: no row.
			"held-out-9103": {Policies: map[string]*policyResult{mciPolicy: pr(0.1, 100, 200), hubPolicy: pr(0.9, 100, 200)}},
		},
	}
	s := summarizeHeldOut(r)
	require.NotNil(t, s)
	require.Len(t, s.Rows, 2, "the family's workloads and a held-out one without all three policies have no row")
	assert.Equal(t, 0.955, s.Rows[0].Shortfall, "p99 210 against 1.1 x 200")
	assert.Equal(t, 1.5, s.Rows[1].Shortfall, "hit ratio 0.3 against 0.45")
	assert.Equal(t, "held-out-9102", s.Worst)
	md := s.markdown()
	assert.Contains(t, md, "| **held-out-9102 (worst)** | 0.300 / 0.450 / 0.500 | 100 / 110 / 90 | 200 / 200 / 150 | 1.50 |")
	assert.Contains(t, md, "Worst, held-out-9102: hit ratio 0.300 against the hub's 0.450 (missed), TTFT p50 100 ms against 110 ms (met), p99 200 ms against 1.1 x 200 ms (met)")
	assert.Empty(t, heldOutErrors(&results{Config: r.Config, Workloads: r.Workloads, HeldOut: s}))
	assert.NotEmpty(t, heldOutErrors(&results{Config: r.Config, Workloads: r.Workloads}), "held-out results without their table")
	assert.Nil(t, summarizeHeldOut(&results{Config: config{Workloads: []string{"shared-prompts"}}, Workloads: r.Workloads}), "no held-out workload ran")
	assert.Empty(t, (*heldOutSummary)(nil).markdown())
}
