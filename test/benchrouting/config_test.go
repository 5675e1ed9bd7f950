package benchrouting

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mci-dev/mci/test/benchrouting/workload"
	"github.com/mci-dev/mci/test/simulator"
)

// config is one run of the benchmark. MCI_BENCH_PROFILE picks the
// defaults (full: the whole family; smoke: two workloads, seconds per
// policy) and the MCI_BENCH_ROUTING_* variables of loadConfig override
// some of them.
type config struct {
	Profile string `json:"profile"`
	// RunDuration is how long each policy's workload sends requests, per
	// repetition; Repetitions interleave the policies, rotating their
	// order.
	RunDuration time.Duration `json:"runDuration"`
	Repetitions int           `json:"repetitions"`
	// UnseenRepetitions is the repetitions of the workloads of traffic
	// the sidecar does not see, when more than Repetitions: their targets
	// are a few points wide, and two runs a policy spread their routed
	// hit ratio and shares by about as much (four held seven of eight
	// routed hit targets and eight of eight share targets where two held
	// five and three).
	UnseenRepetitions int `json:"unseenRepetitions,omitempty"`
	// Warmup, on each workload before its repetitions, sends the
	// workload once through mci-sidecar (the first sidecar policy, one
	// replica), uncounted: every measured run then meets a sidecar that
	// has seen the workload's groups, as a running sidecar has, whatever
	// the order of the policies.
	Warmup bool `json:"warmup"`
	// RequestTimeout bounds each request; one that runs out counts as an
	// error.
	RequestTimeout time.Duration `json:"requestTimeout"`
	// Cost is every server's cost model; RemoteRoundTrip is added by the
	// servers of the two remote clusters (not by the importing cluster's),
	// FarRoundTrip on top of it by a workload's far cluster.
	Cost            simulator.CostModel `json:"cost"`
	RemoteRoundTrip time.Duration       `json:"remoteRoundTrip"`
	FarRoundTrip    time.Duration       `json:"farRoundTrip"`
	// Workloads are the members of the family that run, in this order
	// (names of family).
	Workloads []string `json:"workloads"`
	// Policies run on every workload; a workload's ExtraPolicies and
	// ReplicaPolicies run after them on that workload only. A policy
	// written "<policy>@<n>" runs the sidecar policy through n
	// mci-sidecar replicas behind a round-robin front.
	Policies []string `json:"policies"`
	// SampleEvery is the period of the load samples.
	SampleEvery time.Duration `json:"sampleEvery"`
	// LoopbackBlock is the third octet of the first cluster's addresses.
	LoopbackBlock int    `json:"loopbackBlock"`
	Out           string `json:"-"`
}

// spec is one workload of the family: the requests, the load, and the
// servers they meet.
type spec struct {
	// Profile is the requests' shape; its rate is calibrated to Load of
	// the servers' capacity without cache hits.
	Profile workload.Profile `json:"profile"`
	Load    float64          `json:"load"`
	// ServersPerCluster simulated model servers, each with Batch batch
	// places, in each of the 3 clusters.
	ServersPerCluster int `json:"serversPerCluster"`
	Batch             int `json:"batch"`
	// Far is a remote cluster whose servers add FarRoundTrip; "" for
	// none. Its share does not count in "between equal clusters".
	Far string `json:"far,omitempty"`
	// Saturate fills every batch place of saturatedCluster from mid-run.
	Saturate bool `json:"saturate,omitempty"`
	// ExtraPolicies run on this workload only (MetricsBased, the policy
	// a saturated cluster's yielding is measured against; ClusterOracle,
	// the cluster-level placement the prefix-aware mci-epp is to beat);
	// ReplicaPolicies too ("PrefixAffinity@3").
	ExtraPolicies   []string `json:"extraPolicies,omitempty"`
	ReplicaPolicies []string `json:"replicaPolicies,omitempty"`
	// Summary says what the workload is, in the report.
	Summary string `json:"summary"`
}

