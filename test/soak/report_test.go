package soak

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// report is what the soak found: results.json as is, results.md and
// stdout as tables.
type report struct {
	Seed     uint64    `json:"seed"`
	Duration string    `json:"duration"`
	Began    time.Time `json:"began"`
	Ended    time.Time `json:"ended"`
	Rate     float64   `json:"rate"`

	Faults []faultResult `json:"faults"`

	Heals      stats  `json:"heals"`
	HealTarget string `json:"heal_target"`
	// HealsMet: every heal converged, within the target at p99.
	HealsMet      bool  `json:"heals_met"`
	ExportChanges stats `json:"export_changes"`
	// ExportChangesDuring are changes made while a fault held a pair of
	// clusters: their figure includes waiting for the heal.
	ExportChangesDuring stats          `json:"export_changes_during_faults"`
	Changes             int            `json:"changes"`
	Measurements        []*measurement `json:"measurements"`

	Requests    requestResult    `json:"requests"`
	Withdrawals []withdrawResult `json:"withdrawals"`
	Misrouted   int              `json:"misrouted"`
	// Regional is what the regional route's requests were answered.
	Regional *regionalResult `json:"regional_route,omitempty"`
	// Outliers are the model server faults and what their cluster took.
	Outliers []outlierResult `json:"model_server_faults"`
	// WrongModel are the requests answered by another model than the one
	// they named (target 0).
	WrongModel      int      `json:"wrong_model"`
	WrongModelFirst []string `json:"wrong_model_first,omitempty"`

	// Deletions are imports that left an informer while another cluster
	// still exported the pool (target 0).
	Deletions []deletion `json:"unexpected_deletions"`
	// Losses are the polls whose LIST left out the pools of a member
	// under a fault (target 0).
	Losses []loss `json:"lost_under_faults"`

	Runtime []growth `json:"runtime"`
	// Watches are the watches each cluster's replicas serve in all, at the
	// start and the end: the soak's clients hold as many throughout, so
	// more at the end are watches the servers leaked.
	Watches  []watchTotal  `json:"watches"`
	Watchers watcherResult `json:"watchers"`

	// Failures are the missed targets, each with its explanation; empty
	// when the soak passed.
	Failures []string `json:"failures"`
	// NotJudged are the checks that had nothing to judge, and why: neither
	// missed nor passed.
	NotJudged []string `json:"not_judged,omitempty"`
}

type faultResult struct {
	window
	StartOffset string `json:"start_offset"`
	// HealConverged is the time from the heal to every view equal to a
	// fresh LIST.
	HealConverged string `json:"heal_converged"`
	// Requests sent from the fault's start to its heal + explainGrace, and
	// how many of them failed.
	Requests int  `json:"requests"`
	Failed   int  `json:"failed"`
	DataPath bool `json:"on_data_path"`
	// FirstFailure is the first failed request of the window, as the
	// gateway answered it.
	FirstFailure string `json:"first_failure,omitempty"`
}

type stats struct {
	N      int     `json:"n"`
	P50    float64 `json:"p50_s"`
	P99    float64 `json:"p99_s"`
	Max    float64 `json:"max_s"`
	Failed int     `json:"not_converged"`
}

type requestResult struct {
	Total     int `json:"total"`
	OK        int `json:"ok"`
	Failed    int `json:"failed"`
	Explained int `json:"failed_explained"`
	// AtFailingCluster failed at the cluster of a model server fault while
	// it held: sent there before outlier detection ejected it, or as its
	// probes. Neither lost nor explained by another fault: they are what
	// the ejection bounds.
	AtFailingCluster int `json:"failed_at_failing_cluster"`
	// Unexplained failed outside every window of a fault on the data
	// path (target 0); UnexplainedFirst are the first of them.
	Unexplained      int      `json:"failed_unexplained"`
	UnexplainedFirst []string `json:"unexplained_first,omitempty"`
	// Refused are the regional route's requests that mci-sidecar refused
	// (503) because no cluster of its region was left: expected, not
	// failures.
	Refused    int            `json:"refused_no_cluster_in_region"`
	NotSent    int            `json:"not_sent"`
	ByCluster  map[string]int `json:"by_cluster"`
	LatencyP50 float64        `json:"latency_p50_s"`
	LatencyP99 float64        `json:"latency_p99_s"`
}

