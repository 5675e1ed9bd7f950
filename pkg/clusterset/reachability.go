package clusterset

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mci-dev/mci/pkg/imports"
)

// thresholds say when a failing member is flagged and when its data is
// dropped.
type thresholds struct {
	// unreachableAfter: flagged ClusterUnreachable, last known data kept.
	unreachableAfter time.Duration
	// removeAfter: its exported pools leave the imports; 0 never (the
	// local cluster, whose namespaces decide every placement).
	removeAfter time.Duration
}

// reachability is the state machine of a member's probes: reachable, then
// unreachable once it has failed for the unreachable threshold, then
// removed once it has failed for the removal threshold, and reachable again
// at its first answer. It knows nothing of clients or timers: the prober (probe.go)
// feeds it each probe's outcome (assess) and asks it when the next
// threshold falls (untilThreshold) and whether one has passed while a
// probe is pending (crossThresholds).
type reachability struct {
	// joined is when the Cache first tried the member: one that has never
	// answered is failing since then (asking it what it serves comes
	// before the first probe and can take a while on a dead link).
	joined time.Time

	mu sync.Mutex
	// lastAnswered is when the member last answered a probe; a member that
	// fails one is failing since then, so that an outage is flagged within
	// the threshold of its start, not of the first probe that noticed it.
	lastAnswered time.Time
	failingSince time.Time
	lastError    string
	unreachable  bool
	// removed: the member has failed for longer than its removal threshold,
	// so the pools it exported are no longer served.
	removed bool
}

// memberStatus is a failing member's state.
type memberStatus struct {
	imports.Unreachable
	removed bool
}

// status returns the member's unreachability, nil when it is reachable.
func (r *reachability) status() *memberStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.unreachable {
		return nil
	}
	st := &memberStatus{Unreachable: imports.Unreachable{Since: r.failingSince, Message: r.lastError}, removed: r.removed}
	if r.removed {
		st.Message += "; its exported pools are no longer served until it answers again"
	}
	return st
}

// assess records the outcome of a probe sent at started and answered (or
// timed out) at now: a failing member fails from the moment it last
// answered (else from its first failed probe). It reports whether the member's state (reachable, unreachable,
// removed) changed, and how long until the next threshold a failing member
// has not crossed yet (0: none left).
func (r *reachability) assess(started, now time.Time, err error, th thresholds) (changed bool, untilNext time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		changed = r.unreachable || r.removed
		r.failingSince, r.lastError, r.unreachable, r.removed = time.Time{}, "", false, false
		r.lastAnswered = now
		return changed, 0
	}
	if r.failingSince.IsZero() {
		switch {
		case !r.lastAnswered.IsZero():
			r.failingSince = r.lastAnswered
		case !r.joined.IsZero():
			r.failingSince = r.joined
		default:
			r.failingSince = started
		}
	}
	r.lastError = err.Error()
	changed = r.crossThresholdsLocked(now, th)
	return changed, r.untilThresholdLocked(now, th)
}

// crossThresholds flags a failing member unreachable, then removed, once it
// has failed for as long as their thresholds, and reports whether it did.
// It is called while a probe is pending: a member that has not answered
// for the unreachable threshold since its last answer is failing since
// then, whether or not its pending probe has timed out yet.
func (r *reachability) crossThresholds(now time.Time, th thresholds) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failingSince.IsZero() && !r.lastAnswered.IsZero() && now.Sub(r.lastAnswered) >= th.unreachableAfter {
		r.failingSince = r.lastAnswered
	}
	return r.crossThresholdsLocked(now, th)
}

func (r *reachability) crossThresholdsLocked(now time.Time, th thresholds) (changed bool) {
	if r.failingSince.IsZero() {
		return false
	}
	failing := now.Sub(r.failingSince)
	if !r.unreachable && failing >= th.unreachableAfter {
		r.unreachable, changed = true, true
	}
	if !r.removed && th.removeAfter > 0 && failing >= th.removeAfter {
		r.removed, changed = true, true
	}
	return changed
}

// untilThreshold is how long until a failing member crosses its next
// threshold; 0 when it is not failing or has crossed them all. It is
// asked while a probe is pending: a member not failing yet crosses the
// unreachable threshold that long after its last answer.
func (r *reachability) untilThreshold(now time.Time, th thresholds) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failingSince.IsZero() && !r.lastAnswered.IsZero() {
		return max(r.lastAnswered.Add(th.unreachableAfter).Sub(now), time.Nanosecond)
	}
	return r.untilThresholdLocked(now, th)
}

func (r *reachability) untilThresholdLocked(now time.Time, th thresholds) time.Duration {
	if r.failingSince.IsZero() {
		return 0
	}
	failing := now.Sub(r.failingSince)
	switch {
	case !r.unreachable:
		return max(th.unreachableAfter-failing, time.Nanosecond)
	case !r.removed && th.removeAfter > 0:
		return max(th.removeAfter-failing, time.Nanosecond)
	}
	return 0
}

// errProbePending is the probe outcome logged when a failing member crosses
// a threshold while its latest probe has not answered yet.
var errProbePending = errors.New("the member has not answered its probe yet")

// pendingProbeError is what to log when a member crosses a threshold while
// a probe is in flight: the previous probe's error when there was one (a
// refused connection says more than "no answer yet"), else errProbePending.
func (r *reachability) pendingProbeError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastError == "" {
		return errProbePending
	}
	return fmt.Errorf("%s (the latest probe has not answered yet)", r.lastError)
}
