package benchrouting

import (
	"fmt"
	"strings"
)

// The references the targets compare with.
const (
	hubPolicy     = "HubReference"
	oraclePolicy  = "Oracle"
	rrPolicy      = "RoundRobin"
	metricsPolicy = "MetricsBased"
)

// goal is one of issue 23's targets, checked on one workload: applies
// says whether it is checked there (its references ran, the workload is
// of its kind); met whether the policy meets it, and detail the figures
// compared.
type goal struct {
	name  string
	check func(w *workloadResult, policy string, pr *policyResult) (applies, met bool, detail string)
}

// goals are issue 23's targets, in the summary's order.
var goals = []goal{
	{"hit ratio >= hub's", func(w *workloadResult, _ string, pr *policyResult) (bool, bool, string) {
		hub := w.Policies[hubPolicy]
		if hub == nil || w.Spec.Profile.OneShotShare >= 1 {
			return false, false, ""
		}
		return true, pr.PrefixHit >= hub.PrefixHit, fmt.Sprintf("%.3f against %.3f", pr.PrefixHit, hub.PrefixHit)
	}},
	{"hit ratio >= 0.95 of the oracle's", func(w *workloadResult, _ string, pr *policyResult) (bool, bool, string) {
		o := w.Policies[oraclePolicy]
		if o == nil || w.Spec.Profile.OneShotShare >= 1 {
			return false, false, ""
		}
		return true, pr.PrefixHit >= 0.95*o.PrefixHit, fmt.Sprintf("%.3f against 0.95 x %.3f", pr.PrefixHit, o.PrefixHit)
	}},
	{"TTFT p50 <= hub's", func(w *workloadResult, _ string, pr *policyResult) (bool, bool, string) {
		hub := w.Policies[hubPolicy]
		if hub == nil {
			return false, false, ""
		}
		return true, pr.TTFTP50 <= hub.TTFTP50, fmt.Sprintf("%.0f ms against %.0f ms", pr.TTFTP50, hub.TTFTP50)
	}},
	{"TTFT p99 <= hub's", func(w *workloadResult, _ string, pr *policyResult) (bool, bool, string) {
		hub := w.Policies[hubPolicy]
		if hub == nil {
			return false, false, ""
		}
		return true, pr.TTFTP99 <= hub.TTFTP99, fmt.Sprintf("%.0f ms against %.0f ms", pr.TTFTP99, hub.TTFTP99)
	}},
	{"max share <= 55%", func(w *workloadResult, _ string, pr *policyResult) (bool, bool, string) {
		s := maxShare(pr, w.Spec)
		return true, s <= 0.55, fmt.Sprintf("%.2f", s)
	}},
	{"no shared prefix: TTFT within 5% of round-robin's", func(w *workloadResult, _ string, pr *policyResult) (bool, bool, string) {
		rr := w.Policies[rrPolicy]
		if rr == nil || w.Spec.Profile.OneShotShare < 1 {
			return false, false, ""
		}
		return true, pr.TTFTP50 <= 1.05*rr.TTFTP50 && pr.TTFTP99 <= 1.05*rr.TTFTP99,
			fmt.Sprintf("p50 %.0f / p99 %.0f ms against %.0f / %.0f ms", pr.TTFTP50, pr.TTFTP99, rr.TTFTP50, rr.TTFTP99)
	}},
	{"saturated cluster: yields as fast as MetricsBased", func(w *workloadResult, _ string, pr *policyResult) (bool, bool, string) {
		mb := w.Policies[metricsPolicy]
		if mb == nil || !w.Spec.Saturate {
			return false, false, ""
		}
		return true, pr.AfterSaturation <= mb.AfterSaturation,
			fmt.Sprintf("%.1f requests per run sent there after it filled, against %.1f", pr.AfterSaturation, mb.AfterSaturation)
	}},
	{"replicas: hit ratio >= 0.95 of one replica's", func(w *workloadResult, policy string, pr *policyResult) (bool, bool, string) {
		name, n, err := parseReplicas(policy)
		one := w.Policies[name]
		if err != nil || n < 2 || one == nil {
			return false, false, ""
		}
		return true, pr.PrefixHit >= 0.95*one.PrefixHit, fmt.Sprintf("%.3f against 0.95 x %.3f", pr.PrefixHit, one.PrefixHit)
	}},
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
	Target string   `json:"target"`
	Met    []string `json:"met"`
	Missed []string `json:"missed"`
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
			ts := targetSummary{Target: t.name, Met: []string{}, Missed: []string{}}
			for _, name := range r.Config.Workloads {
				w := r.Workloads[name]
				if w == nil || w.Policies[p] == nil {
					continue
				}
				applies, met, detail := t.check(w, p, w.Policies[p])
				switch {
				case !applies:
				case met:
					ts.Met = append(ts.Met, name)
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
// many of the workloads where the target applies the policy meets it;
// then the misses with their figures.
func summaryMarkdown(sum []policySummary) string {
	if len(sum) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("Summary over the family: workloads where each target of issue 23 is met, of those where it applies.\n\n| routing |")
	for _, t := range goals {
		b.WriteString(" " + t.name + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(goals)) + "\n")
	var misses []string
	for _, ps := range sum {
		fmt.Fprintf(&b, "| `%s` |", ps.Policy)
		for _, ts := range ps.Targets {
			n := len(ts.Met) + len(ts.Missed)
			if n == 0 {
				b.WriteString(" — |")
				continue
			}
			fmt.Fprintf(&b, " %d / %d |", len(ts.Met), n)
			if len(ts.Missed) > 0 {
				misses = append(misses, fmt.Sprintf("- `%s`, %s: missed on %s", ps.Policy, ts.Target, strings.Join(ts.Missed, "; ")))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	if len(misses) > 0 {
		b.WriteString("Misses:\n\n" + strings.Join(misses, "\n") + "\n\n")
	}
	return b.String()
}
