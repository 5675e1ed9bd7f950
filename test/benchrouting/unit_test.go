package benchrouting

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleOf(running, waiting [3]int) loadSample {
	s := loadSample{running: map[string]int{}, waiting: map[string]int{}}
	for i, c := range clusterNames {
		s.running[c], s.waiting[c] = running[i], waiting[i]
	}
	return s
}

func TestHerding(t *testing.T) {
	tests := []struct {
		name    string
		samples []loadSample
		want    float64
	}{
		{"no samples", nil, 0},
		{"all busy, none queues", []loadSample{sampleOf([3]int{2, 2, 1}, [3]int{})}, 0},
		{"all queue, none idle", []loadSample{sampleOf([3]int{2, 2, 2}, [3]int{1, 3, 1})}, 0},
		{"one idle while another queues", []loadSample{sampleOf([3]int{0, 2, 2}, [3]int{0, 4, 0})}, 1},
		{"a waiting-only cluster is not idle", []loadSample{sampleOf([3]int{0, 2, 2}, [3]int{1, 0, 0})}, 0},
		{"one of four", []loadSample{
			sampleOf([3]int{0, 2, 2}, [3]int{0, 4, 0}),
			sampleOf([3]int{1, 2, 2}, [3]int{0, 4, 0}),
			sampleOf([3]int{0, 0, 0}, [3]int{}),
			sampleOf([3]int{1, 1, 1}, [3]int{}),
		}, 0.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, herding(tt.samples)) })
	}
}

func TestSummarize(t *testing.T) {
	ok := func(cluster string, ttft, e2e, prompt, cached int) outcome {
		return outcome{cluster: cluster, code: http.StatusOK, complete: true, ttft: time.Duration(ttft) * time.Millisecond,
			e2e: time.Duration(e2e) * time.Millisecond, promptTokens: prompt, cachedTokens: cached}
	}
	runs := []*runResult{
		{
			outcomes: []outcome{ok("cluster-a", 100, 300, 100, 50), ok("cluster-b", 200, 400, 100, 0), {code: http.StatusTooManyRequests}},
			active:   2 * time.Second, hitTokens: 50, queryTokens: 200,
			samples: []loadSample{sampleOf([3]int{0, 2, 2}, [3]int{0, 3, 0})},
			homes:   map[string]float64{"home": 2, "queued": 1, "spill": 0},
		},
		{
			outcomes: []outcome{ok("cluster-a", 300, 500, 100, 100), {code: 0}, {code: http.StatusOK, complete: false, afterSaturation: true}},
			active:   2 * time.Second, hitTokens: 100, queryTokens: 100,
			samples: []loadSample{sampleOf([3]int{1, 2, 2}, [3]int{0, 1, 0})},
			homes:   map[string]float64{"home": 1, "queued": 0, "spill": 0},
		},
	}
	got := summarize(runs)
	assert.Equal(t, 6, got.Sent)
	assert.Equal(t, 3, got.Completed)
	assert.Equal(t, 200.0, got.TTFTP50)
	assert.Equal(t, 300.0, got.TTFTP99)
	assert.Equal(t, 500.0, got.E2EP99)
	assert.Equal(t, 0.75, got.Throughput, "3 completed in 4 s")
	assert.Equal(t, 0.5, got.PrefixHit, "150 of 300 tokens from the counters")
	assert.Equal(t, 0.5, got.RequestHitRatio, "150 of 300 tokens from the usage")
	assert.Equal(t, 0.167, got.ShedRatio)
	assert.Equal(t, 0.333, got.ErrorRatio)
	assert.Equal(t, 0.5, got.HerdingRatio)
	assert.Equal(t, map[string]float64{"cluster-a": 0.667, "cluster-b": 0.333}, got.ClusterShare)
	assert.Equal(t, 2, got.Samples)
	assert.Equal(t, 3, got.ClusterPeakQ["cluster-b"])
	assert.Equal(t, 2.0, got.ClusterQueue["cluster-b"])
	assert.Equal(t, 0.5, got.ClusterBusy["cluster-a"])
	assert.Equal(t, 0.5, got.AfterSaturation, "1 request sent to the saturated cluster in 2 runs")
	assert.Equal(t, map[string]float64{"home": 1.5, "queued": 0.5, "spill": 0}, got.HomeDecisions, "home decisions per run")
	assert.Nil(t, summarize([]*runResult{{}}).HomeDecisions, "a routing without homes has none")
	assert.Equal(t, []repetition{
		{TTFTP50: 100, TTFTP99: 200, PrefixHit: 0.25},
		{TTFTP50: 300, TTFTP99: 300, PrefixHit: 1, AfterSaturation: 1},
	}, got.Repetitions, "each repetition's figures alone")
	assert.Empty(t, policyErrors("s", "p", got))
}

