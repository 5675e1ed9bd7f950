package benchrouting

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The seeds of the unseen-traffic workloads: tuning and held-out listed
// apart and disjoint, and apart from every other seed of the family.
func TestUnseenSeedsAreApart(t *testing.T) {
	named := map[uint64]string{}
	for name, w := range family {
		named[w.Profile.Seed] = name
	}
	for name, w := range unseenFamily {
		assert.NotContains(t, named, w.Profile.Seed, "%s's seed is another named workload's", name)
		named[w.Profile.Seed] = name
	}
	all := append(slices.Clone(tuningSeeds), heldOutSeeds...)
	for _, v := range unseenVariants {
		require.NotEmpty(t, unseenHeldOutSeeds[v.name], "%s has held-out seeds", v.name)
		require.NotEmpty(t, unseenTuningSeeds[v.name], "%s has tuning seeds", v.name)
		for _, s := range unseenHeldOutSeeds[v.name] {
			for _, u := range unseenVariants {
				assert.NotContains(t, unseenTuningSeeds[u.name], s, "seed %d is both held out (%s) and for tuning (%s)", s, v.name, u.name)
			}
		}
		for _, s := range append(slices.Clone(unseenTuningSeeds[v.name]), unseenHeldOutSeeds[v.name]...) {
			assert.NotContains(t, all, s, "seed %d of %s is another drawn workload's", s, v.name)
			assert.NotContains(t, named, s, "seed %d of %s is a named workload's", s, v.name)
			all = append(all, s)
		}
		for prefix, seeds := range map[string][]uint64{heldOutPrefix: unseenHeldOutSeeds[v.name], tuningPrefix: unseenTuningSeeds[v.name]} {
			for _, s := range seeds {
				w, ok := specOf(unseenName(prefix, v.name, s))
				require.True(t, ok)
				assert.Equal(t, s, w.Profile.Seed)
				assert.Equal(t, v.users, w.Profile.Users)
				assert.Equal(t, prefix == heldOutPrefix, isHeldOut(unseenName(prefix, v.name, s)), "held-out ones join the held-out table")
			}
		}
		_, ok := specOf(unseenName(heldOutPrefix, v.name, unseenTuningSeeds[v.name][0]))
		assert.False(t, ok, "a tuning seed is not held out")
	}
}

// The full profile runs every unseen-traffic workload once, each after the
// last workload on the same servers; each is valid and drivable.
func TestUnseenWorkloadsRunInTheFullProfile(t *testing.T) {
	c := defaultConfig("full")
	for _, name := range unseenOrder() {
		i := slices.Index(c.Workloads, name)
		require.GreaterOrEqual(t, i, 0, "%s runs", name)
		assert.Equal(t, 1, count(c.Workloads, name))
		w, ok := specOf(name)
		require.True(t, ok)
		assert.True(t, hasUnseenTraffic(w))
		if i > 0 {
			prev, _ := specOf(c.Workloads[i-1])
			assert.Equal(t, shapeOf(prev), shapeOf(w), "%s runs on the servers of %s before it", name, c.Workloads[i-1])
		}
		p, _, err := calibrated(c, w)
		require.NoError(t, err)
		require.NoError(t, p.Validate())
		assert.LessOrEqual(t, p.Rate, 30.0, "%s: a rate a 2-core machine drives", name)
	}
	assert.InDelta(t, 0.3, directShare(unseenFamily["direct-30"]), 1e-9)
	assert.InDelta(t, 0.6, directShare(unseenFamily["direct-60"]), 1e-9)
	assert.Equal(t, 2, importers(unseenFamily["two-importers"]))
	assert.Zero(t, directShare(unseenFamily["two-importers"]))
	assert.False(t, hasUnseenTraffic(family["shared-prompts"]))
	smoke := unseenFamily[unseenSmoke]
	assert.Equal(t, shapeOf(family["shared-prompts"]), shapeOf(smoke), "the smoke's case runs without a restart")
	assert.Equal(t, 2, importers(smoke))
	assert.InDelta(t, 0.3, directShare(smoke), 1e-9)
	assert.NotContains(t, c.Workloads, unseenSmoke, "the smoke's case is not the full profile's")
}

func count(list []string, s string) int {
	n := 0
	for _, e := range list {
		if e == s {
			n++
		}
	}
	return n
}

