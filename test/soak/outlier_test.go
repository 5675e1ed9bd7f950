package soak

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Targets of the model server faults, which mci-sidecar's outlier
// detection handles (docs/routing.md, "Outlier detection").
const (
	// An error sink's share of the new requests from errorSinkJudgedAfter
	// after it starts failing to its heal: at most errorSinkShare, beyond
	// its probes.
	errorSinkJudgedAfter = 5 * time.Second
	errorSinkShare       = 0.01
	// An error sink serves again within errorSinkBackWithin of its heal.
	errorSinkBackWithin = 30 * time.Second
	// A cluster whose first bytes hang takes no new request from
	// hungJudgedAfter after it hangs to its heal, beyond its probes.
	hungJudgedAfter = 2 * time.Second
	// probeEvery bounds the probes of an ejected cluster: one when each
	// ejection ends, and no ejection is shorter than
	// --outlier-base-ejection-time.
	probeEvery = 5 * time.Second
	// judgeableAtLeast is the least of a judged window that absences may
	// leave for it to be missed when no request was sent in it: ten
	// requests at the soak's default rate.
	judgeableAtLeast = time.Second
)

// outlierResult is what a model server fault's cluster was sent.
type outlierResult struct {
	ID      int       `json:"id"`
	Kind    faultKind `json:"kind"`
	Cluster string    `json:"cluster"`
	// ShareBefore is the cluster's share of the requests sent in the 10s
	// before the fault.
	ShareBefore float64 `json:"share_before"`
	// Judged are the requests sent from JudgedAfter into the fault to its
	// heal, outside the withdrawals of the data path pool; ToCluster of
	// them went to the failing cluster, Probes of which outlier detection
	// may send as probes.
	JudgedAfter time.Duration `json:"judged_after"`
	Judged      int           `json:"judged"`
	ToCluster   int           `json:"to_cluster"`
	Probes      int           `json:"probes_allowed"`
	Allowed     int           `json:"allowed"`
	// LastBefore is when, after the fault's start, the last request the
	// cluster took before JudgedAfter was sent.
	LastBefore time.Duration `json:"last_before"`
	// Back is the time from the heal to the first request the cluster
	// answered 200; negative when it answered none before the end.
	Back time.Duration `json:"back"`
	// FailedAt are the requests the cluster failed while the fault held:
	// sent to it before its ejection, or as probes.
	FailedAt int  `json:"failed_at_cluster"`
	OK       bool `json:"ok"`
	// Why are the checks missed; NotJudged those that had nothing to
	// judge, and why. A fault with either is not passed.
	Why       string `json:"why,omitempty"`
	NotJudged string `json:"not_judged,omitempty"`
}