func TestSanityErrors(t *testing.T) {
	good := func(hit float64) *policyResult {
		return &policyResult{TTFTP50: 100, TTFTP99: 200, E2EP99: 300, Throughput: 10, PrefixHit: hit, RequestHitRatio: hit,
			Sent: 10, Completed: 10, Samples: 5, ClusterShare: map[string]float64{"cluster-b": 1}}
	}
	mk := func(oracle, rr float64) *results {
		r := &results{
			Config: config{Workloads: []string{"shared-prompts"}, Policies: []string{"LocalFirst", "RoundRobin", "Oracle"}},
			Workloads: map[string]*workloadResult{"shared-prompts": {Spec: family["shared-prompts"], Policies: map[string]*policyResult{
				"LocalFirst": good(0.6), "RoundRobin": good(rr), "Oracle": good(oracle), "ClusterOracle": good(0.6), "PrefixAffinity@3": good(0.6)}}},
		}
		r.Summary = summarizeFamily(r)
		return r
	}
	assert.Empty(t, sanityErrors(mk(0.7, 0.5)))
	assert.ErrorContains(t, joinErrs(sanityErrors(mk(0.4, 0.5))), "Oracle's prefix hit ratio 0.400 is below RoundRobin's 0.500")

	r := mk(0.7, 0.5)
	delete(r.Workloads["shared-prompts"].Policies, "RoundRobin")
	assert.ErrorContains(t, joinErrs(sanityErrors(r)), "no results of policy RoundRobin")

	r = mk(0.7, 0.5)
	delete(r.Workloads["shared-prompts"].Policies, "PrefixAffinity@3")
	assert.ErrorContains(t, joinErrs(sanityErrors(r)), "no results of policy PrefixAffinity@3", "the workload's replica policy runs too")

	r = mk(0.7, 0.5)
	r.Workloads["shared-prompts"].Policies["LocalFirst"].ClusterShare = map[string]float64{"cluster-a": 0.5, "cluster-b": 0.5}
	assert.ErrorContains(t, joinErrs(sanityErrors(r)), "is the policy applied?")

	r = mk(0.7, 0.5)
	r.Summary = nil
	assert.ErrorContains(t, joinErrs(sanityErrors(r)), "no summary")

	r = &results{Config: config{Workloads: []string{workloadNoPrefix}, Policies: []string{"RoundRobin"}},
		Workloads: map[string]*workloadResult{workloadNoPrefix: {Spec: family[workloadNoPrefix], Policies: map[string]*policyResult{"RoundRobin": good(0.2)}}}}
	r.Summary = summarizeFamily(r)
	assert.ErrorContains(t, joinErrs(sanityErrors(r)), "prefix hit ratio 0.200 without shared prefixes")

	bad := good(0.5)
	bad.TTFTP99, bad.Completed, bad.ShedRatio, bad.RequestHitRatio = 50, 0, 1.5, 0.9
	msg := joinErrs(policyErrors("s", "p", bad)).Error()
	for _, want := range []string{"0 of 10 requests completed", "not positive and ordered", "shed ratio 1.5", "disagree"} {
		assert.Contains(t, msg, want)
	}
}

