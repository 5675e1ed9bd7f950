package benchrouting

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mci-dev/mci/test/quantile"
)

// policyResult is what results.json reports of one policy in one
// scenario. The first six keys are the targets'.
type policyResult struct {
	TTFTP50      float64            `json:"ttft_p50_ms"`
	TTFTP99      float64            `json:"ttft_p99_ms"`
	E2EP99       float64            `json:"e2e_p99_ms"`
	Throughput   float64            `json:"throughput_rps"`
	PrefixHit    float64            `json:"prefix_hit_ratio"`
	ShedRatio    float64            `json:"shed_ratio"`
	ErrorRatio   float64            `json:"error_ratio"`
	Sent         int                `json:"requests"`
	Completed    int                `json:"completed"`
	HerdingRatio float64            `json:"herding_ratio"`
	Samples      int                `json:"load_samples"`
	ClusterShare map[string]float64 `json:"cluster_share"`
	ClusterBusy  map[string]float64 `json:"cluster_mean_busy"`
	ClusterQueue map[string]float64 `json:"cluster_mean_waiting"`
	ClusterPeakQ map[string]int     `json:"cluster_peak_waiting"`
	// RequestHitRatio is the same ratio from the requests' usage
	// (cached_tokens / prompt_tokens of the completed requests): a check
	// of PrefixHit, which the simulators' counters give.
	RequestHitRatio float64 `json:"request_hit_ratio"`
	// AfterSaturation is, per run, how many requests the routing sent to
	// the saturated cluster after it filled (saturated-cluster scenario;
	// 0 elsewhere): each waits there until the run's background requests
	// end, seconds later, so a few of them make the scenario's p99.
	AfterSaturation float64 `json:"sent_after_saturation_per_run"`
	// HomeDecisions are, per run, the requests of a routing with homes by
	// the lead decision of home placement
	// (mci_sidecar_prefix_home_requests_total's results, homeResults);
	// absent for routings without homes.
	HomeDecisions map[string]float64 `json:"home_decisions_per_run,omitempty"`
	// SummaryKiBPerSecond is what the exporting clusters' prefix
	// summaries cost, per pool (EPP) and second of the runs, and
	// SummaryLargestKiB the largest summary built.
	SummaryKiBPerSecond float64 `json:"prefix_summary_kib_per_second_per_pool"`
	SummaryLargestKiB   float64 `json:"prefix_summary_largest_kib"`
	// Repetitions are the figures the targets compare, of each
	// repetition alone (when there are several): the spread a target is
	// judged against (summary_test.go).
	Repetitions []repetition `json:"repetitions,omitempty"`
	// Routed are the figures of the requests the routing decided, when
	// some were sent past it (to the exporters' own gateways).
	Routed *routedFigures `json:"routed,omitempty"`
}

// repetition is one repetition's figures of a policy.
type repetition struct {
	TTFTP50         float64 `json:"ttft_p50_ms"`
	TTFTP99         float64 `json:"ttft_p99_ms"`
	PrefixHit       float64 `json:"prefix_hit_ratio"`
	AfterSaturation float64 `json:"sent_after_saturation"`
	RoutedHit       float64 `json:"routed_prefix_hit_ratio,omitempty"`
}

// workloadResult is one workload of the family: its spec, rate, and each
// policy's result.
type workloadResult struct {
	Spec        spec                     `json:"spec"`
	RateRPS     float64                  `json:"rate_rps"`
	CapacityRPS float64                  `json:"capacity_rps"`
	Requests    int                      `json:"requests_per_run"`
	Policies    map[string]*policyResult `json:"policies"`
}

// results is results.json: every workload's results, and the summary of
// the family against its targets.
type results struct {
	Profile string    `json:"profile"`
	Started time.Time `json:"started"`
	Elapsed string    `json:"elapsed"`
	// LoadAverage is /proc/loadavg at the start and at the end: a run on
	// a busy machine is noisy, and says so.
	LoadAverage [2]string                  `json:"load_average"`
	Config      config                     `json:"config"`
	Workloads   map[string]*workloadResult `json:"workloads"`
	Summary     []policySummary            `json:"summary"`
	// HeldOut is the held-out workloads against the hub configuration
	// and the oracle, and the worst of them; nil when none ran with
	// those three policies.
	HeldOut *heldOutSummary `json:"held_out,omitempty"`
	// RegionFilter is the locality filter's check after the workloads;
	// nil when the run stopped before it.
	RegionFilter *regionResult `json:"region_filter,omitempty"`
	Failed       bool          `json:"failed"`
}

