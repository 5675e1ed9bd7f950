package benchrouting

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mci-dev/mci/test/benchrouting/workload"
	"github.com/mci-dev/mci/test/simulator"
)

// config is one run of the benchmark. MCI_BENCH_PROFILE picks the
// defaults (full, or smoke: one scenario, seconds per policy) and the
// MCI_BENCH_ROUTING_* variables of loadConfig override some of them.
type config struct {
	Profile string `json:"profile"`
	// RunDuration is how long each policy's workload sends requests, per
	// repetition; Repetitions interleave the policies, rotating their
	// order.
	RunDuration time.Duration `json:"runDuration"`
	Repetitions int           `json:"repetitions"`
	// RequestTimeout bounds each request; one that runs out counts as an
	// error.
	RequestTimeout time.Duration `json:"requestTimeout"`
	// Load is the share of the servers' capacity (with no cache hit) that
	// the arrival rate asks for.
	Load float64 `json:"load"`
	// ServersPerCluster simulated model servers, each with a batch of
	// Batch requests, in each of the 3 clusters.
	ServersPerCluster int `json:"serversPerCluster"`
	Batch             int `json:"batch"`
	// Cost is every server's cost model; RemoteRoundTrip is added by the
	// servers of the two remote clusters (not by the importing cluster's).
	Cost            simulator.CostModel `json:"cost"`
	RemoteRoundTrip time.Duration       `json:"remoteRoundTrip"`
	// WorkloadName names Workload, one of workloads; Workload is the
	// shared-prefix workload's shape, its rate calibrated to Load.
	WorkloadName string           `json:"workloadName"`
	Workload     workload.Profile `json:"workload"`
	// Scenarios and Policies run, in this order.
	Scenarios []string `json:"scenarios"`
	Policies  []string `json:"policies"`
	// SampleEvery is the period of the load samples.
	SampleEvery time.Duration `json:"sampleEvery"`
	// LoopbackBlock is the third octet of the first cluster's addresses.
	LoopbackBlock int    `json:"loopbackBlock"`
	Out           string `json:"-"`
}

// The scenarios.
const (
	scenarioSharedPrefix = "shared-prefix"
	scenarioNoPrefix     = "no-shared-prefix"
	scenarioSaturated    = "saturated-cluster"
)

var allScenarios = []string{scenarioSharedPrefix, scenarioNoPrefix, scenarioSaturated}

// The shared-prefix workloads, MCI_BENCH_ROUTING_WORKLOAD. Both have 36
// conversations open of up to 8 turns (40-token user messages, 16-token
// answers) and 20% one-shot requests of 300 tokens; they differ in their
// system prompts, against a server's prefix cache of 1,024 blocks of 16
// tokens (16,384 tokens).
const (
	// workloadLongPrompts (the default): 20 groups share system prompts
	// of 2,000 tokens, as agents' (instructions and tool definitions) and
	// RAG applications' (instructions and retrieved context) are. Their
	// 40,000 tokens are 2.4 times what one server caches and 0.4 times
	// what the 6 servers cache together. A server sent every group evicts
	// system prompts before they come back; one sent a third of them
	// (13,300 tokens: each cluster's EPP spreads its requests over both
	// of its servers, so each holds all the cluster's groups) keeps them.
	// That is the regime of a real deployment, whose applications'
	// prompts together outgrow one GPU's KV cache (a few hundred thousand
	// tokens) but not the fleet's, and where the routing decides what is
	// reused.
	workloadLongPrompts = "long-prompts"
	// workloadShortPrompts: 6 groups share system prompts of 600 tokens.
	// Their 3,600 tokens fit in every server's cache, so any routing
	// reuses them after a few requests and only the conversations'
	// histories are left for affinity to win (the benchmark's first
	// default).
	workloadShortPrompts = "short-prompts"
)

var workloads = map[string]workload.Profile{
	workloadLongPrompts: {
		Seed: 14, Groups: 20, SystemTokens: 2000, ActiveConversations: 36, Turns: 8, UserTokens: 40, OutputTokens: 16,
		OneShotShare: 0.2, OneShotTokens: 300,
	},
	workloadShortPrompts: {
		Seed: 14, Groups: 6, SystemTokens: 600, ActiveConversations: 36, Turns: 8, UserTokens: 40, OutputTokens: 16,
		OneShotShare: 0.2, OneShotTokens: 300,
	},
}