// judgeOutlier judges a model server fault's window over the requests.
// Requests sent while the gateway's choice could not hold the failing
// cluster as the checks need are left out (absencesOf): while a
// withdrawal of the data path pool's export held, or within
// withdrawalSettle of its restoring (the failing cluster could then take
// none, or was the last, which outlier detection never ejects), and while
// a fault of cutOffs kept the gateway cluster's mci-apiservers from
// reaching the failing cluster (it was flagged unreachable, a candidate
// after every reachable cluster). A check whose window such absences
// cover whole is not judged (NotJudged says why), neither missed nor
// passed. end is the end of the soak, until which a withdrawal never
// restored held.
func judgeOutlier(w window, requests []request, withdrawals []withdrawal, cutOffs []absence, end time.Time) outlierResult {
	res := outlierResult{ID: w.ID, Kind: w.Kind, Cluster: w.Target, JudgedAfter: errorSinkJudgedAfter, Back: -1}
	if w.Kind == hungFirstByte {
		res.JudgedAfter = hungJudgedAfter
	}
	absences := absencesOf(w, withdrawals, cutOffs, end)
	excluded := absentAt(absences)
	from := w.Start.Add(res.JudgedAfter)
	before, beforeTo := 0, 0
	var back time.Time
	for _, q := range requests {
		if q.Cluster == w.Target && q.failed() && failedIn(w, q) {
			res.FailedAt++
		}
		switch {
		case !q.Sent.Before(w.Start.Add(-10*time.Second)) && q.Sent.Before(w.Start):
			before++
			if q.Cluster == w.Target {
				beforeTo++
			}
		case !q.Sent.Before(w.Start) && q.Sent.Before(w.Healed):
			if q.Sent.Before(from) {
				if q.Cluster == w.Target && q.Sent.Sub(w.Start) > res.LastBefore {
					res.LastBefore = q.Sent.Sub(w.Start)
				}
				continue
			}
			if excluded(q) {
				continue
			}
			res.Judged++
			if q.Cluster == w.Target {
				res.ToCluster++
			}
		case !q.Sent.Before(w.Healed) && q.Cluster == w.Target && !q.failed():
			if back.IsZero() || q.Sent.Before(back) {
				back = q.Sent
			}
		}
	}
	if before > 0 {
		res.ShareBefore = float64(beforeTo) / float64(before)
	}
	if !back.IsZero() {
		res.Back = back.Sub(w.Healed)
	}
	if judged := w.Healed.Sub(from); judged > 0 {
		res.Probes = int(math.Ceil(judged.Seconds() / probeEvery.Seconds()))
	}
	res.Allowed = res.Probes
	if w.Kind == errorSink {
		res.Allowed += int(errorSinkShare * float64(res.Judged))
	}
	var why, notJudged []string
	covering, left := cover(absences, from, w.Healed, func(absence) bool { return true })
	switch {
	case len(covering) > 0 && left == 0:
		notJudged = append(notJudged, fmt.Sprintf("its share from %s into the fault to its heal: %s", res.JudgedAfter, describeCover(covering, w)))
	case res.Judged == 0 && len(covering) > 0 && left < judgeableAtLeast:
		// Too little of the window is left to expect a request in it: the
		// faults' starts, drawn apart, can leave a fraction of a
		// millisecond between an absence and the window.
		notJudged = append(notJudged, fmt.Sprintf("its share from %s into the fault to its heal: %s; they leave %s of it, less than %s", res.JudgedAfter, describeCover(covering, w), left.Round(time.Microsecond), judgeableAtLeast))
	case res.Judged == 0:
		why = append(why, fmt.Sprintf("no request to judge from %s into the fault to its heal", res.JudgedAfter))
	}
	if res.ToCluster > res.Allowed {
		why = append(why, fmt.Sprintf("%s took %d of the %d new requests from %s into the fault (at most %d: %d probes%s)",
			w.Target, res.ToCluster, res.Judged, res.JudgedAfter, res.Allowed, res.Probes, map[bool]string{true: fmt.Sprintf(" and %.0f%%", 100*errorSinkShare)}[w.Kind == errorSink]))
	}
	if w.Kind == errorSink && (res.Back < 0 || res.Back > errorSinkBackWithin) {
		// Its own withdrawal after the heal keeps it from serving, and so
		// does a cut-off.
		own := func(a absence) bool { return a.Cluster == w.Target }
		if as := overlapping(absences, w.Healed, w.Healed.Add(errorSinkBackWithin), own); len(as) > 0 {
			notJudged = append(notJudged, fmt.Sprintf("its return within %s of its heal: %s", errorSinkBackWithin, describeCover(as, w)))
		} else {
			why = append(why, fmt.Sprintf("%s served no request within %s of its heal", w.Target, errorSinkBackWithin))
		}
	}
	res.OK = len(why) == 0 && len(notJudged) == 0
	if len(why) > 0 {
		res.Why = fmt.Sprint(why)
	}
	res.NotJudged = strings.Join(notJudged, "; ")
	return res
}

// absence is a span in which the gateway's choice did not hold a model
// server fault's cluster as its checks need, the settle after its end
// included: Cluster took no request (withdrawn, or flagged unreachable
// while another exporter served), or was the last exporter, which
// outlier detection never ejects.
type absence struct {
	Cluster     string
	From, Until time.Time
	// what says what kept Cluster out, its times counted from w's start.
	what func(w window) string
}

// absencesOf are w's absences: every withdrawal of the data path pool's
// export, from its start to withdrawalSettle after its restoring (the
// end of the soak when never restored), and the cut-offs of w's own
// cluster. A cut-off of the other exporter leaves w's cluster the only
// reachable one, which takes its requests and is ejected as ever.
func absencesOf(w window, withdrawals []withdrawal, cutOffs []absence, end time.Time) []absence {
	var out []absence
	for _, wd := range withdrawals {
		until := wd.Restored
		if until.IsZero() {
			until = end
		}
		out = append(out, absence{Cluster: wd.Cluster, From: wd.At, Until: until.Add(withdrawalSettle), what: func(w window) string {
			until := "the end of the soak"
			if !wd.Restored.IsZero() {
				until = relativeTo(w, wd.Restored) + fmt.Sprintf(" (and %s after)", withdrawalSettle)
			}
			what := fmt.Sprintf("no request could go to %s", w.Target)
			if wd.Cluster != w.Target {
				what = fmt.Sprintf("%s was the last exporter, which outlier detection never ejects", w.Target)
			}
			return fmt.Sprintf("%s's export of the data path pool was withdrawn from %s to %s: %s", wd.Cluster, relativeTo(w, wd.At), until, what)
		}})
	}
	for _, c := range cutOffs {
		if c.Cluster == w.Target {
			out = append(out, c)
		}
	}
	return out
}

