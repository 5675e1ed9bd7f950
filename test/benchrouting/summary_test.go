package benchrouting

import (
	"fmt"
	"slices"
	"strings"
)

// The references the targets compare with.
const (
	hubPolicy     = "HubReference"
	oraclePolicy  = "Oracle"
	rrPolicy      = "RoundRobin"
	metricsPolicy = "MetricsBased"
	// clusterOraclePolicy is the Oracle over EPPs whose prefix filter is
	// off: placement by prefix at the cluster level only (the targets'
	// reference for the prefix-aware mci-epp).
	clusterOraclePolicy = "ClusterOracle"
)

// goal is one of the routing targets, checked on one workload: applies
// says whether it is checked there (its references ran, the workload is
// of its kind); v whether the policy meets it, and detail the figures
// compared.
type goal struct {
	name  string
	check func(w *workloadResult, policy string, pr *policyResult) (applies bool, v verdict, detail string)
}

// goals are the routing targets, in the summary's order: the family's,
// then those of traffic the sidecar does not see (unseen_test.go).
var goals = append([]goal{
	{"hit ratio >= hub's", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		hub := w.Policies[hubPolicy]
		if hub == nil || w.Spec.Profile.OneShotShare >= 1 {
			return false, missed, ""
		}
		return true, judge(hit(pr), hit(hub), atLeast(1)), hit(pr).text("%.3f") + " against " + hit(hub).text("%.3f")
	}},
	{"hit ratio >= 0.95 of the oracle's", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		o := w.Policies[oraclePolicy]
		if o == nil || w.Spec.Profile.OneShotShare >= 1 {
			return false, missed, ""
		}
		return true, judge(hit(pr), hit(o), atLeast(0.95)), hit(pr).text("%.3f") + " against 0.95 x " + hit(o).text("%.3f")
	}},
	{"TTFT p50 <= hub's", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		hub := w.Policies[hubPolicy]
		if hub == nil {
			return false, missed, ""
		}
		return true, judge(p50(pr), p50(hub), atMost(1)), p50(pr).text("%.0f ms") + " against " + p50(hub).text("%.0f ms")
	}},
	{"TTFT p99 <= hub's", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		hub := w.Policies[hubPolicy]
		if hub == nil {
			return false, missed, ""
		}
		return true, judge(p99(pr), p99(hub), atMost(1)), p99(pr).text("%.0f ms") + " against " + p99(hub).text("%.0f ms")
	}},
	{"max share <= 55%", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		s := maxShare(pr, w.Spec)
		v := missed
		if s <= 0.55 {
			v = met
		}
		return true, v, fmt.Sprintf("%.2f", s)
	}},
	{"no shared prefix: TTFT within 5% of round-robin's", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		rr := w.Policies[rrPolicy]
		if rr == nil || w.Spec.Profile.OneShotShare < 1 {
			return false, missed, ""
		}
		v := max(judge(p50(pr), p50(rr), atMost(1.05)), judge(p99(pr), p99(rr), atMost(1.05)))
		return true, v, "p50 " + p50(pr).text("%.0f ms") + " against " + p50(rr).text("%.0f ms") + ", p99 " + p99(pr).text("%.0f ms") + " against " + p99(rr).text("%.0f ms")
	}},
	{"saturated cluster: yields as fast as MetricsBased", func(w *workloadResult, _ string, pr *policyResult) (bool, verdict, string) {
		mb := w.Policies[metricsPolicy]
		if mb == nil || !w.Spec.Saturate {
			return false, missed, ""
		}
		return true, judge(sentAfter(pr), sentAfter(mb), atMost(1)),
			sentAfter(pr).text("%.1f") + " requests per run sent there after it filled, against " + sentAfter(mb).text("%.1f")
	}},
	{"replicas: hit ratio >= 0.95 of one replica's", func(w *workloadResult, policy string, pr *policyResult) (bool, verdict, string) {
		name, n, err := parseReplicas(policy)
		one := w.Policies[name]
		if err != nil || n < 2 || one == nil {
			return false, missed, ""
		}
		return true, judge(hit(pr), hit(one), atLeast(0.95)), hit(pr).text("%.3f") + " against 0.95 x " + hit(one).text("%.3f")
	}},
	{"hit ratio > the cluster-level oracle's", func(w *workloadResult, policy string, pr *policyResult) (bool, verdict, string) {
		co := w.Policies[clusterOraclePolicy]
		if co == nil || policy == clusterOraclePolicy {
			return false, missed, ""
		}
		return true, judge(hit(pr), hit(co), above), hit(pr).text("%.3f") + " against " + hit(co).text("%.3f")
	}},
}, unseenGoals...)