func defaultConfig(profile string) config {
	c := config{
		Profile:           "full",
		RunDuration:       15 * time.Second,
		Repetitions:       2,
		RequestTimeout:    20 * time.Second,
		Load:              0.7,
		ServersPerCluster: 2,
		Batch:             2,
		Cost: simulator.CostModel{
			BlockTokens: 16, CacheBlocks: 1024,
			Base: 5 * time.Millisecond, PrefillPerToken: 400 * time.Microsecond, DecodePerToken: 6 * time.Millisecond,
			OutputTokens: 16, StreamChunkTokens: 4,
		},
		RemoteRoundTrip: 20 * time.Millisecond,
		WorkloadName:    workloadLongPrompts,
		Workload:        workloads[workloadLongPrompts],
		Scenarios:       allScenarios,
		Policies:        policyNames(),
		SampleEvery:     100 * time.Millisecond,
		LoopbackBlock:   221,
	}
	if profile == "smoke" {
		c.Profile = "smoke"
		c.RunDuration = 4 * time.Second
		c.Repetitions = 1
		c.RequestTimeout = 10 * time.Second
		c.Scenarios = []string{scenarioSharedPrefix}
	}
	return c
}

// loadConfig reads MCI_BENCH_PROFILE (full or smoke) and the overrides
// MCI_BENCH_ROUTING_DURATION (per run), _REPETITIONS, _WORKLOAD, _SCENARIOS and
// _POLICIES (comma-separated; semicolon-separated when the list holds a
// ";", so that inline configurations such as
// "prefix-cache=3,in-flight=1;RoundRobin" can be compared), and
// MCI_BENCH_ROUTING_OUT.
func loadConfig() (config, error) {
	profile := os.Getenv("MCI_BENCH_PROFILE")
	if profile == "" {
		profile = "full"
	}
	if profile != "full" && profile != "smoke" {
		return config{}, fmt.Errorf("MCI_BENCH_PROFILE=%q: want full or smoke", profile)
	}
	c := defaultConfig(profile)
	var errs []string
	if v := os.Getenv("MCI_BENCH_ROUTING_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > 10*time.Minute {
			errs = append(errs, fmt.Sprintf("MCI_BENCH_ROUTING_DURATION=%q: want a duration from 1s to 10m", v))
		}
		c.RunDuration = d
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_REPETITIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 20 {
			errs = append(errs, fmt.Sprintf("MCI_BENCH_ROUTING_REPETITIONS=%q: want 1 to 20", v))
		}
		c.Repetitions = n
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_WORKLOAD"); v != "" {
		p, ok := workloads[v]
		if !ok {
			errs = append(errs, fmt.Sprintf("MCI_BENCH_ROUTING_WORKLOAD=%q: want %s or %s", v, workloadLongPrompts, workloadShortPrompts))
		}
		c.WorkloadName, c.Workload = v, p
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_SCENARIOS"); v != "" {
		c.Scenarios = splitList(v, ",")
		for _, s := range c.Scenarios {
			if !contains(allScenarios, s) {
				errs = append(errs, fmt.Sprintf("MCI_BENCH_ROUTING_SCENARIOS: unknown scenario %q (want some of %s)", s, strings.Join(allScenarios, ", ")))
			}
		}
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_POLICIES"); v != "" {
		sep := ","
		if strings.Contains(v, ";") {
			sep = ";"
		}
		c.Policies = splitList(v, sep)
	}
	if len(c.Scenarios) == 0 || len(c.Policies) == 0 {
		errs = append(errs, "no scenario or no policy to run")
	}
	c.Out = os.Getenv("MCI_BENCH_ROUTING_OUT")
	if c.Out == "" {
		c.Out = filepath.Join("..", "..", "_output", "bench-routing")
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return c, nil
}

func splitList(v, sep string) []string {
	var out []string
	for s := range strings.SplitSeq(v, sep) {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
