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
// Requests sent while a withdrawal of the data path pool's export held, or
// within withdrawalSettle of its restoring, are left out: the failing
// cluster could then take none, or was the last, which outlier detection
// never ejects. A check whose window such withdrawals cover whole is not
// judged (NotJudged says why), neither missed nor passed. end is the end
// of the soak, until which a withdrawal never restored held.
func judgeOutlier(w window, requests []request, withdrawals []withdrawal, end time.Time) outlierResult {
	res := outlierResult{ID: w.ID, Kind: w.Kind, Cluster: w.Target, JudgedAfter: errorSinkJudgedAfter, Back: -1}
	if w.Kind == hungFirstByte {
		res.JudgedAfter = hungJudgedAfter
	}
	excluded := withdrawnAt(withdrawals, end, withdrawalSettle)
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
	covered := coveredBy(withdrawals, end, from, w.Healed, func(withdrawal) bool { return true })
	switch {
	case covered != nil:
		notJudged = append(notJudged, fmt.Sprintf("its share from %s into the fault to its heal: %s", res.JudgedAfter, describeCover(covered, w)))
	case res.Judged == 0:
		why = append(why, fmt.Sprintf("no request to judge from %s into the fault to its heal", res.JudgedAfter))
	}
	if res.ToCluster > res.Allowed {
		why = append(why, fmt.Sprintf("%s took %d of the %d new requests from %s into the fault (at most %d: %d probes%s)",
			w.Target, res.ToCluster, res.Judged, res.JudgedAfter, res.Allowed, res.Probes, map[bool]string{true: fmt.Sprintf(" and %.0f%%", 100*errorSinkShare)}[w.Kind == errorSink]))
	}
	if w.Kind == errorSink && (res.Back < 0 || res.Back > errorSinkBackWithin) {
		// Its own withdrawal after the heal keeps it from serving.
		own := func(wd withdrawal) bool { return wd.Cluster == w.Target }
		if wds := overlapping(withdrawals, end, w.Healed, w.Healed.Add(errorSinkBackWithin), own); len(wds) > 0 {
			notJudged = append(notJudged, fmt.Sprintf("its return within %s of its heal: %s", errorSinkBackWithin, describeCover(wds, w)))
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

// withdrawnSpan is when a withdrawal kept its cluster out of the gateway's
// choice: from its start to withdrawalSettle after its restoring (the end
// of the soak when never restored).
func withdrawnSpan(wd withdrawal, end time.Time) (time.Time, time.Time) {
	until := wd.Restored
	if until.IsZero() {
		until = end
	}
	return wd.At, until.Add(withdrawalSettle)
}

// overlapping are the withdrawals that pick keeps whose span meets
// [from, to), by their start.
func overlapping(withdrawals []withdrawal, end, from, to time.Time, pick func(withdrawal) bool) []withdrawal {
	var out []withdrawal
	for _, wd := range withdrawals {
		if s, e := withdrawnSpan(wd, end); pick(wd) && s.Before(to) && from.Before(e) {
			out = append(out, wd)
		}
	}
	slices.SortFunc(out, func(a, b withdrawal) int { return a.At.Compare(b.At) })
	return out
}

// coveredBy returns the withdrawals whose spans cover [from, to) whole;
// nil when they leave some of it, or when it is empty.
func coveredBy(withdrawals []withdrawal, end, from, to time.Time, pick func(withdrawal) bool) []withdrawal {
	if !from.Before(to) {
		return nil
	}
	wds := overlapping(withdrawals, end, from, to, pick)
	reached := from
	for _, wd := range wds {
		s, e := withdrawnSpan(wd, end)
		if s.After(reached) {
			return nil
		}
		if e.After(reached) {
			reached = e
		}
	}
	if reached.Before(to) {
		return nil
	}
	return wds
}

// describeCover says what the withdrawals did to w's cluster, their times
// counted from w's start.
func describeCover(wds []withdrawal, w window) string {
	rel := func(t time.Time) string {
		if d := t.Sub(w.Start); d < 0 {
			return fmt.Sprintf("%.1fs before the fault", -d.Seconds())
		} else {
			return fmt.Sprintf("%.1fs into it", d.Seconds())
		}
	}
	var parts []string
	for _, wd := range wds {
		until := "the end of the soak"
		if !wd.Restored.IsZero() {
			until = rel(wd.Restored) + fmt.Sprintf(" (and %s after)", withdrawalSettle)
		}
		what := fmt.Sprintf("no request could go to %s", w.Target)
		if wd.Cluster != w.Target {
			what = fmt.Sprintf("%s was the last exporter, which outlier detection never ejects", w.Target)
		}
		parts = append(parts, fmt.Sprintf("%s's export of the data path pool was withdrawn from %s to %s: %s", wd.Cluster, rel(wd.At), until, what))
	}
	return strings.Join(parts, "; ")
}

// withdrawnAt returns whether a request was sent while a withdrawal of the
// data path pool's export held, or within settle of its restoring.
func withdrawnAt(withdrawals []withdrawal, end time.Time, settle time.Duration) func(request) bool {
	return func(q request) bool {
		for _, wd := range withdrawals {
			until := wd.Restored
			if until.IsZero() {
				until = end
			}
			if !q.Sent.Before(wd.At) && q.Sent.Before(until.Add(settle)) {
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