// The policies of the family: the two references (RoundRobin, Oracle),
// the peer reference HubReference (the llm-d hub's documented
// configuration in mci's pipeline: prefix-cache=3,queue=2,kv-cache=2,
// max-score, no margin) and mci's PrefixAffinity.
var familyPolicies = []string{"PrefixAffinity", "HubReference", "RoundRobin", "Oracle"}

// The names of the family's workloads that the harness treats specially.
const (
	workloadNoPrefix  = "no-shared-prefix"
	workloadSaturated = "saturated-cluster"
)

// conversations is a family member's request shape: groups of
// conversations sharing a system prompt, 40-token user messages,
// answers of output tokens, oneShot of the arrivals one-shot requests of
// 300 tokens sharing nothing.
func conversations(seed uint64, groups, system, active, turns, output int, oneShot float64) workload.Profile {
	return workload.Profile{Seed: seed, Groups: groups, SystemTokens: system, ActiveConversations: active, Turns: turns,
		UserTokens: 40, OutputTokens: output, OneShotShare: oneShot, OneShotTokens: 300}
}

// family is the workload family of the routing targets: load 50 to 90% of
// the capacity without cache hits, 4 to 32 groups, system prompts of 500
// to 4,000 tokens, 2 to 8 batch places per server, multi-turn and one-shot
// mixes, a remote cluster 50 ms further away, no shared prefix, and a
// saturated cluster. Each is seeded, so every policy of a run meets the
// same requests and every run the same workloads; they are the shapes of
// pkg/clusterscore's pure-logic simulation (TestAffinityUnderAWorkloadFamily)
// on the 3 clusters of this harness. A server caches 1,024 blocks of 16
// tokens (16,384 tokens).
var family = map[string]spec{
	// shared-prompts: the workload on which PrefixAffinity
	// of old lost to the hub: 8 groups share 2,000-token system prompts
	// (16,000 tokens: about one server's cache, so a cluster that gets
	// every group evicts), long conversations, 2 batch places per server,
	// 70%. The headline.
	"shared-prompts": {
		Profile: conversations(23, 8, 2000, 24, 8, 16, 0.1), Load: 0.7, ServersPerCluster: 2, Batch: 2,
		ExtraPolicies: []string{clusterOraclePolicy}, ReplicaPolicies: []string{"PrefixAffinity@3"},
		Summary: "8 groups, 2,000-token system prompts, multi-turn (8 turns), 10% one-shot, 2 batch places per server, 70%",
	},
	// few-groups-high-load: 4 groups for 3 clusters cannot be dealt
	// evenly: affinity has to spill or unbalance, at 90% of the capacity
	// where unbalance queues. 4,000-token prompts make a miss expensive;
	// 4 batch places per server.
	"few-groups-high-load": {
		Profile: conversations(24, 4, 4000, 16, 6, 16, 0.2), Load: 0.9, ServersPerCluster: 2, Batch: 4,
		Summary: "4 groups, 4,000-token system prompts, multi-turn (6 turns), 20% one-shot, 4 batch places per server, 90%",
	},
	// many-groups-large-batch: 32 groups of short (500-token) prompts,
	// short conversations and 30% one-shot requests at 50%: many keys,
	// little queueing, every cache nearly big enough for all: little for
	// affinity to win, much for it to lose by unbalance. 8 batch places
	// on one server per cluster, with 64-token answers, keep the request
	// rate (about 20 req/s) within what a 2-core machine drives.
	"many-groups-large-batch": {
		Profile: conversations(25, 32, 500, 64, 4, 64, 0.3), Load: 0.5, ServersPerCluster: 1, Batch: 8,
		Summary: "32 groups, 500-token system prompts, short conversations (4 turns), 30% one-shot, 1 server per cluster with 8 batch places, 64-token answers, 50%",
	},
	// one-shot-mix: 16 groups of 4,000-token prompts (64,000 tokens: more
	// than the 6 servers' caches hold together) in single-turn requests,
	// half of the arrivals one-shot requests sharing nothing, at 80%:
	// the regime where only pinning the groups keeps their prompts
	// cached, and where a spill costs a 1.6 s prefill.
	"one-shot-mix": {
		Profile: conversations(26, 16, 4000, 32, 1, 16, 0.5), Load: 0.8, ServersPerCluster: 2, Batch: 2, ExtraPolicies: []string{clusterOraclePolicy},
		Summary: "16 groups, 4,000-token system prompts, single-turn requests, 50% one-shot, 2 batch places per server, 80%",
	},
	// far-remote: the shared-prompts shape with cluster-c 50 ms further away
	// than cluster-a (70 ms round trip against 20): whether a policy
	// pays the far cluster's round trip on every turn of the groups it
	// homes there. 4 batch places per server at 60%.
	"far-remote": {
		Profile: conversations(27, 8, 2000, 24, 8, 16, 0.1), Load: 0.6, ServersPerCluster: 2, Batch: 4, Far: "cluster-c",
		Summary: "8 groups, 2,000-token system prompts, multi-turn (8 turns), 10% one-shot, cluster-c 50 ms further than cluster-a, 4 batch places per server, 60%",
	},
	// no-shared-prefix: 1,000-token requests that share nothing, at 70%:
	// affinity has nothing to win and must place by load as round-robin
	// does (target: within 5% of round-robin).
	workloadNoPrefix: {
		Profile: workload.Profile{Seed: 28, OneShotShare: 1, OneShotTokens: 1000, OutputTokens: 16}, Load: 0.7, ServersPerCluster: 2, Batch: 2,
		Summary: "one-shot requests of 1,000 tokens, no shared prefix, 2 batch places per server, 70%",
	},
	// saturated-cluster: the shared-prompts workload, and from mid-run every
	// batch place of cluster-a taken by its own background requests,
	// which no router sees: how many requests a policy still sends there
	// (target: as few as MetricsBased).
	workloadSaturated: {
		Profile: conversations(23, 8, 2000, 24, 8, 16, 0.1), Load: 0.7, ServersPerCluster: 2, Batch: 2, Saturate: true, ExtraPolicies: []string{"MetricsBased"},
		Summary: "the shared-prompts workload; from mid-run every batch place of cluster-a's servers is taken by its own background requests",
	},
}