func joinErrs(errs []error) error {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString(e.Error() + "\n")
	}
	if b.Len() == 0 {
		return nil
	}
	return &textErr{b.String()}
}

type textErr struct{ s string }

func (e *textErr) Error() string { return e.s }

func TestPickOracle(t *testing.T) {
	targets := []target{{"cluster-a", "a"}, {"cluster-b", "b"}, {"cluster-c", "c"}}
	tests := []struct {
		name     string
		cached   map[string]int
		inFlight map[string]int
		n        uint64
		want     string
	}{
		{"most cached wins over load", map[string]int{"cluster-b": 32, "cluster-c": 16}, map[string]int{"cluster-b": 9}, 0, "cluster-b"},
		{"a tie goes to the least loaded", map[string]int{"cluster-a": 16, "cluster-c": 16}, map[string]int{"cluster-a": 2, "cluster-c": 1}, 0, "cluster-c"},
		{"nothing cached, least loaded", nil, map[string]int{"cluster-a": 1, "cluster-c": 1}, 0, "cluster-b"},
		{"a full tie takes turns", nil, nil, 4, "cluster-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := pickOracle(targets, tt.cached, tt.inFlight, tt.n)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.cluster)
		})
	}
	_, err := pickOracle(nil, nil, nil, 0)
	assert.Error(t, err)
}

func TestRotate(t *testing.T) {
	list := []string{"a", "b", "c"}
	assert.Equal(t, []string{"a", "b", "c"}, rotate(list, 0))
	assert.Equal(t, []string{"b", "c", "a"}, rotate(list, 1))
	assert.Equal(t, []string{"a", "b", "c"}, rotate(list, 3))
	assert.Nil(t, rotate(nil, 2))
}

