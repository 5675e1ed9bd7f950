package sidecar

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// decideScaleClusters and decidePromptTokens are BenchmarkDecideAtScale's
// axes: exporting clusters of the one backend, and prompt sizes in tokens
// (about 4 bytes of text each).
var (
	decideScaleClusters = []int{1, 10, 100, 1000}
	decidePromptTokens  = []int{1 << 10, 16 << 10}
)

// groupPromptBody is a completions request of about tokens tokens whose prompt
// opens with the system prompt of group (shared by every request of the
// group, so that they share a home key) and goes on with text of its own.
func groupPromptBody(group, tokens int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "You are assistant %d of a fleet. Answer in full sentences and cite what you read. ", group)
	for i := 0; b.Len() < 4*tokens; i++ {
		fmt.Fprintf(&b, "word%d ", i%997)
	}
	body, _ := json.Marshal(map[string]any{"model": "llm", "prompt": b.String(), "max_tokens": 16})
	return body
}

// positionalState stands in for the running sidecar's state (liveState)
// in the benchmarks of one backend: as liveState keeps a backend's
// references to the prober's and the scraper's findings in its clusters'
// order, it reads them by position, not by name, which a map of names
// would make a sixth of a pick over 1,000 clusters.
type positionalState struct {
	clusters []*routetable.Cluster
	health   []Health
	metrics  []*PoolMetrics
}

func (s *positionalState) Read(clusters []*routetable.Cluster, at []int, cands []clusterscore.Candidate, pools bool) {
	if len(clusters) != len(s.clusters) || &clusters[0] != &s.clusters[0] {
		panic("positionalState read for clusters of another backend")
	}
	for k := range cands {
		i := placeOf(at, k)
		cands[k].Health = s.health[i]
		if pools {
			cands[k].Pool = s.metrics[i]
		}
	}
}

