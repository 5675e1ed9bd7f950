package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sizes are the parameters of one run. MCI_BENCH_PROFILE picks the
// defaults (full, or smoke: tiny sizes, 3 clusters, seconds), and each
// MCI_BENCH_<NAME> variable below overrides one of them.
type sizes struct {
	Profile string `json:"profile"`
	// ConvergenceClusters are the ClusterSet sizes convergence is measured
	// at (MCI_BENCH_CONVERGENCE_CLUSTERS, comma-separated).
	ConvergenceClusters []int `json:"convergenceClusters"`
	// ConvergenceSamples per variant and ClusterSet size.
	ConvergenceSamples int `json:"convergenceSamples"`
	// WriteChanges are the export changes (and readiness flaps) per
	// write-counting window; two windows per system, interleaved.
	WriteChanges int `json:"writeChanges"`
	// ScaleClusters is the ClusterSet size of the LIST, WATCH and memory
	// measurements; PoolsPerCluster are exported by each of its members.
	ScaleClusters   int `json:"scaleClusters"`
	PoolsPerCluster int `json:"poolsPerCluster"`
	ListRounds      int `json:"listRounds"`
	Watchers        int `json:"watchers"`
	WatchChanges    int `json:"watchChanges"`
	// Unrelated Services (each with an EndpointSlice) created in one
	// member, in a namespace without pools and again beside pools.
	Unrelated int `json:"unrelated"`
	// Data path: the open-loop rate per path, how long, and the closed-loop
	// concurrency of the throughput measurement.
	DataPathRate        int           `json:"dataPathRate"`
	DataPathDuration    time.Duration `json:"dataPathDuration"`
	DataPathConcurrency int           `json:"dataPathConcurrency"`
	// Streamed responses: the simulator's paces (a token a chunk), the
	// numbers of concurrent streams, the tokens of a stream and the rounds
	// per path (MCI_BENCH_STREAM_TOKENS, MCI_BENCH_STREAM_ROUNDS).
	StreamTokenPaces  []time.Duration `json:"streamTokenPaces"`
	StreamConcurrency []int           `json:"streamConcurrency"`
	StreamTokens      int             `json:"streamTokens"`
	StreamRounds      int             `json:"streamRounds"`
	// SchedulingTime is how long each scheduling measurement runs.
	SchedulingTime time.Duration `json:"schedulingTime"`
	// RecoveryOutage is how long the EPP stays down before the recovery
	// measurement restarts it: longer than gRPC's default maximum backoff
	// (120 s) in the full profile.
	RecoveryOutage time.Duration `json:"recoveryOutage"`
	// Importers are the readers of one member's summaries connected when
	// its mci-apiserver restarts (the reconnect storm).
	Importers int `json:"importers"`
	// FanoutReaders are the readers of one member's summaries connected
	// while its exports change (the exporter's fan-out): at 1,000
	// clusters one exporting member serves about that many importers, two
	// watches each. The reconnect storm is repeated with them.
	FanoutReaders int `json:"fanoutReaders"`
	// Writers is how many clients create objects in parallel.
	Writers int `json:"writers"`
	// Out is where results.md and results.json go.
	Out string `json:"-"`
}

func defaultSizes(profile string) sizes {
	if profile == "smoke" {
		return sizes{
			Profile:             "smoke",
			ConvergenceClusters: []int{3},
			ConvergenceSamples:  6,
			WriteChanges:        2,
			ScaleClusters:       3,
			PoolsPerCluster:     5,
			ListRounds:          2,
			Watchers:            5,
			WatchChanges:        2,
			Unrelated:           20,
			DataPathRate:        50,
			DataPathDuration:    time.Second,
			DataPathConcurrency: 4,
			StreamTokenPaces:    []time.Duration{20 * time.Millisecond, 100 * time.Millisecond},
			StreamConcurrency:   []int{1, 8},
			StreamTokens:        5,
			StreamRounds:        1,
			SchedulingTime:      20 * time.Millisecond,
			RecoveryOutage:      3 * time.Second,
			Importers:           10,
			FanoutReaders:       20,
			Writers:             8,
		}
	}
	return sizes{
		Profile:             "full",
		ConvergenceClusters: []int{3, 10, 20},
		ConvergenceSamples:  100,
		WriteChanges:        10,
		ScaleClusters:       10,
		PoolsPerCluster:     1000,
		ListRounds:          10,
		Watchers:            500,
		WatchChanges:        10,
		Unrelated:           10000,
		DataPathRate:        200,
		DataPathDuration:    10 * time.Second,
		DataPathConcurrency: 16,
		StreamTokenPaces:    []time.Duration{20 * time.Millisecond, 100 * time.Millisecond},
		StreamConcurrency:   []int{1, 8},
		StreamTokens:        50,
		StreamRounds:        3,
		SchedulingTime:      time.Second,
		RecoveryOutage:      150 * time.Second,
		Importers:           100,
		FanoutReaders:       1000,
		Writers:             24,
	}
}

