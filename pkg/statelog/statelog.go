// Package statelog tells in a log the state of what a process follows (an
// informer's resource, an EPP's port, a backend's prompts, a cluster's
// response phases): once when it changes, not once per event, and the
// changes of detail at most once per interval.
//
// A State is one subject's, pure (the caller gives the time), so that its
// rules are tested without a clock; a Log keeps the States of many subjects
// by key, safe for concurrent use. Neither logs: they say what changed
// (Change), and the caller writes the line it has for it, at the verbosity
// the change asks for, and updates its metrics.
package statelog

import (
	"sync"
	"sync/atomic"
	"time"
)

// Change is what an observed value changed, and so what the caller tells.
type Change int8

const (
	// Same: nothing new to tell.
	Same Change = iota
	// Minor: the value differs from the one last seen, but the last one
	// told is younger than the interval: a detail, for a higher verbosity
	// (or none).
	Minor
	// First: the subject's first value, or the first since it was cleared.
	First
	// Changed: the value's class differs from the one last told, or the
	// value does and the interval since then has passed (with Repeat, the
	// same value once the interval has passed).
	Changed
)

// Loud says whether the change is told at the caller's usual verbosity:
// First or Changed.
func (c Change) Loud() bool { return c >= First }

// Rule says when a change is told.
type Rule struct {
	// Interval is the least time between two values told of one class;
	// zero: every change is told.
	Interval time.Duration
	// Repeat tells the same value again once Interval has passed: for
	// events that recur rather than a state that lasts.
	Repeat bool
}

// State is what was last seen and told of one subject. The zero State has
// seen nothing.
type State struct {
	set bool
	// since is when the subject was first observed after it was cleared.
	since time.Time
	// class and told are the class and value last told, at toldAt; seen
	// is the value last observed.
	class, told, seen string
	toldAt            time.Time
}

// Observe records value, of class (a coarse kind of value, such as a gRPC
// code: a change of class is told at once), observed at now, and says what
// changed under rule.
func (s *State) Observe(now time.Time, class, value string, rule Rule) Change {
	switch {
	case !s.set:
		*s = State{set: true, since: now, class: class, told: value, seen: value, toldAt: now}
		return First
	case class != s.class,
		(value != s.told || rule.Repeat) && now.Sub(s.toldAt) >= rule.Interval:
		s.class, s.told, s.seen, s.toldAt = class, value, value, now
		return Changed
	case value != s.seen:
		s.seen = value
		return Minor
	}
	return Same
}

// Clear forgets the subject's value: the next one is First. It says
// whether there was one, and for how long (since its First).
func (s *State) Clear(now time.Time) (was bool, lasted time.Duration) {
	if !s.set {
		return false, 0
	}
	lasted = now.Sub(s.since)
	*s = State{}
	return true, lasted
}

// Log keeps the State of each subject K under one Rule. The zero Log tells
// every change (Rule{}). It is safe for concurrent use.
type Log[K comparable] struct {
	Rule Rule
	// Now is the clock; nil: time.Now.
	Now func() time.Time

	mu     sync.Mutex
	states map[K]*State
	// held is len(states), read without the lock so that clearing a key
	// when no subject has a value (a hot path's common case: nothing to
	// tell) costs neither a clock read nor the lock.
	held atomic.Int64
}

func (l *Log[K]) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Observe records key's value (State.Observe).
func (l *Log[K]) Observe(key K, class, value string) Change {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.states[key]
	if s == nil {
		if l.states == nil {
			l.states = map[K]*State{}
		}
		s = &State{}
		l.states[key] = s
		l.held.Add(1)
	}
	return s.Observe(now, class, value, l.Rule)
}

// Clear forgets key's value (State.Clear). When no subject has a value it
// returns at once: a Clear that races an Observe of the same key is
// ordered before it, as it could be under the lock.
func (l *Log[K]) Clear(key K) (was bool, lasted time.Duration) {
	if l.held.Load() == 0 {
		return false, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.states[key]
	if s == nil {
		return false, 0
	}
	delete(l.states, key)
	l.held.Add(-1)
	return s.Clear(now)
}

// Retain forgets the subjects keep does not keep.
func (l *Log[K]) Retain(keep func(K) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.states {
		if !keep(k) {
			delete(l.states, k)
			l.held.Add(-1)
		}
	}
}
