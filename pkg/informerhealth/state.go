package informerhealth

import "time"

// errorLogInterval is the least time between two log lines of a resource
// that keeps failing with another error.
const errorLogInterval = time.Minute

// change is what an outcome changed in a resource's state, and so what is
// logged and counted.
type change int8

const (
	// unchanged: nothing to log.
	unchanged change = iota
	// firstReachable: the first list or watch succeeded (not logged: the
	// informer's sync says it).
	firstReachable
	// lost: the resource was reachable (or not known yet) and a list or
	// watch failed.
	lost
	// newError: still failing, with another error than the one last
	// logged, and the last log line is at least errorLogInterval old.
	newError
	// recovered: the resource was failing and a list or watch succeeded.
	recovered
)

// state is whether one resource's informer lists and watches, kept as a
// pure function of the outcomes it was told, so that it is tested without
// a server.
type state struct {
	known   bool
	failing bool
	// since is when the resource began failing.
	since time.Time
	// cause is the root cause of the error last logged; loggedAt when.
	cause    string
	loggedAt time.Time
}

// failed records a failed list or watch whose root cause reads cause.
func (s *state) failed(now time.Time, cause string) change {
	switch {
	case !s.failing:
		*s = state{known: true, failing: true, since: now, cause: cause, loggedAt: now}
		return lost
	case cause != s.cause && now.Sub(s.loggedAt) >= errorLogInterval:
		s.cause, s.loggedAt = cause, now
		return newError
	}
	return unchanged
}

// succeeded records a list that answered or a watch that opened, and
// returns how long the resource had been failing.
func (s *state) succeeded(now time.Time) (change, time.Duration) {
	switch {
	case !s.known:
		*s = state{known: true}
		return firstReachable, 0
	case s.failing:
		failedFor := now.Sub(s.since)
		*s = state{known: true}
		return recovered, failedFor
	}
	return unchanged, 0
}