// summarize computes a policy's result from its runs (its repetitions).
func summarize(runs []*runResult) *policyResult {
	r := &policyResult{ClusterShare: map[string]float64{}, ClusterBusy: map[string]float64{},
		ClusterQueue: map[string]float64{}, ClusterPeakQ: map[string]int{}}
	var ttft, e2e []time.Duration
	var active time.Duration
	var hits, queries uint64
	var shed, failed, served, cachedTokens, promptTokens, afterSaturation int
	var samples []loadSample
	for _, run := range runs {
		active += run.active
		hits += run.hitTokens
		queries += run.queryTokens
		samples = append(samples, run.samples...)
		for _, o := range run.outcomes {
			r.Sent++
			if o.afterSaturation {
				afterSaturation++
			}
			switch {
			case o.code == http.StatusTooManyRequests:
				shed++
				continue
			case o.code != http.StatusOK || !o.complete || o.ttft == 0:
				failed++
				continue
			}
			r.Completed++
			ttft = append(ttft, o.ttft)
			e2e = append(e2e, o.e2e)
			cachedTokens += o.cachedTokens
			promptTokens += o.promptTokens
			if o.cluster != "" {
				served++
				r.ClusterShare[o.cluster]++
			}
		}
	}
	r.TTFTP50, r.TTFTP99 = ms(quantile.Nearest(ttft, 50)), ms(quantile.Nearest(ttft, 99))
	r.E2EP99 = ms(quantile.Nearest(e2e, 99))
	if active > 0 {
		r.Throughput = round(float64(r.Completed)/active.Seconds(), 2)
	}
	r.PrefixHit = ratio(int(hits), int(queries))
	r.RequestHitRatio = ratio(cachedTokens, promptTokens)
	r.ShedRatio = ratio(shed, r.Sent)
	r.ErrorRatio = ratio(failed, r.Sent)
	for c := range r.ClusterShare {
		r.ClusterShare[c] = ratio(int(r.ClusterShare[c]), served)
	}
	r.HerdingRatio, r.Samples = herding(samples), len(samples)
	if len(runs) > 0 {
		r.AfterSaturation = round(float64(afterSaturation)/float64(len(runs)), 1)
	}
	r.HomeDecisions = homeDecisionsPerRun(runs)
	r.SummaryKiBPerSecond, r.SummaryLargestKiB = summaryCost(runs)
	r.Repetitions = repetitions(runs)
	r.Routed = routedOf(runs)
	for _, c := range clusterNames {
		var busy, waiting float64
		for _, s := range samples {
			busy += float64(s.running[c])
			waiting += float64(s.waiting[c])
			r.ClusterPeakQ[c] = max(r.ClusterPeakQ[c], s.waiting[c])
		}
		if len(samples) > 0 {
			r.ClusterBusy[c] = round(busy/float64(len(samples)), 2)
			r.ClusterQueue[c] = round(waiting/float64(len(samples)), 2)
		}
	}
	return r
}

// repetitions are the compared figures of each run alone; none for a
// single run, whose figures are the pooled ones.
func repetitions(runs []*runResult) []repetition {
	if len(runs) < 2 {
		return nil
	}
	out := make([]repetition, 0, len(runs))
	for _, run := range runs {
		one := summarize([]*runResult{run})
		rep := repetition{TTFTP50: one.TTFTP50, TTFTP99: one.TTFTP99, PrefixHit: one.PrefixHit, AfterSaturation: one.AfterSaturation}
		if one.Routed != nil {
			rep.RoutedHit = one.Routed.PrefixHit
		}
		out = append(out, rep)
	}
	return out
}

// herding is the share of samples in which one cluster sits idle (nothing
// running or waiting) while another queues (something waiting).
func herding(samples []loadSample) float64 {
	n := 0
	for _, s := range samples {
		idle, queues := false, false
		for _, c := range clusterNames {
			idle = idle || s.running[c]+s.waiting[c] == 0
			queues = queues || s.waiting[c] > 0
		}
		if idle && queues {
			n++
		}
	}
	return ratio(n, len(samples))
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 1) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return round(float64(a)/float64(b), 3)
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// loadAverage is the first three fields of /proc/loadavg, or why not.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// write writes results.json and results.md into dir.
func (r *results) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	md := r.markdown()
	fmt.Print(md)
	return os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644)
}