// scaleTable is a table of one route to import llm exported by n
// clusters (each with fresh pool metrics and a serving EPP), published
// (its policy compiled) with the memory mem, and the state the policies
// read.
func scaleTable(b testing.TB, policy string, n int, now time.Time, mem *clusterscore.Memory) (*routetable.Table, *positionalState) {
	b.Helper()
	clusters := make([]sidecartest.Imported, n)
	for i := range clusters {
		clusters[i] = sidecartest.Imported{Name: fmt.Sprintf("cluster-%04d", i), Addr: fmt.Sprintf("127.%d.%d.%d", 1+i>>16, (i>>8)&255, i&255)}
	}
	route := sidecartest.Annotate(sidecartest.Route("r", 0, []string{"llm.model.com"}, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/v1")}, sidecartest.ImportRef("llm", nil))),
		routetable.PolicyAnnotation, policy)
	r := routetable.NewRouter()
	require.NoError(b, r.SetScoring(routetable.Scoring{Thresholds: scheduling.DefaultConfig(), Memory: mem}))
	tbl, errs := publishTable(r, routetable.Inputs{Routes: []*gatewayv1.HTTPRoute{route}, Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", clusters...)}})
	require.Empty(b, errs)
	require.Len(b, tbl.Rules()[0].Backends[0].Clusters, n)
	st := &positionalState{health: make([]Health, n), metrics: make([]*PoolMetrics, n)}
	st.clusters, _ = tbl.Rules()[0].Backends[0].Candidates()
	for i, c := range st.clusters {
		require.Equal(b, fmt.Sprintf("cluster-%04d", i), c.Name)
		st.health[i] = HealthServing
		st.metrics[i] = &PoolMetrics{AverageQueue: float64(i % 3), AverageKVCache: 0.2, ReadyPods: 4, UpdatedAt: now}
	}
	return tbl, st
}

// withReports gives each of the n clusters of st a prefix summary holding
// the prompts of the benchmark's groups it is dealt (group g to cluster g
// mod n), as their EPPs would report after routing them.
func withReports(b *testing.B, st *positionalState, n int) {
	summaries := make([]*promptprefix.Summary, n)
	for i := range summaries {
		summaries[i] = promptprefix.NewSummary(64 * 64 / n)
	}
	for g := range 64 {
		blocks, err := promptprefix.Blocks(nil, promptprefix.ScopeOfModel("llm"), groupPromptBody(g, 256))
		require.NoError(b, err)
		for _, bl := range blocks {
			summaries[g%n].Add(bl)
		}
	}
	for i, s := range summaries {
		m := *st.metrics[i]
		m.Prefixes = s
		st.metrics[i] = &m
	}
}

// observeEach gives the memory an exchange with each cluster of the
// table's one backend, as the running sidecar has once it has sent a
// request to each: a pick reads an observation of every candidate.
func observeEach(tbl *routetable.Table, mem *clusterscore.Memory, now time.Time) {
	b := tbl.Rules()[0].Backends[0]
	for i, c := range b.Clusters {
		mem.Observed.Started(b.Scope(), c.Name, now)
		mem.Observed.FirstByte(b.Scope(), c.Name, time.Duration(40+i%20)*time.Millisecond)
		mem.Observed.Finished(b.Scope(), c.Name, false)
	}
}

// BenchmarkDecideAtScale is the sidecar's whole routing decision (decide:
// the route's match, the backendRef, the policy's filters, scorers, home
// placement and picker, and FailOpen's fallback) for one backend exported
// by 1 to 1,000 clusters, for prompts of 1k and 16k tokens. The memory is
// warm: 64 groups of prompts, the request's among them, have been served
// twice each, so their home keys are established, and each cluster has
// answered one request (observeEach). Besides ns/op it
// reports the p50 and p99 of the per-call latency (µs).
//
// With reports, PrefixAffinity's clusters also carry their EPPs' prefix
// summaries (withReports): what the decision costs when every exporting
// cluster publishes one.
func BenchmarkDecideAtScale(b *testing.B) {
	now := sidecartest.Epoch
	for _, policy := range []string{routingpolicy.PrefixAffinity, routingpolicy.PrefixAffinity + "/reports", routingpolicy.HealthBased} {
		policy, reports := strings.CutSuffix(policy, "/reports")
		for _, n := range decideScaleClusters {
			for _, tokens := range decidePromptTokens {
				name := fmt.Sprintf("policy=%s/clusters=%d/prompt=%dk", policy, n, tokens>>10)
				if reports {
					name += "/reports"
				}
				b.Run(name, func(b *testing.B) {
					mem := clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())
					tbl, st := scaleTable(b, policy, n, now, mem)
					if reports {
						withReports(b, st, n)
					}
					observeEach(tbl, mem, now)
					dc := decider{state: st}
					decideOnce := func(body []byte) decision {
						d := dc.decide(tbl, request("llm.model.com", "/v1/completions", body), routetable.Arrival{Main: true}, now, false)
						if d.answers() || len(d.order) == 0 || d.promptErr != nil {
							b.Fatalf("decided %s %q: %v", d.outcome, d.details, d.promptErr)
						}
						return d
					}
					for range 2 {
						for g := range 64 {
							d := decideOnce(groupPromptBody(g, 256))
							mem.Served(&d.req, d.order[0].Name)
						}
					}
					req := request("llm.model.com", "/v1/completions", groupPromptBody(7, tokens))
					lat := make([]time.Duration, 0, 1<<16)
					b.ReportAllocs()
					b.ResetTimer()
					cpu := cpuTime()
					for b.Loop() {
						start := time.Now()
						d := dc.decide(tbl, req, routetable.Arrival{Main: true}, now, false)
						lat = append(lat, time.Since(start))
						if len(d.order) == 0 {
							b.Fatal("no cluster decided")
						}
					}
					b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Microsecond)/float64(len(lat)), "cpu-µs/op")
					reportLatency(b, lat)
				})
			}
		}
	}
}

// cpuTime is the CPU time the process has used (user and system, every
// thread, the garbage collector's included): on a shared machine, a
// figure that other processes' load does not inflate as it does the
// latencies.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportLatency reports the p50 and p99 of per-call latencies in µs.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(lat[len(lat)/2]), "p50-µs")
	b.ReportMetric(us(lat[len(lat)*99/100]), "p99-µs")
}