// familyOrder runs the workloads that share servers (batch places, round
// trips) one after the other: the servers' Pods change only between them.
var familyOrder = []string{"shared-prompts", workloadNoPrefix, workloadSaturated, "one-shot-mix", "few-groups-high-load", "far-remote", "many-groups-large-batch"}

// serverCost is every simulated server's cost model.
var serverCost = simulator.CostModel{
	BlockTokens: 16, CacheBlocks: 1024,
	Base: 5 * time.Millisecond, PrefillPerToken: 400 * time.Microsecond, DecodePerToken: 6 * time.Millisecond,
	OutputTokens: 16, StreamChunkTokens: 4,
}

func defaultConfig(profile string) config {
	c := config{
		Profile: "full",
		// Two interleaved runs of 18 s per policy keep the 7 workloads'
		// 60 runs, the data path's 4 starts and the ClusterSet's start
		// within about 22 minutes on 2 cores, and the 10 held-out
		// workloads' 80 runs within about 30 more. The trade-off: 60 to
		// 460 requests a run, caches that start cold each run
		// (conversations reach their later turns only in the second half
		// of a run, so the hit ratios are below a long run's steady state
		// for every policy alike), and a p99 that is the 2nd to 9th
		// slowest request of the two runs: differences of a few percent
		// between policies are within the noise.
		// MCI_BENCH_ROUTING_DURATION=60s gives steadier figures in about
		// three hours.
		RunDuration: 18 * time.Second,
		Repetitions: 2,
		// About 27 minutes more for the eight workloads' 64 extra runs.
		UnseenRepetitions: 4,
		Warmup:            true,
		RequestTimeout:    20 * time.Second,
		Cost:              serverCost,
		RemoteRoundTrip:   20 * time.Millisecond,
		FarRoundTrip:      50 * time.Millisecond,
		Policies:          familyPolicies,
		SampleEvery:       100 * time.Millisecond,
		LoopbackBlock:     221,
	}
	if profile != "smoke" {
		// The family, then the held-out workloads, with the workloads of
		// traffic the sidecar does not see among them (withUnseen).
		c.Workloads = withUnseen(append(slices.Clone(familyOrder), heldOutOrder()...))
		return c
	}
	// Two workloads of the family, the case of traffic the sidecar does
	// not see (its two ways in one workload: about 20 s more) and a
	// held-out workload, all on the same servers (no restart), seconds
	// per policy, the replica case included: the shape and sanity of the
	// results and the held-out table, not the targets.
	c.Profile = "smoke"
	c.RunDuration = 4 * time.Second
	c.Repetitions = 1
	c.Warmup = false
	c.RequestTimeout = 10 * time.Second
	c.Workloads = []string{"shared-prompts", workloadNoPrefix, unseenSmoke, smokeHeldOut()}
	return c
}