// markdown is the tables of the routing quality results (the runs kept in
// docs/performance-history/routing-quality-*.md): the summary, then each
// workload's.
func (r *results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Routing quality, the workload family: run %s, profile %s, %s in all, %s per policy and repetition, %d repetitions interleaved (%d of traffic the sidecar does not see); load average %s at the start and %s at the end.\n\n",
		r.Started.Format(time.RFC3339), r.Profile, r.Elapsed, r.Config.RunDuration, r.Config.Repetitions, r.Config.repetitionsOf(unseenOrder()[0]), r.LoadAverage[0], r.LoadAverage[1])
	b.WriteString(summaryMarkdown(r.Summary))
	b.WriteString(r.HeldOut.markdown())
	for _, name := range r.Config.Workloads {
		w := r.Workloads[name]
		if w == nil {
			continue
		}
		fmt.Fprintf(&b, "**%s** — %s; %.1f req/s offered (%.0f%% of %.1f req/s capacity without cache hits), %d requests per run.\n\n",
			name, w.Spec.Summary, w.RateRPS, 100*w.RateRPS/max(w.CapacityRPS, 1e-9), w.CapacityRPS, w.Requests)
		b.WriteString(workloadTable(r.Config.policiesOf(w.Spec), w))
		b.WriteString(unseenTable(r.Config.policiesOf(w.Spec), w))
	}
	return b.String()
}

// summaryCost is the prefix summaries' bytes per pool and second over
// the runs, and the largest summary, in KiB.
func summaryCost(runs []*runResult) (perSecond, largest float64) {
	var bytes, poolSeconds float64
	for _, run := range runs {
		bytes += run.summaryBytes
		poolSeconds += float64(run.summaryPools) * run.active.Seconds()
		largest = max(largest, run.summaryLargest)
	}
	if poolSeconds > 0 {
		perSecond = round(bytes/1024/poolSeconds, 2)
	}
	return perSecond, round(largest/1024, 1)
}

// homeDecisionsPerRun averages the runs' home decisions; nil when no
// request had a home.
func homeDecisionsPerRun(runs []*runResult) map[string]float64 {
	sum, total := map[string]float64{}, 0.0
	for _, run := range runs {
		for k, v := range run.homes {
			sum[k] += v
			total += v
		}
	}
	if total == 0 {
		return nil
	}
	for k := range sum {
		sum[k] = round(sum[k]/float64(len(runs)), 1)
	}
	return sum
}

// workloadTable is one workload's table: the hit ratio from the
// simulators' own counters, TTFT, the largest share of requests one of the
// equal clusters took, errors.
func workloadTable(policies []string, w *workloadResult) string {
	var b strings.Builder
	b.WriteString("| routing | prefix-cache hit ratio | TTFT p50 | TTFT p99 | max share (equal clusters) | errors | shed | requests a / b (local) / c | completed req/s | e2e p99 | home decisions per run: " + strings.Join(homeResults, " / ") + " |")
	if w.Spec.Saturate {
		fmt.Fprintf(&b, " sent to %s after it filled, per run |", saturatedCluster)
	}
	b.WriteString("\n|---|---|---|---|---|---|---|---|---|---|---|")
	if w.Spec.Saturate {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, p := range policies {
		pr := w.Policies[p]
		if pr == nil {
			continue
		}
		fmt.Fprintf(&b, "| `%s` | %.3f | %.0f ms | %.0f ms | %.2f | %.3f | %.3f | %.2f / %.2f / %.2f | %.1f | %.0f ms |",
			p, pr.PrefixHit, pr.TTFTP50, pr.TTFTP99, maxShare(pr, w.Spec), pr.ErrorRatio, pr.ShedRatio,
			pr.ClusterShare["cluster-a"], pr.ClusterShare["cluster-b"], pr.ClusterShare["cluster-c"], pr.Throughput, pr.E2EP99)
		if h := pr.HomeDecisions; h != nil {
			for i, result := range homeResults {
				if i > 0 {
					b.WriteString(" /")
				}
				fmt.Fprintf(&b, " %.1f", h[result])
			}
			b.WriteString(" |")
		} else {
			b.WriteString(" — |")
		}
		if w.Spec.Saturate {
			fmt.Fprintf(&b, " %.1f |", pr.AfterSaturation)
		}
		b.WriteString("\n")
	}
	for _, p := range policies {
		if pr := w.Policies[p]; pr != nil && pr.HomeDecisions != nil {
			fmt.Fprintf(&b, "Prefix summaries under `%s`: %.2f KiB/s per pool, the largest %.1f KiB.\n\n", p, pr.SummaryKiBPerSecond, pr.SummaryLargestKiB)
		}
	}
	b.WriteString("\n")
	return b.String()
}