// The routed figures leave out the requests sent to the exporters' own
// gateways; a run without any has none.
func TestRoutedFiguresLeaveOutDirectRequests(t *testing.T) {
	ok := func(entry, cluster string, ttft, prompt, cached int) outcome {
		return outcome{entry: entry, cluster: cluster, code: http.StatusOK, complete: true, ttft: time.Duration(ttft) * time.Millisecond,
			e2e: time.Duration(ttft+100) * time.Millisecond, promptTokens: prompt, cachedTokens: cached}
	}
	runs := []*runResult{
		{outcomes: []outcome{ok("", "cluster-b", 100, 100, 100), ok("cluster-a", "cluster-a", 900, 100, 0), ok("", "cluster-a", 200, 100, 50)}, active: time.Second},
		{outcomes: []outcome{ok("cluster-c", "cluster-c", 800, 100, 0), ok("", "cluster-c", 300, 100, 0)}, active: time.Second},
	}
	got := summarize(runs)
	require.NotNil(t, got.Routed)
	assert.Equal(t, 3, got.Routed.Requests)
	assert.Equal(t, 0.5, got.Routed.PrefixHit, "150 of the routed requests' 300 tokens")
	assert.Equal(t, 0.3, got.RequestHitRatio, "150 of all 500")
	assert.Equal(t, 300.0, got.Routed.TTFTP99, "the direct requests' 800 and 900 ms are not the routing's")
	assert.Equal(t, map[string]float64{"cluster-a": 0.333, "cluster-b": 0.333, "cluster-c": 0.333}, got.Routed.ClusterShare)
	assert.Equal(t, map[string]float64{"cluster-a": 0.4, "cluster-b": 0.2, "cluster-c": 0.4}, got.ClusterShare)
	assert.Equal(t, []float64{0.75, 0}, []float64{got.Repetitions[0].RoutedHit, got.Repetitions[1].RoutedHit})

	second := summarize([]*runResult{{outcomes: []outcome{ok("", "cluster-b", 100, 100, 0), ok(secondImporterEntry, "cluster-a", 100, 100, 0)}, active: time.Second}})
	assert.Nil(t, second.Routed, "a second importer's requests are routed too")
}

// The unseen-traffic targets apply to those workloads only: the routed
// hit ratio against 0.95 of the oracle's (0.9 at 60% direct), and every
// equal cluster within 5 points of an equal share of all the requests.
func TestUnseenTargets(t *testing.T) {
	pr := func(hit, routed float64, shares ...float64) *policyResult {
		return &policyResult{PrefixHit: hit, Routed: &routedFigures{PrefixHit: routed},
			ClusterShare: map[string]float64{"cluster-a": shares[0], "cluster-b": shares[1], "cluster-c": shares[2]}}
	}
	r := &results{
		Config: config{Workloads: []string{"direct-30", "direct-60", "two-importers", "shared-prompts"}, Policies: []string{"PrefixAffinity", "Oracle"}},
		Workloads: map[string]*workloadResult{
			// Above the oracle's hit ratio over all the requests, far
			// below it over the routed ones.
			"direct-30": {Spec: unseenFamily["direct-30"], Policies: map[string]*policyResult{
				"PrefixAffinity": pr(0.9, 0.6, 0.36, 0.30, 0.34), "Oracle": pr(0.7, 0.96, 0.33, 0.33, 0.34)}},
			"direct-60": {Spec: unseenFamily["direct-60"], Policies: map[string]*policyResult{
				"PrefixAffinity": pr(0.5, 0.88, 0.40, 0.20, 0.40), "Oracle": pr(0.5, 0.96, 0.33, 0.33, 0.34)}},
			"two-importers": {Spec: unseenFamily["two-importers"], Policies: map[string]*policyResult{
				"PrefixAffinity": {PrefixHit: 0.8, ClusterShare: map[string]float64{"cluster-a": 0.3, "cluster-b": 0.35, "cluster-c": 0.35}},
				"Oracle":         {PrefixHit: 0.82, ClusterShare: map[string]float64{"cluster-a": 0.3, "cluster-b": 0.35, "cluster-c": 0.35}}}},
			"shared-prompts": {Spec: family["shared-prompts"], Policies: map[string]*policyResult{
				"PrefixAffinity": pr(0.1, 0.1, 0.9, 0.05, 0.05), "Oracle": pr(0.9, 0.9, 0.33, 0.33, 0.34)}},
		},
	}
	sum := summarizeFamily(r)
	require.Equal(t, "PrefixAffinity", sum[0].Policy)
	pa := map[string]targetSummary{}
	for _, ts := range sum[0].Targets {
		pa[ts.Target] = ts
	}
	hitTarget, shareTarget := pa[unseenGoals[0].name], pa[unseenGoals[1].name]
	assert.Equal(t, []string{"direct-60", "two-importers"}, hitTarget.Met,
		"0.88 against 0.9 x 0.96 (0.95 x 0.96 would miss); 0.8 against 0.95 x 0.82 (all routed: the counters)")
	assert.Equal(t, []string{"direct-30 (0.600 against 0.95 x 0.960)"}, hitTarget.Missed,
		"the routed hit ratio is judged, not the one of all the requests (0.9 against 0.7)")
	assert.Equal(t, []string{"direct-30", "two-importers"}, shareTarget.Met, "3 and 1.7 points off")
	assert.Equal(t, []string{"direct-60 (13.3 points off (a / b / c 0.40 / 0.20 / 0.40))"}, shareTarget.Missed)

	assert.Equal(t, 0.9, unseenHitTarget(unseenFamily["direct-60"]))
	assert.Equal(t, 0.95, unseenHitTarget(unseenFamily["direct-30"]))
	assert.Equal(t, 0.95, unseenHitTarget(unseenFamily["two-importers"]))

	md := unseenTable([]string{"PrefixAffinity", "Oracle"}, r.Workloads["direct-30"])
	assert.Contains(t, md, "30% sent to the exporters' own gateways, 1 importing sidecars")
	assert.Contains(t, md, "| `PrefixAffinity` | 0.600 / 0.900 |")
	assert.Empty(t, unseenTable([]string{"PrefixAffinity"}, r.Workloads["shared-prompts"]))
}