type withdrawResult struct {
	withdrawal
	AtOffset string `json:"at_offset"`
	// LastServed is when, after the withdrawal, the cluster last served
	// a request (sent that long after At); empty when it served none.
	LastServed string `json:"last_served,omitempty"`
	Misrouted  int    `json:"misrouted"`
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func statsOf(ms []*measurement) stats {
	var s stats
	var took []float64
	for _, m := range ms {
		if m.Failed {
			s.Failed++
			continue
		}
		took = append(took, m.Took.Seconds())
	}
	sort.Float64s(took)
	s.N = len(took)
	if len(took) > 0 {
		s.P50, s.P99, s.Max = percentile(took, 0.5), percentile(took, 0.99), took[len(took)-1]
	}
	return s
}

func buildReport(cfg config, begin, end time.Time, faults []fault, windows []window, ms []*measurement, requests []request, notSent int,
	withdrawals []withdrawal, changes int, ws watcherResult, procs []*scraped, topo topology, model string) *report {
	r := &report{Seed: cfg.Seed, Duration: cfg.Duration.String(), Began: begin, Ended: end, Rate: cfg.Rate, Measurements: ms, Watchers: ws,
		HealTarget: fmt.Sprintf("p99 <= %s", cfg.HealTarget)}
	off := func(t time.Time) string { return fmt.Sprintf("+%.1fs", t.Sub(begin).Seconds()) }

	// Heals and export changes.
	var heals, quiet, during []*measurement
	healOf := map[int]*measurement{}
	for _, m := range ms {
		switch {
		case m.Kind == "heal":
			healOf[m.FaultID] = m
			// EPP link and model server faults do not touch what
			// mci-apiserver serves: their heals are listed, not counted.
			if !slices.ContainsFunc([]faultKind{eppStall, eppReset, errorSink, hungFirstByte}, func(k faultKind) bool { return strings.Contains(m.Label, " "+string(k)+" ") }) {
				heals = append(heals, m)
			}
		case m.During:
			during = append(during, m)
		default:
			quiet = append(quiet, m)
		}
	}
	r.Heals, r.ExportChanges, r.ExportChangesDuring = statsOf(heals), statsOf(quiet), statsOf(during)
	converged, withinTarget := r.Heals.Failed == 0, r.Heals.P99 <= cfg.HealTarget.Seconds()
	r.HealsMet = converged && withinTarget
	if !converged {
		r.Failures = append(r.Failures, fmt.Sprintf("%d heals never saw every view equal a fresh LIST and the exports within 90s: %s", r.Heals.Failed, strings.Join(failedOf(heals), " | ")))
	}
	if !withinTarget {
		r.Failures = append(r.Failures, fmt.Sprintf("after a heal, every view equal to a fresh LIST in %.2fs at p99 (target %s over %d heals)", r.Heals.P99, cfg.HealTarget, r.Heals.N))
	}
	if n := r.ExportChanges.Failed + r.ExportChangesDuring.Failed; n > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d export changes never reached every view: %s", n, strings.Join(append(failedOf(quiet), failedOf(during)...), " | ")))
	}

	// Requests and the faults that explain their failures.
	r.Requests = requestResult{Total: len(requests), NotSent: notSent, ByCluster: map[string]int{}}
	// A model server fault's own failures are counted apart (below); it
	// explains the others as any fault on the data path does: while its
	// cluster is ejected the pool rests on the others, and a hiccup of
	// theirs (an EPP missing one health check) finds no cluster.
	explains := func(w window, q request) bool {
		return w.onDataPath(topo.Gateway) && !q.Sent.After(w.Healed.Add(explainGrace)) && !q.Done.Before(w.Start)
	}
	atFailing := func(w window, q request) bool {
		return (w.Kind == errorSink || w.Kind == hungFirstByte) && q.Cluster == w.Target && failedIn(w, q)
	}
	var latencies []float64
	for _, q := range requests {
		if !q.failed() {
			r.Requests.OK++
			r.Requests.ByCluster[q.Cluster]++
			latencies = append(latencies, q.Done.Sub(q.Sent).Seconds())
			if q.Model != model {
				r.WrongModel++
				if len(r.WrongModelFirst) < 10 {
					r.WrongModelFirst = append(r.WrongModelFirst, fmt.Sprintf("sent %s, served by %s: model %q", off(q.Sent), q.Cluster, q.Model))
				}
			}
			continue
		}
		if refusedForRegion(q) {
			r.Requests.Refused++
			continue
		}
		r.Requests.Failed++
		if slices.ContainsFunc(windows, func(w window) bool { return atFailing(w, q) }) {
			r.Requests.AtFailingCluster++
			continue
		}
		if slices.ContainsFunc(windows, func(w window) bool { return explains(w, q) }) {
			r.Requests.Explained++
			continue
		}
		r.Requests.Unexplained++
		if len(r.Requests.UnexplainedFirst) < 10 {
			r.Requests.UnexplainedFirst = append(r.Requests.UnexplainedFirst, fmt.Sprintf("sent %s, took %.2fs: HTTP %d %s %s", off(q.Sent), q.Done.Sub(q.Sent).Seconds(), q.Code, q.Err, q.Body))
		}
	}
	sort.Float64s(latencies)
	r.Requests.LatencyP50, r.Requests.LatencyP99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
	if r.Requests.Unexplained > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d requests failed outside the windows of the faults on the data path (target 0); first: %s", r.Requests.Unexplained, strings.Join(r.Requests.UnexplainedFirst, " | ")))
	}
	if r.Requests.Total == 0 {
		r.Failures = append(r.Failures, "no request was answered")
	}
	if r.WrongModel > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d requests answered by another model than %s, the one they named (target 0); first: %s", r.WrongModel, model, strings.Join(r.WrongModelFirst, " | ")))
	}
	if topo.Regional != "" {
		reg := judgeRegional(requests, topo.Regional, begin)
		r.Regional = &reg
		if reg.Outside > 0 {
			r.Failures = append(r.Failures, fmt.Sprintf("%d requests of the route restricted to %s answered by a cluster outside it (target 0); first: %s", reg.Outside, reg.Region, strings.Join(reg.OutsideFirst, " | ")))
		}
		if reg.InRegion == 0 {
			r.Failures = append(r.Failures, fmt.Sprintf("no request of the route restricted to %s was answered by %s, its cluster", reg.Region, topo.Regional))
		}
	}
	// The outlier checks judge the data path's own route: the regional
	// route's requests can go to one cluster only.
	mainRoute := slices.DeleteFunc(slices.Clone(requests), func(q request) bool { return q.Route != "" })
	cutOffs := cutOffsOf(windows, healOf, topo.Gateway)
	for _, w := range windows {
		if w.Kind != errorSink && w.Kind != hungFirstByte {
			continue
		}
		o := judgeOutlier(w, mainRoute, withdrawals, cutOffs, end)
		if o.Why != "" {
			r.Failures = append(r.Failures, fmt.Sprintf("fault %s: %s", w.fault, o.Why))
		}
		if o.NotJudged != "" {
			r.NotJudged = append(r.NotJudged, fmt.Sprintf("fault %s: not judged: %s", w.fault, o.NotJudged))
		}
		r.Outliers = append(r.Outliers, o)
	}

	for _, w := range windows {
		fr := faultResult{window: w, StartOffset: off(w.Start), DataPath: w.onDataPath(topo.Gateway)}
		if m := healOf[w.ID]; m != nil {
			fr.HealConverged = fmt.Sprintf("%.2fs", m.Took.Seconds())
			if m.Failed {
				fr.HealConverged = "not in " + m.Took.Round(time.Second).String()
			}
		}
		for _, q := range requests {
			if !q.Sent.Before(w.Start) && !q.Sent.After(w.Healed.Add(explainGrace)) {
				fr.Requests++
				if q.failed() {
					fr.Failed++
					if fr.FirstFailure == "" {
						fr.FirstFailure = fmt.Sprintf("sent %s: HTTP %d %s %s", off(q.Sent), q.Code, q.Err, strings.Join(strings.Fields(q.Body), " "))
					}
				}
			}
		}
		if w.Err != "" {
			r.Failures = append(r.Failures, fmt.Sprintf("fault %s: %s", w.fault, w.Err))
		}
		for _, c := range fr.Checks {
			if !c.OK {
				r.Failures = append(r.Failures, fmt.Sprintf("fault %s: %s: %s", w.fault, c.Target, c.Figure))
			}
		}
		r.Faults = append(r.Faults, fr)
	}
	if len(windows) != len(faults) {
		r.Failures = append(r.Failures, fmt.Sprintf("%d faults scheduled, %d applied", len(faults), len(windows)))
	}

	// Routing after a withdrawal.
	for _, wd := range withdrawals {
		until := wd.Restored
		if until.IsZero() {
			until = end
		}
		res := withdrawResult{withdrawal: wd, AtOffset: off(wd.At)}
		var last time.Time
		for _, q := range requests {
			if q.Cluster != wd.Cluster || q.failed() || q.Sent.Before(wd.At) || !q.Sent.Before(until) {
				continue
			}
			if q.Sent.After(last) {
				last = q.Sent
			}
			if wd.Converged && q.Sent.After(wd.At.Add(wd.Gone+sidecarLag)) {
				res.Misrouted++
			}
		}
		if !last.IsZero() {
			res.LastServed = fmt.Sprintf("+%.2fs", last.Sub(wd.At).Seconds())
		}
		r.Misrouted += res.Misrouted
		if !wd.Converged && until.Sub(wd.At) > 3*time.Minute {
			r.Failures = append(r.Failures, fmt.Sprintf("the withdrawal of the data path pool's export by %s at %s never left %s's import", wd.Cluster, off(wd.At), topo.Gateway))
		}
		r.Withdrawals = append(r.Withdrawals, res)
	}
	if r.Misrouted > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d requests routed to a cluster more than %s after %s's import stopped listing it (target 0)", r.Misrouted, sidecarLag, topo.Gateway))
	}

	// Runtime.
	win := min(3*time.Minute, max(10*time.Second, cfg.Duration/8))
	for _, p := range procs {
		g := p.compare(begin.Add(cfg.Warmup), win, 30*time.Second, cfg.JudgeGrowth, cfg.Duration/3)
		for _, f := range g.Failures {
			r.Failures = append(r.Failures, fmt.Sprintf("%s (pid %d): %s between %s and the end", g.Name, g.PID, f, off(g.From)))
		}
		r.Runtime = append(r.Runtime, g)
	}
	r.Watches = watchTotals(procs, begin.Add(cfg.Warmup), win)
	if cfg.JudgeGrowth {
		for _, w := range r.Watches {
			if w.End > w.Start+watchTolerance(w.Start) {
				r.Failures = append(r.Failures, fmt.Sprintf("%s's mci-apiserver replicas serve %.0f watches at the end, %.0f after the warm-up, while the soak's clients hold as many: watches leaked", w.Cluster, w.End, w.Start))
			}
		}
	}
	r.Changes = changes
	return r
}