// verdict is how a target fares on one workload, judged against the
// spread of the repetitions measured in the same run (docs/performance.md,
// "Routing quality").
type verdict int

const (
	// met: the figures of all repetitions together meet the target.
	met verdict = iota
	// withinSpread: they do not, but some repetition of the policy meets
	// it against some repetition of the reference: the difference is
	// within what the repetitions of the same run spread over, so the run
	// does not tell. Not counted as met.
	withinSpread
	// missed: no repetition of the policy meets it against any of the
	// reference's (or, with one repetition, the figures do not).
	missed
)

// figure is one compared figure of a policy: over all its repetitions,
// and of each alone (none with a single repetition).
type figure struct {
	pooled float64
	reps   []float64
}

func figureOf(pr *policyResult, pooled float64, rep func(repetition) float64) figure {
	f := figure{pooled: pooled}
	for _, r := range pr.Repetitions {
		f.reps = append(f.reps, rep(r))
	}
	return f
}

func hit(pr *policyResult) figure {
	return figureOf(pr, pr.PrefixHit, func(r repetition) float64 { return r.PrefixHit })
}

func p50(pr *policyResult) figure {
	return figureOf(pr, pr.TTFTP50, func(r repetition) float64 { return r.TTFTP50 })
}

func p99(pr *policyResult) figure {
	return figureOf(pr, pr.TTFTP99, func(r repetition) float64 { return r.TTFTP99 })
}

func sentAfter(pr *policyResult) figure {
	return figureOf(pr, pr.AfterSaturation, func(r repetition) float64 { return r.AfterSaturation })
}

// text is the pooled figure, with the repetitions' range when there are
// several: "884 ms (860-902 ms)".
func (f figure) text(format string) string {
	s := fmt.Sprintf(format, f.pooled)
	if len(f.reps) > 1 {
		s += fmt.Sprintf(" ("+format+"-"+format+")", slices.Min(f.reps), slices.Max(f.reps))
	}
	return s
}

// A comparison says whether a policy's figure a meets the target against
// the reference's figure b.
type comparison func(a, b float64) bool

// atLeast: a >= k * b (hit ratios); atMost: a <= k * b (latencies,
// counts); above: a > b.
func atLeast(k float64) comparison { return func(a, b float64) bool { return a >= k*b } }
func atMost(k float64) comparison  { return func(a, b float64) bool { return a <= k*b } }
func above(a, b float64) bool      { return a > b }

// judge is the rule of docs/performance.md: met on the pooled figures;
// else within the spread when any repetition of a meets the target
// against any repetition of b (the repetitions' ranges overlap); else
// missed.
func judge(a, b figure, ok comparison) verdict {
	if ok(a.pooled, b.pooled) {
		return met
	}
	for _, x := range a.reps {
		for _, y := range b.reps {
			if ok(x, y) {
				return withinSpread
			}
		}
	}
	return missed
}

// maxShare is the largest share of the requests that one of the equal
// clusters served: every cluster but w's far one (the three have the same
// servers; the importing one saves the remote round trip, which no policy
// is asked to ignore or to prefer).
func maxShare(pr *policyResult, w spec) float64 {
	m := 0.0
	for _, c := range clusterNames {
		if c != w.Far {
			m = max(m, pr.ClusterShare[c])
		}
	}
	return m
}

