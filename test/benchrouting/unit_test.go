package benchrouting

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"nothing", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of 4 is the 2nd", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(func() []int {
			v := make([]int, 100)
			for i := range v {
				v[i] = 100 - i
			}
			return v
		}()...), 99, 99 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, percentile(tt.in, tt.p)) })
	}
}

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
		},
		{
			outcomes: []outcome{ok("cluster-a", 300, 500, 100, 100), {code: 0}, {code: http.StatusOK, complete: false, afterSaturation: true}},
			active:   2 * time.Second, hitTokens: 100, queryTokens: 100,
			samples: []loadSample{sampleOf([3]int{1, 2, 2}, [3]int{0, 1, 0})},
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
	assert.Empty(t, policyErrors("s", "p", got))
}

func TestSanityErrors(t *testing.T) {
	good := func(hit float64) *policyResult {
		return &policyResult{TTFTP50: 100, TTFTP99: 200, E2EP99: 300, Throughput: 10, PrefixHit: hit, RequestHitRatio: hit,
			Sent: 10, Completed: 10, Samples: 5, ClusterShare: map[string]float64{"cluster-b": 1}}
	}
	mk := func(oracle, rr float64) *results {
		return &results{
			Config:    config{Scenarios: []string{scenarioSharedPrefix}, Policies: []string{"LocalFirst", "RoundRobin", "Oracle"}},
			Policies:  map[string]*policyResult{"Oracle": good(oracle)},
			Scenarios: map[string]*scenarioResult{scenarioSharedPrefix: {Policies: map[string]*policyResult{"LocalFirst": good(0.6), "RoundRobin": good(rr), "Oracle": good(oracle)}}},
		}
	}
	assert.Empty(t, sanityErrors(mk(0.7, 0.5)))
	assert.ErrorContains(t, joinErrs(sanityErrors(mk(0.4, 0.5))), "Oracle's prefix hit ratio 0.400 is below RoundRobin's 0.500")

	r := mk(0.7, 0.5)
	delete(r.Scenarios[scenarioSharedPrefix].Policies, "RoundRobin")
	assert.ErrorContains(t, joinErrs(sanityErrors(r)), "no results of policy RoundRobin")

	r = mk(0.7, 0.5)
	r.Scenarios[scenarioSharedPrefix].Policies["LocalFirst"].ClusterShare = map[string]float64{"cluster-a": 0.5, "cluster-b": 0.5}
	assert.ErrorContains(t, joinErrs(sanityErrors(r)), "is the policy applied?")

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
		{"full by default", nil, func(t *testing.T, c config) {
			assert.Equal(t, "full", c.Profile)
			assert.Equal(t, allScenarios, c.Scenarios)
			assert.Equal(t, []string{"Weighted", "HealthBased", "MetricsBased", "LocalFirst", "PrefixAffinity", "HubReference", "RoundRobin", "Oracle"}, c.Policies)
		}, ""},
		{"smoke", map[string]string{"MCI_BENCH_PROFILE": "smoke"}, func(t *testing.T, c config) {
			assert.Equal(t, []string{scenarioSharedPrefix}, c.Scenarios)
			assert.Equal(t, 1, c.Repetitions)
		}, ""},
		{"a new policy name is one more entry", map[string]string{"MCI_BENCH_ROUTING_POLICIES": "Weighted, PrefixAffinity,Oracle"}, func(t *testing.T, c config) {
			assert.Equal(t, []string{"Weighted", "PrefixAffinity", "Oracle"}, c.Policies)
			assert.False(t, isReference("PrefixAffinity"), "taken as a cluster policy of the sidecar")
		}, ""},
		{"inline configurations are separated by semicolons", map[string]string{"MCI_BENCH_ROUTING_POLICIES": "prefix-cache=3,in-flight=1; RoundRobin;"}, func(t *testing.T, c config) {
			assert.Equal(t, []string{"prefix-cache=3,in-flight=1", "RoundRobin"}, c.Policies)
		}, ""},
		{"overrides", map[string]string{"MCI_BENCH_ROUTING_DURATION": "30s", "MCI_BENCH_ROUTING_REPETITIONS": "3", "MCI_BENCH_ROUTING_SCENARIOS": "no-shared-prefix"}, func(t *testing.T, c config) {
			assert.Equal(t, 30*time.Second, c.RunDuration)
			assert.Equal(t, 3, c.Repetitions)
			assert.Equal(t, []string{scenarioNoPrefix}, c.Scenarios)
		}, ""},
		{"the short-prompts workload", map[string]string{"MCI_BENCH_ROUTING_WORKLOAD": "short-prompts"}, func(t *testing.T, c config) {
			assert.Equal(t, workloadShortPrompts, c.WorkloadName)
			assert.Equal(t, 600, c.Workload.SystemTokens)
		}, ""},
		{"unknown workload", map[string]string{"MCI_BENCH_ROUTING_WORKLOAD": "huge"}, nil, `MCI_BENCH_ROUTING_WORKLOAD="huge": want long-prompts or short-prompts`},
		{"bad profile", map[string]string{"MCI_BENCH_PROFILE": "huge"}, nil, "want full or smoke"},
		{"bad duration", map[string]string{"MCI_BENCH_ROUTING_DURATION": "fast"}, nil, "MCI_BENCH_ROUTING_DURATION"},
		{"bad repetitions", map[string]string{"MCI_BENCH_ROUTING_REPETITIONS": "0"}, nil, "REPETITIONS"},
		{"unknown scenario", map[string]string{"MCI_BENCH_ROUTING_SCENARIOS": "chaos"}, nil, `unknown scenario "chaos"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"MCI_BENCH_PROFILE", "MCI_BENCH_ROUTING_DURATION", "MCI_BENCH_ROUTING_REPETITIONS", "MCI_BENCH_ROUTING_SCENARIOS", "MCI_BENCH_ROUTING_POLICIES", "MCI_BENCH_ROUTING_WORKLOAD"} {
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

func TestScenarioWorkloads(t *testing.T) {
	c := defaultConfig("full")
	for _, name := range allScenarios {
		t.Run(name, func(t *testing.T) {
			p, capacity, desc, err := scenarioWorkload(c, name)
			require.NoError(t, err)
			assert.NotEmpty(t, desc)
			assert.InDelta(t, c.Load*capacity, p.Rate, capacity*0.05)
			assert.Equal(t, c.RunDuration, p.Duration)
		})
	}
	_, _, _, err := scenarioWorkload(c, "chaos")
	assert.Error(t, err)
}