// loadConfig reads MCI_BENCH_PROFILE (full or smoke) and the overrides
// MCI_BENCH_ROUTING_DURATION (per run), _REPETITIONS, _WARMUP, _WORKLOADS and
// _POLICIES (comma-separated; semicolon-separated when the list holds a
// ";", so that inline configurations such as
// "prefix-cache=3,in-flight=1;RoundRobin" can be compared),
// _LOOPBACK_BLOCK (the first cluster's third octet, so that two runs on
// one machine do not meet), and MCI_BENCH_ROUTING_OUT.
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
		c.Repetitions, c.UnseenRepetitions = n, 0
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_WARMUP"); v != "" {
		w, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("MCI_BENCH_ROUTING_WARMUP=%q: want true or false", v))
		}
		c.Warmup = w
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_WORKLOADS"); v != "" {
		c.Workloads = splitList(v, ",")
		for _, w := range c.Workloads {
			if _, ok := specOf(w); !ok {
				errs = append(errs, fmt.Sprintf("MCI_BENCH_ROUTING_WORKLOADS: unknown workload %q (want some of %s, %s<seed> of the held-out seeds %v or %s<seed> of the tuning seeds %v, or of traffic the sidecar does not see %s, %s<variant>-<seed> of %v or %s<variant>-<seed> of %v)",
					w, strings.Join(familyOrder, ", "), heldOutPrefix, heldOutSeeds, tuningPrefix, tuningSeeds,
					strings.Join(unseenOrder()[:len(unseenVariants)], ", "), heldOutPrefix, unseenHeldOutSeeds, tuningPrefix, unseenTuningSeeds))
			}
		}
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_LOOPBACK_BLOCK"); v != "" {
		n, err := strconv.Atoi(v)
		if last := 255 - len(allClusters) + 1; err != nil || n < 1 || n > last {
			errs = append(errs, fmt.Sprintf("MCI_BENCH_ROUTING_LOOPBACK_BLOCK=%q: want 1 to %d (the %d clusters take it and the next ones)", v, last, len(allClusters)))
		}
		c.LoopbackBlock = n
	}
	if v := os.Getenv("MCI_BENCH_ROUTING_POLICIES"); v != "" {
		sep := ","
		if strings.Contains(v, ";") {
			sep = ";"
		}
		c.Policies = splitList(v, sep)
	}
	for _, p := range c.Policies {
		if _, _, err := parseReplicas(p); err != nil {
			errs = append(errs, "MCI_BENCH_ROUTING_POLICIES: "+err.Error())
		}
	}
	if len(c.Workloads) == 0 || len(c.Policies) == 0 {
		errs = append(errs, "no workload or no policy to run")
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

// policiesOf are the policies that run on workload w: the configured
// ones, then w's extra and replica policies not among them.
// repetitionsOf is the repetitions of the workload of that name.
func (c config) repetitionsOf(name string) int {
	if _, unseen := unseenSpecOf(name); unseen {
		return max(c.Repetitions, c.UnseenRepetitions)
	}
	return c.Repetitions
}

func (c config) policiesOf(w spec) []string {
	out := append([]string{}, c.Policies...)
	for _, p := range append(append([]string{}, w.ExtraPolicies...), w.ReplicaPolicies...) {
		if !contains(out, p) {
			out = append(out, p)
		}
	}
	return out
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