// targetSummary is one target for one policy over the family: the
// workloads where it was checked and met, and those where it was missed
// with the figures.
type targetSummary struct {
	Target       string   `json:"target"`
	Met          []string `json:"met"`
	WithinSpread []string `json:"within_spread"`
	Missed       []string `json:"missed"`
}

// policySummary is one policy over the family.
type policySummary struct {
	Policy  string          `json:"policy"`
	Targets []targetSummary `json:"targets"`
}

// summarizeFamily checks every policy of every workload against the
// targets.
func summarizeFamily(r *results) []policySummary {
	var order []string
	for _, name := range r.Config.Workloads {
		if w := r.Workloads[name]; w != nil {
			for _, p := range r.Config.policiesOf(w.Spec) {
				if !contains(order, p) {
					order = append(order, p)
				}
			}
		}
	}
	var out []policySummary
	for _, p := range order {
		ps := policySummary{Policy: p}
		for _, t := range goals {
			ts := targetSummary{Target: t.name, Met: []string{}, WithinSpread: []string{}, Missed: []string{}}
			for _, name := range r.Config.Workloads {
				w := r.Workloads[name]
				if w == nil || w.Policies[p] == nil {
					continue
				}
				applies, v, detail := t.check(w, p, w.Policies[p])
				switch {
				case !applies:
				case v == met:
					ts.Met = append(ts.Met, name)
				case v == withinSpread:
					ts.WithinSpread = append(ts.WithinSpread, name+" ("+detail+")")
				default:
					ts.Missed = append(ts.Missed, name+" ("+detail+")")
				}
			}
			ps.Targets = append(ps.Targets, ts)
		}
		out = append(out, ps)
	}
	return out
}

// summaryMarkdown is the summary table: per policy and target, on how
// many of the workloads where the target applies the policy meets it, and
// on how many the run does not tell (within the repetitions' spread);
// then the misses and those with their figures.
func summaryMarkdown(sum []policySummary) string {
	if len(sum) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("Summary over the family: workloads where each routing target is met, of those where it applies;" +
		" \"+n ~\" counts those where it is not met but within the spread of the repetitions (not counted as met).\n\n| routing |")
	for _, t := range goals {
		b.WriteString(" " + t.name + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(goals)) + "\n")
	var misses, ties []string
	for _, ps := range sum {
		fmt.Fprintf(&b, "| `%s` |", ps.Policy)
		for _, ts := range ps.Targets {
			n := len(ts.Met) + len(ts.WithinSpread) + len(ts.Missed)
			switch {
			case n == 0:
				b.WriteString(" — |")
				continue
			case len(ts.WithinSpread) > 0:
				fmt.Fprintf(&b, " %d / %d, +%d ~ |", len(ts.Met), n, len(ts.WithinSpread))
			default:
				fmt.Fprintf(&b, " %d / %d |", len(ts.Met), n)
			}
			if len(ts.Missed) > 0 {
				misses = append(misses, fmt.Sprintf("- `%s`, %s: missed on %s", ps.Policy, ts.Target, strings.Join(ts.Missed, "; ")))
			}
			if len(ts.WithinSpread) > 0 {
				ties = append(ties, fmt.Sprintf("- `%s`, %s: within the spread on %s", ps.Policy, ts.Target, strings.Join(ts.WithinSpread, "; ")))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	if len(misses) > 0 {
		b.WriteString("Misses (every repetition worse than every repetition of the reference, or one repetition):\n\n" + strings.Join(misses, "\n") + "\n\n")
	}
	if len(ties) > 0 {
		b.WriteString("Not met, within the spread of the repetitions (pooled figure, then the repetitions' range):\n\n" + strings.Join(ties, "\n") + "\n\n")
	}
	return b.String()
}