// watchTotal is what the replicas of a cluster serve in all.
type watchTotal struct {
	Cluster string  `json:"cluster"`
	Start   float64 `json:"start"`
	End     float64 `json:"end"`
}

// watchTotals sums, per cluster, the median watches each of its replicas
// served (whatever its process) in the first window from from and in the
// last window of the run.
func watchTotals(procs []*scraped, from time.Time, win time.Duration) []watchTotal {
	var end time.Time
	for _, p := range procs {
		if n := len(p.samples); n > 0 && p.samples[n-1].At.After(end) {
			end = p.samples[n-1].At
		}
	}
	var out []watchTotal
	index := map[string]int{}
	for _, p := range procs {
		if p.Cluster == "" {
			continue
		}
		i, ok := index[p.Cluster]
		if !ok {
			i = len(out)
			index[p.Cluster] = i
			out = append(out, watchTotal{Cluster: p.Cluster})
		}
		watches := func(x sample) float64 { return x.Watches }
		if w := pick(p.samples, func(x sample) bool { return !x.At.Before(from) && !x.At.After(from.Add(win)) }); len(w) > 0 {
			out[i].Start += median(w, watches)
		}
		if w := pick(p.samples, func(x sample) bool { return !x.At.Before(end.Add(-win)) }); len(w) > 0 {
			out[i].End += median(w, watches)
		}
	}
	return out
}