func TestReadStream(t *testing.T) {
	at := time.Now()
	body := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n" +
		"data: [DONE]\n\n"
	done, cached, ttft := readStream(strings.NewReader(body), at)
	assert.True(t, done)
	assert.Equal(t, 32, cached)
	assert.Positive(t, ttft)

	done, _, ttft = readStream(strings.NewReader("data: {\"choices\":[]}\n\n"), at)
	assert.False(t, done, "a stream cut before [DONE]")
	assert.Zero(t, ttft, "no content chunk")
}

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		check   func(*testing.T, config)
		wantErr string
	}{
		{"full by default: the whole family", nil, func(t *testing.T, c config) {
			assert.Equal(t, "full", c.Profile)
			assert.Equal(t, withUnseen(append(slices.Clone(familyOrder), heldOutOrder()...)), c.Workloads, "the family, then the held-out workloads, with those of unseen traffic")
			assert.True(t, c.Warmup, "each workload warms the sidecar up before its measured runs")
			assert.Equal(t, []string{"PrefixAffinity", "HubReference", "RoundRobin", "Oracle"}, c.Policies)
			assert.Equal(t, []string{"PrefixAffinity", "HubReference", "RoundRobin", "Oracle", "MetricsBased"}, c.policiesOf(family[workloadSaturated]))
			assert.Equal(t, []string{"PrefixAffinity", "HubReference", "RoundRobin", "Oracle", "ClusterOracle", "PrefixAffinity@3"}, c.policiesOf(family["shared-prompts"]))
		}, ""},
		{"smoke: two workloads on the same servers, the replica case included", map[string]string{"MCI_BENCH_PROFILE": "smoke"}, func(t *testing.T, c config) {
			assert.Equal(t, []string{"shared-prompts", workloadNoPrefix, unseenSmoke, smokeHeldOut()}, c.Workloads)
			assert.Equal(t, 1, c.Repetitions)
			assert.False(t, c.Warmup)
			assert.Contains(t, c.policiesOf(family["shared-prompts"]), "PrefixAffinity@3")
		}, ""},
		{"a new policy name is one more entry", map[string]string{"MCI_BENCH_ROUTING_POLICIES": "Weighted, PrefixAffinity,Oracle"}, func(t *testing.T, c config) {
			assert.Equal(t, []string{"Weighted", "PrefixAffinity", "Oracle"}, c.Policies)
			assert.False(t, isReference("PrefixAffinity"), "taken as a cluster policy of the sidecar")
		}, ""},
		{"inline configurations are separated by semicolons", map[string]string{"MCI_BENCH_ROUTING_POLICIES": "prefix-cache=3,in-flight=1; RoundRobin;"}, func(t *testing.T, c config) {
			assert.Equal(t, []string{"prefix-cache=3,in-flight=1", "RoundRobin"}, c.Policies)
		}, ""},
		{"overrides", map[string]string{"MCI_BENCH_ROUTING_DURATION": "30s", "MCI_BENCH_ROUTING_REPETITIONS": "3", "MCI_BENCH_ROUTING_WARMUP": "false", "MCI_BENCH_ROUTING_WORKLOADS": "no-shared-prefix, far-remote"}, func(t *testing.T, c config) {
			assert.False(t, c.Warmup)
			assert.Equal(t, 30*time.Second, c.RunDuration)
			assert.Equal(t, 3, c.Repetitions)
			assert.Equal(t, []string{workloadNoPrefix, "far-remote"}, c.Workloads)
		}, ""},
		{"another loopback block", map[string]string{"MCI_BENCH_ROUTING_LOOPBACK_BLOCK": "251"}, func(t *testing.T, c config) {
			assert.Equal(t, 251, c.LoopbackBlock)
		}, ""},
		{"bad loopback block", map[string]string{"MCI_BENCH_ROUTING_LOOPBACK_BLOCK": "254"}, nil, "MCI_BENCH_ROUTING_LOOPBACK_BLOCK"},
		{"bad profile", map[string]string{"MCI_BENCH_PROFILE": "huge"}, nil, "want full or smoke"},
		{"bad duration", map[string]string{"MCI_BENCH_ROUTING_DURATION": "fast"}, nil, "MCI_BENCH_ROUTING_DURATION"},
		{"bad repetitions", map[string]string{"MCI_BENCH_ROUTING_REPETITIONS": "0"}, nil, "REPETITIONS"},
		{"bad warm-up", map[string]string{"MCI_BENCH_ROUTING_WARMUP": "sometimes"}, nil, "MCI_BENCH_ROUTING_WARMUP"},
		{"unknown workload", map[string]string{"MCI_BENCH_ROUTING_WORKLOADS": "chaos"}, nil, `unknown workload "chaos"`},
		{"drawn workloads by their seeds", map[string]string{"MCI_BENCH_ROUTING_WORKLOADS": "tuning-1,held-out-9101"}, func(t *testing.T, c config) {
			assert.Equal(t, []string{"tuning-1", "held-out-9101"}, c.Workloads)
		}, ""},
		{"a seed of neither list", map[string]string{"MCI_BENCH_ROUTING_WORKLOADS": "held-out-1"}, nil, `unknown workload "held-out-1"`},
		{"bad replicas", map[string]string{"MCI_BENCH_ROUTING_POLICIES": "PrefixAffinity@9"}, nil, "1 to 3 replicas"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"MCI_BENCH_PROFILE", "MCI_BENCH_ROUTING_DURATION", "MCI_BENCH_ROUTING_REPETITIONS", "MCI_BENCH_ROUTING_WARMUP", "MCI_BENCH_ROUTING_WORKLOADS", "MCI_BENCH_ROUTING_POLICIES", "MCI_BENCH_ROUTING_LOOPBACK_BLOCK"} {
				t.Setenv(k, tt.env[k])
			}
			c, err := loadConfig()
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

// TestFamilySpansTheRanges: the family covers its ranges, and each
// workload is valid and calibrated to its load.
func TestFamilySpansTheRanges(t *testing.T) {
	c := defaultConfig("full")
	require.ElementsMatch(t, familyOrder, keys(family), "familyOrder lists every workload once")
	loads, groups, system, batch := []float64{}, []int{}, []int{}, []int{}
	var singleTurn, multiTurn, far, noPrefix, saturated, replicas bool
	for _, name := range familyOrder {
		w := family[name]
		t.Run(name, func(t *testing.T) {
			p, capacity, err := calibrated(c, w)
			require.NoError(t, err)
			assert.InDelta(t, w.Load*capacity, p.Rate, capacity*0.05)
			assert.Equal(t, c.RunDuration, p.Duration)
			assert.NotEmpty(t, w.Summary)
			assert.LessOrEqual(t, p.Rate, 30.0, "a rate a 2-core machine drives through the data path")
		})
		loads, batch = append(loads, w.Load), append(batch, w.Batch)
		if w.Profile.OneShotShare < 1 {
			groups, system = append(groups, w.Profile.Groups), append(system, w.Profile.SystemTokens)
			singleTurn = singleTurn || w.Profile.Turns == 1
			multiTurn = multiTurn || w.Profile.Turns > 1
		}
		far, noPrefix, saturated = far || w.Far != "", noPrefix || w.Profile.OneShotShare == 1, saturated || w.Saturate
		replicas = replicas || len(w.ReplicaPolicies) > 0
	}
	assert.Equal(t, 0.5, slices.Min(loads))
	assert.Equal(t, 0.9, slices.Max(loads))
	assert.Equal(t, 4, slices.Min(groups))
	assert.Equal(t, 32, slices.Max(groups))
	assert.Equal(t, 500, slices.Min(system))
	assert.Equal(t, 4000, slices.Max(system))
	assert.Equal(t, 2, slices.Min(batch))
	assert.Equal(t, 8, slices.Max(batch))
	assert.True(t, singleTurn && multiTurn && far && noPrefix && saturated && replicas)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestParseReplicas(t *testing.T) {
	tests := []struct {
		in       string
		policy   string
		replicas int
		wantErr  bool
	}{
		{"PrefixAffinity", "PrefixAffinity", 1, false},
		{"prefix-cache=3,queue=2", "prefix-cache=3,queue=2", 1, false},
		{"PrefixAffinity@3", "PrefixAffinity", 3, false},
		{"PrefixAffinity@0", "", 0, true},
		{"PrefixAffinity@4", "", 0, true},
		{"@3", "", 0, true},
		{"Oracle@3", "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			p, n, err := parseReplicas(tt.in)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.policy, p)
			assert.Equal(t, tt.replicas, n)
		})
	}
}

func TestSummarizeFamily(t *testing.T) {
	pr := func(hit, p50, p99 float64, shares ...float64) *policyResult {
		return &policyResult{PrefixHit: hit, TTFTP50: p50, TTFTP99: p99,
			ClusterShare: map[string]float64{"cluster-a": shares[0], "cluster-b": shares[1], "cluster-c": shares[2]}}
	}
	r := &results{
		Config: config{Workloads: []string{"far-remote", workloadNoPrefix}, Policies: []string{"PrefixAffinity", "HubReference", "RoundRobin", "Oracle"}},
		Workloads: map[string]*workloadResult{
			"far-remote": {Spec: family["far-remote"], Policies: map[string]*policyResult{
				// Above the hub's hit ratio and 0.95 of the oracle's, a
				// worse p99, and the far cluster's small share does not
				// count: the largest of the equal ones is 0.60.
				"PrefixAffinity": pr(0.90, 30, 900, 0.60, 0.38, 0.02),
				"HubReference":   pr(0.89, 30, 200, 0.5, 0.3, 0.2),
				"RoundRobin":     pr(0.5, 80, 300, 0.34, 0.33, 0.33),
				"Oracle":         pr(0.94, 30, 200, 0.4, 0.4, 0.2),
			}},
			workloadNoPrefix: {Spec: family[workloadNoPrefix], Policies: map[string]*policyResult{
				"PrefixAffinity": pr(0, 410, 700, 0.34, 0.33, 0.33),
				"HubReference":   pr(0, 800, 2000, 0.34, 0.33, 0.33),
				"RoundRobin":     pr(0, 400, 680, 0.34, 0.33, 0.33),
				"Oracle":         pr(0, 400, 690, 0.34, 0.33, 0.33),
			}},
		},
	}
	sum := summarizeFamily(r)
	require.Len(t, sum, 4)
	pa := map[string]targetSummary{}
	for _, ts := range sum[0].Targets {
		pa[ts.Target] = ts
	}
	require.Equal(t, "PrefixAffinity", sum[0].Policy)
	assert.Equal(t, []string{"far-remote"}, pa["hit ratio >= hub's"].Met, "no shared prefix: not checked")
	assert.Equal(t, []string{"far-remote"}, pa["hit ratio >= 0.95 of the oracle's"].Met)
	assert.Equal(t, []string{"far-remote", workloadNoPrefix}, pa["TTFT p50 <= hub's"].Met)
	assert.Equal(t, []string{"far-remote (900 ms against 200 ms)"}, pa["TTFT p99 <= hub's"].Missed)
	assert.Equal(t, []string{"far-remote (0.60)"}, pa["max share <= 55%"].Missed)
	assert.Equal(t, []string{workloadNoPrefix}, pa["no shared prefix: TTFT within 5% of round-robin's"].Met, "410/700 against 400/680")
	assert.Empty(t, pa["saturated cluster: yields as fast as MetricsBased"].Met)
	assert.Empty(t, pa["saturated cluster: yields as fast as MetricsBased"].Missed)

	md := summaryMarkdown(sum)
	assert.Contains(t, md, "| `PrefixAffinity` | 1 / 1 | 1 / 1 | 2 / 2 | 1 / 2 | 1 / 2 | 1 / 1 | — | — | — |")
	assert.Contains(t, md, "- `PrefixAffinity`, TTFT p99 <= hub's: missed on far-remote (900 ms against 200 ms)")
	assert.Contains(t, md, "| `HubReference` |")
}

// A target is judged against the spread of the repetitions measured in
// the same run: met on the pooled figures, within the spread when some
// repetition of the policy meets it against some repetition of the
// reference, missed otherwise.
func TestJudgeAgainstTheSpread(t *testing.T) {
	fig := func(pooled float64, reps ...float64) figure { return figure{pooled: pooled, reps: reps} }
	tests := []struct {
		name string
		a, b figure
		ok   comparison
		want verdict
	}{
		{name: "a pooled p99 no worse than the reference's is met", a: fig(870, 900, 840), b: fig(875, 860, 890), ok: atMost(1), want: met},
		{name: "a worse pooled p99 whose repetitions overlap the reference's is within the spread", a: fig(884, 866, 902), b: fig(875, 860, 890), ok: atMost(1), want: withinSpread},
		{name: "a p99 worse in every repetition than every repetition of the reference is missed", a: fig(1100, 1000, 1200), b: fig(820, 800, 840), ok: atMost(1), want: missed},
		{name: "with one repetition there is no spread: a worse figure is missed", a: fig(884), b: fig(875), ok: atMost(1), want: missed},
		{name: "a hit ratio below 0.95 of the reference's in every pair is missed", a: fig(0.68, 0.67, 0.69), b: fig(0.73, 0.73, 0.74), ok: atLeast(0.95), want: missed},
		{name: "a hit ratio above the reference's must be strictly above", a: fig(0.9, 0.9, 0.9), b: fig(0.9, 0.9, 0.9), ok: above, want: missed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, judge(tt.a, tt.b, tt.ok))
		})
	}
}