// cutsGatewayOff reports whether f keeps gateway's mci-apiservers from
// reaching f.Target long enough for them to flag it unreachable: its
// kube-apiserver paused or restarting (which also refuses credentials
// while it starts), the link from gateway to it cut or blackholed, or
// the name by which gateway knows it not resolving. A slow link does
// not: unreachableAfter is longer than the slowest. Nor does a rotation
// of gateway's member Secret: its replicas read the new token as the
// Secret changes, and one still refused with the old is flagged for
// milliseconds.
func (f fault) cutsGatewayOff(gateway string) bool {
	switch f.Kind {
	case pause, compaction:
		return f.Target != gateway
	case partition, blackhole, nameFailure:
		return f.Watcher == gateway
	}
	return false
}

// cutOffsOf are the absences of the faults that cut gateway off an
// exporter: its mci-apiservers flag the exporter's entries unreachable
// (ClusterUnreachable, or CredentialsRejected), and mci-sidecar keeps a
// flagged cluster a candidate only after every reachable one
// (clusterscore.Candidate.Stale), so that it takes no new request while
// another exporter serves and outlier detection learns nothing of it: a
// failing cluster whose flag goes is ejected after as many failures in a
// row as ever, from then. Each is judged as a withdrawal of the
// cluster's export: from when it may be flagged first (unreachableAfter
// after its last answer, which came a probe interval at most before the
// fault) to withdrawalSettle after every view was fresh again after the
// heal (healOf: the flag gone; from the heal when not measured).
func cutOffsOf(windows []window, healOf map[int]*measurement, gateway string) []absence {
	var out []absence
	for _, f := range windows {
		if !f.cutsGatewayOff(gateway) {
			continue
		}
		flagged, fresh := f.Start.Add(unreachableAfter-probeInterval), f.Healed
		if m := healOf[f.ID]; m != nil {
			fresh = fresh.Add(m.Took)
		}
		out = append(out, absence{Cluster: f.Target, From: flagged, Until: fresh.Add(withdrawalSettle), what: func(w window) string {
			return fmt.Sprintf("fault %s, from %s to %s, kept %s's mci-apiservers from reaching %s: it was flagged unreachable, a candidate only after every reachable cluster, from %s at the earliest to %s, when the views were fresh again (and %s after)",
				f.fault, relativeTo(w, f.Start), relativeTo(w, f.Healed), gateway, f.Target, relativeTo(w, flagged), relativeTo(w, fresh), withdrawalSettle)
		}})
	}
	return out
}

// overlapping are the absences that pick keeps which meet [from, to), by
// their start.
func overlapping(absences []absence, from, to time.Time, pick func(absence) bool) []absence {
	var out []absence
	for _, a := range absences {
		if pick(a) && a.From.Before(to) && from.Before(a.Until) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b absence) int { return a.From.Compare(b.From) })
	return out
}

// cover returns the absences that pick keeps which meet [from, to), and
// how much of it they leave; none when it is empty.
func cover(absences []absence, from, to time.Time, pick func(absence) bool) (as []absence, left time.Duration) {
	if !from.Before(to) {
		return nil, 0
	}
	as = overlapping(absences, from, to, pick)
	reached := from
	for _, a := range as {
		if a.From.After(reached) {
			left += a.From.Sub(reached)
		}
		if a.Until.After(reached) {
			reached = a.Until
		}
	}
	if reached.Before(to) {
		left += to.Sub(reached)
	}
	return as, left
}

// relativeTo says when t was, counted from w's start.
func relativeTo(w window, t time.Time) string {
	if d := t.Sub(w.Start); d < 0 {
		return fmt.Sprintf("%.1fs before the fault", -d.Seconds())
	} else {
		return fmt.Sprintf("%.1fs into it", d.Seconds())
	}
}

// describeCover says what the absences did to w's cluster.
func describeCover(as []absence, w window) string {
	var parts []string
	for _, a := range as {
		parts = append(parts, a.what(w))
	}
	return strings.Join(parts, "; ")
}

// absentAt returns whether a request was sent within one of the absences.
func absentAt(absences []absence) func(request) bool {
	return func(q request) bool {
		for _, a := range absences {
			if !q.Sent.Before(a.From) && q.Sent.Before(a.Until) {
				return true
			}
		}
		return false
	}
}

// failedIn reports whether q was under way while w held: a request sent
// just before the fault may reach its cluster after it began.
func failedIn(w window, q request) bool {
	return !q.Done.Before(w.Start) && q.Sent.Before(w.Healed)
}