func (r *report) addLosses(ls []loss, begin time.Time) {
	r.Losses = ls
	if len(ls) == 0 {
		return
	}
	r.Failures = append(r.Failures, fmt.Sprintf("%d polls from +%.1fs to +%.1fs found the pools of a member under a fault gone from a LIST, where it must keep its last known pools, flagged (target 0); first: %s",
		len(ls), ls[0].At.Sub(begin).Seconds(), ls[len(ls)-1].At.Sub(begin).Seconds(), strings.Join(ls[0].What, "; ")))
}

func (r *report) addDeletions(ds []deletion, begin time.Time) {
	r.Deletions = ds
	if len(ds) == 0 {
		return
	}
	var first []string
	for _, d := range ds[:min(len(ds), 5)] {
		first = append(first, fmt.Sprintf("%s in %s at +%.1fs, %s", d.Import, d.Cluster, d.At.Sub(begin).Seconds(), d.Why))
	}
	r.Failures = append(r.Failures, fmt.Sprintf("%d imports left an informer while another cluster still exported their pool (target 0); first: %s", len(ds), strings.Join(first, " | ")))
}

func (r *report) markdown() string {
	var b strings.Builder
	verdict := "PASS"
	if len(r.Failures) > 0 {
		verdict = fmt.Sprintf("FAIL (%d targets missed)", len(r.Failures))
	}
	if len(r.NotJudged) > 0 {
		verdict += fmt.Sprintf(", %d checks not judged", len(r.NotJudged))
	}
	fmt.Fprintf(&b, "# Chaos soak: %s\n\n", verdict)
	fmt.Fprintf(&b, "Seed %d (`SOAK_SEED=%d make soak SOAK_DURATION=%s` replays the schedule), %s from %s, %.0f req/s, %d watchers.\n\n",
		r.Seed, r.Seed, r.Duration, r.Duration, r.Began.UTC().Format(time.RFC3339), r.Rate, r.Watchers.Watchers)
	fmt.Fprintf(&b, "| target | figure | verdict |\n|---|---|---|\n")
	rowVerdict := func(target, figure, verdict string) {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", target, figure, verdict)
	}
	row := func(target, figure string, ok bool) {
		rowVerdict(target, figure, map[bool]string{true: "ok", false: "MISSED"}[ok])
	}
	row("after a heal, every view equals a fresh LIST ("+r.HealTarget+")",
		fmt.Sprintf("p50 %.2fs, p99 %.2fs, max %.2fs over %d heals (EPP link and model server faults not counted); %d not converged", r.Heals.P50, r.Heals.P99, r.Heals.Max, r.Heals.N, r.Heals.Failed),
		r.HealsMet)
	row("requests failed outside fault windows (lost): 0",
		fmt.Sprintf("%d of %d failed: %d at a failing model server's cluster before its ejection or as its probes, %d in another fault's window, %d outside", r.Requests.Failed, r.Requests.Total, r.Requests.AtFailingCluster, r.Requests.Explained, r.Requests.Unexplained), r.Requests.Unexplained == 0)
	row("requests answered by another model than they named: 0", fmt.Sprintf("%d of %d answered", r.WrongModel, r.Requests.OK), r.WrongModel == 0)
	if g := r.Regional; g != nil {
		row(fmt.Sprintf("requests of the route restricted to region %s answered by a cluster outside it: 0", g.Region),
			fmt.Sprintf("%d of %d: %d answered in the region, %d failed there, %d refused (503: no cluster of the region left), %d failed otherwise", g.Outside, g.Sent, g.InRegion, g.FailedInRegion, g.Refused, g.Sent-g.InRegion-g.FailedInRegion-g.Refused-g.Outside),
			g.Outside == 0 && g.InRegion > 0)
	}
	for _, o := range r.Outliers {
		target := fmt.Sprintf("#%d %s %s: new requests to it from %s to the heal: at most %d (probes, one each %s", o.ID, o.Kind, o.Cluster, o.JudgedAfter, o.Allowed, probeEvery)
		if o.Kind == errorSink {
			target += fmt.Sprintf(", and %.0f%%); back within %s of the heal", 100*errorSinkShare, errorSinkBackWithin)
		} else {
			target += ")"
		}
		back := "not back by the end"
		if o.Back >= 0 {
			back = fmt.Sprintf("back %.1fs after the heal", o.Back.Seconds())
		}
		verdict := map[bool]string{true: "ok", false: "MISSED"}[o.Why == ""]
		if o.Why == "" && o.NotJudged != "" {
			verdict = "not judged (below)"
		}
		rowVerdict(target, fmt.Sprintf("%d of %d (%.1f%%; %.0f%% in the 10s before); last other request to it sent +%.1fs into the fault; %d failed at it; %s",
			o.ToCluster, o.Judged, 100*float64(o.ToCluster)/math.Max(1, float64(o.Judged)), 100*o.ShareBefore, o.LastBefore.Seconds(), o.FailedAt, back), verdict)
	}
	for _, f := range r.Faults {
		for _, c := range f.Checks {
			row(c.Target, c.Figure, c.OK)
		}
	}
	row("imports deleted from an informer while still exported: 0", fmt.Sprintf("%d", len(r.Deletions)), len(r.Deletions) == 0)
	row("LISTs without the last known pools of a member under a fault: 0", fmt.Sprintf("%d polls", len(r.Losses)), len(r.Losses) == 0)
	row("requests routed to a withdrawn export after convergence: 0", fmt.Sprintf("%d over %d withdrawals", r.Misrouted, len(r.Withdrawals)), r.Misrouted == 0)
	growthOK := !slices.ContainsFunc(r.Runtime, func(g growth) bool { return len(g.Failures) > 0 })
	judged := 0
	for _, g := range r.Runtime {
		if g.Judged {
			judged++
		}
	}
	row("live heap, goroutines within 10%, fds flat", fmt.Sprintf("%d of %d processes judged", judged, len(r.Runtime)), growthOK)
	fmt.Fprintf(&b, "\nExport changes reached every view (informer = fresh LIST = the exports): p50 %.2fs, p99 %.2fs, max %.2fs over %d changes; %d more made during a fault: p99 %.2fs; %d not converged.\n",
		r.ExportChanges.P50, r.ExportChanges.P99, r.ExportChanges.Max, r.ExportChanges.N, r.ExportChangesDuring.N, r.ExportChangesDuring.P99, r.ExportChanges.Failed+r.ExportChangesDuring.Failed)
	fmt.Fprintf(&b, "Requests: %d answered (%s), latency p50 %.0f ms, p99 %.0f ms; %d not sent (64 in flight).\n",
		r.Requests.OK, clusterCounts(r.Requests.ByCluster), 1000*r.Requests.LatencyP50, 1000*r.Requests.LatencyP99, r.Requests.NotSent)
	fmt.Fprintf(&b, "Watchers: %d, %d events, %d watches reopened, %d errors%s.\n\n", r.Watchers.Watchers, r.Watchers.Events, r.Watchers.Reopened, r.Watchers.Errors, lastErr(r.Watchers.LastErr))

	fmt.Fprintf(&b, "## Faults\n\n| # | fault | start | held | heal -> views = LIST | requests | failed | on data path | error |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range r.Faults {
		fmt.Fprintf(&b, "| %d | %s | %s | %.1fs | %s | %d | %d | %v | %s |\n", f.ID, strings.SplitN(f.fault.String(), " ", 2)[1], f.StartOffset,
			f.Healed.Sub(f.Start).Seconds(), f.HealConverged, f.Requests, f.Failed, f.DataPath, f.Err)
	}
	first := false
	for _, f := range r.Faults {
		if f.FirstFailure == "" {
			continue
		}
		if !first {
			fmt.Fprintf(&b, "\nFirst failed request in each window:\n\n")
			first = true
		}
		fmt.Fprintf(&b, "- #%d: %s\n", f.ID, f.FirstFailure)
	}
	if len(r.Withdrawals) > 0 {
		fmt.Fprintf(&b, "\n## Withdrawals of the data path pool's export\n\n| cluster | at | left the gateway's import after | last request it served after | misrouted |\n|---|---|---|---|---|\n")
		for _, w := range r.Withdrawals {
			gone := "not converged"
			if w.Converged {
				gone = fmt.Sprintf("%.2fs", w.Gone.Seconds())
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %d |\n", w.Cluster, w.AtOffset, gone, w.LastServed, w.Misrouted)
		}
	}
	fmt.Fprintf(&b, "\n## Runtime of the mci processes (start after warm-up -> end)\n\n| process | pid | live heap MiB | heap in use MiB (least) | goroutines | fds | watches served | samples | judged |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range r.Runtime {
		j := "yes"
		if g.Rebaselined != nil {
			j = fmt.Sprintf("yes, from +%.0fs, when its cluster's watches last moved to or from it", g.Rebaselined.Sub(r.Began).Seconds())
		}
		if !g.Judged {
			j = "no: " + g.Why
		}
		if len(g.Failures) > 0 {
			j = "MISSED: " + strings.Join(g.Failures, "; ")
		}
		watches := "-"
		if strings.Contains(g.Name, "mci-apiserver") {
			watches = fmt.Sprintf("%.0f -> %.0f", g.WatchesStart, g.WatchesEnd)
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f -> %.1f | %.1f -> %.1f | %.0f -> %.0f | %.0f -> %.0f | %s | %d (%d errors) | %s |\n", g.Name, g.PID, g.LiveStartMiB, g.LiveEndMiB, g.HeapStartMiB, g.HeapEndMiB,
			g.GoroutinesStart, g.GoroutinesEnd, g.FDsStart, g.FDsEnd, watches, g.Samples, g.ScrapeErrors, j)
	}
	fmt.Fprintf(&b, "\nWatches served by each cluster's replicas in all (after the warm-up -> the end; the clients hold as many throughout):")
	for _, w := range r.Watches {
		fmt.Fprintf(&b, " %s %.0f -> %.0f;", w.Cluster, w.Start, w.End)
	}
	fmt.Fprintf(&b, "\n")
	if i := slices.IndexFunc(r.Runtime, func(g growth) bool { return len(g.HeapProfiles) > 0 }); i >= 0 {
		fmt.Fprintf(&b, "\nHeap profiles of the mci-apiserver replicas after the warm-up and at the end are in %s (`go tool pprof -sample_index=inuse_space -base <start> <end>` shows what the live heap grew by).\n",
			filepath.Dir(r.Runtime[i].HeapProfiles[0]))
	}
	if len(r.Failures) > 0 {
		fmt.Fprintf(&b, "\n## Targets missed\n\n")
		for _, f := range r.Failures {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	if len(r.NotJudged) > 0 {
		fmt.Fprintf(&b, "\n## Not judged (neither missed nor passed)\n\n")
		for _, n := range r.NotJudged {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

func clusterCounts(m map[string]int) string {
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", c, m[c]))
	}
	return strings.Join(parts, ", ")
}

func lastErr(s string) string {
	if s == "" {
		return ""
	}
	return " (last: " + s + ")"
}

func (r *report) write(dir, md string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), data, 0o644)
}
