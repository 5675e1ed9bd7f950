package informerhealth

import (
	"time"

	"github.com/mci-dev/mci/pkg/statelog"
)

// errorLog is when the errors of a resource that keeps failing are logged:
// another error at most once a minute.
var errorLog = statelog.Rule{Interval: time.Minute}

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
	// logged, and the last log line is at least a minute old.
	newError
	// recovered: the resource was failing and a list or watch succeeded.
	recovered
)

// state is whether one resource's informer lists and watches, kept as a
// pure function of the outcomes it was told, so that it is tested without
// a server.
type state struct {
	known bool
	// failure is the root cause of the failing list or watch, unset while
	// the resource is reachable.
	failure statelog.State
}

// failed records a failed list or watch whose root cause reads cause.
func (s *state) failed(now time.Time, cause string) change {
	s.known = true
	switch s.failure.Observe(now, "", cause, errorLog) {
	case statelog.First:
		return lost
	case statelog.Changed:
		return newError
	}
	return unchanged
}

// succeeded records a list that answered or a watch that opened, and
// returns how long the resource had been failing.
func (s *state) succeeded(now time.Time) (change, time.Duration) {
	if !s.known {
		s.known = true
		return firstReachable, 0
	}
	if failing, failedFor := s.failure.Clear(now); failing {
		return recovered, failedFor
	}
	return unchanged, 0
}