func loadSizes() (sizes, error) {
	profile := os.Getenv("MCI_BENCH_PROFILE")
	if profile == "" {
		profile = "full"
	}
	if profile != "full" && profile != "smoke" {
		return sizes{}, fmt.Errorf("MCI_BENCH_PROFILE=%q: want full or smoke", profile)
	}
	s := defaultSizes(profile)
	var errs []string
	ints := map[string]*int{
		"CONVERGENCE_SAMPLES":  &s.ConvergenceSamples,
		"WRITE_CHANGES":        &s.WriteChanges,
		"SCALE_CLUSTERS":       &s.ScaleClusters,
		"POOLS_PER_CLUSTER":    &s.PoolsPerCluster,
		"LIST_ROUNDS":          &s.ListRounds,
		"WATCHERS":             &s.Watchers,
		"WATCH_CHANGES":        &s.WatchChanges,
		"UNRELATED":            &s.Unrelated,
		"DATAPATH_RATE":        &s.DataPathRate,
		"DATAPATH_CONCURRENCY": &s.DataPathConcurrency,
		"STREAM_TOKENS":        &s.StreamTokens,
		"STREAM_ROUNDS":        &s.StreamRounds,
		"WRITERS":              &s.Writers,
		"IMPORTERS":            &s.Importers,
		"FANOUT_READERS":       &s.FanoutReaders,
	}
	for name, p := range ints {
		if v := os.Getenv("MCI_BENCH_" + name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				errs = append(errs, fmt.Sprintf("MCI_BENCH_%s=%q is not a count", name, v))
				continue
			}
			*p = n
		}
	}
	durations := map[string]*time.Duration{
		"DATAPATH_DURATION": &s.DataPathDuration,
		"SCHEDULING_TIME":   &s.SchedulingTime,
		"RECOVERY_OUTAGE":   &s.RecoveryOutage,
	}
	for name, p := range durations {
		if v := os.Getenv("MCI_BENCH_" + name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				errs = append(errs, fmt.Sprintf("MCI_BENCH_%s=%q: %v", name, v, err))
				continue
			}
			*p = d
		}
	}
	if v := os.Getenv("MCI_BENCH_CONVERGENCE_CLUSTERS"); v != "" {
		s.ConvergenceClusters = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 {
				errs = append(errs, fmt.Sprintf("MCI_BENCH_CONVERGENCE_CLUSTERS=%q: want sizes of 2 or more", v))
				break
			}
			s.ConvergenceClusters = append(s.ConvergenceClusters, n)
		}
	}
	if s.StreamTokens < 2 || s.StreamRounds < 1 {
		errs = append(errs, "MCI_BENCH_STREAM_TOKENS must be at least 2 and MCI_BENCH_STREAM_ROUNDS at least 1")
	}
	if s.ScaleClusters < 2 {
		errs = append(errs, "MCI_BENCH_SCALE_CLUSTERS must be at least 2")
	}
	s.Out = os.Getenv("MCI_BENCH_OUT")
	if s.Out == "" {
		s.Out = filepath.Join("..", "..", "_output", "bench")
	}
	if len(errs) > 0 {
		return s, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return s, nil
}

// clusterSetSizes are the ClusterSets a run starts, smallest first; each
// is stopped before the next starts.
func (s sizes) clusterSetSizes() []int {
	all := append(slices.Clone(s.ConvergenceClusters), s.ScaleClusters)
	slices.Sort(all)
	return slices.Compact(all)
}
