package soak

import (
	"fmt"
	"math"
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
	FailedAt int    `json:"failed_at_cluster"`
	OK       bool   `json:"ok"`
	Why      string `json:"why,omitempty"`
}

// judgeOutlier judges a model server fault's window over the requests.
// excluded reports whether a request was sent while the data path pool's
// export was withdrawn by some cluster: the failing cluster may then be
// the last, which outlier detection never ejects.
func judgeOutlier(w window, requests []request, excluded func(request) bool) outlierResult {
	res := outlierResult{ID: w.ID, Kind: w.Kind, Cluster: w.Target, JudgedAfter: errorSinkJudgedAfter, Back: -1}
	if w.Kind == hungFirstByte {
		res.JudgedAfter = hungJudgedAfter
	}
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
	var why []string
	if res.Judged == 0 {
		why = append(why, fmt.Sprintf("no request to judge from %s into the fault to its heal", res.JudgedAfter))
	}
	if res.ToCluster > res.Allowed {
		why = append(why, fmt.Sprintf("%s took %d of the %d new requests from %s into the fault (at most %d: %d probes%s)",
			w.Target, res.ToCluster, res.Judged, res.JudgedAfter, res.Allowed, res.Probes, map[bool]string{true: fmt.Sprintf(" and %.0f%%", 100*errorSinkShare)}[w.Kind == errorSink]))
	}
	if w.Kind == errorSink && (res.Back < 0 || res.Back > errorSinkBackWithin) {
		why = append(why, fmt.Sprintf("%s served no request within %s of its heal", w.Target, errorSinkBackWithin))
	}
	res.OK = len(why) == 0
	if !res.OK {
		res.Why = fmt.Sprint(why)
	}
	return res
}

// failedIn reports whether q was under way while w held: a request sent
// just before the fault may reach its cluster after it began.
func failedIn(w window, q request) bool {
	return !q.Done.Before(w.Start) && q.Sent.Before(w.Healed)
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
