package informerhealth

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// outcome is one List/Watch outcome told to a state: cause "" is a
// success.
type outcome struct {
	at    time.Duration
	cause string
}

func TestStateChangesOncePerChange(t *testing.T) {
	ok := func(at time.Duration) outcome { return outcome{at: at} }
	fail := func(at time.Duration, cause string) outcome { return outcome{at: at, cause: cause} }
	tests := []struct {
		name      string
		outcomes  []outcome
		want      []change
		failedFor time.Duration // of the last recovery
	}{
		{
			name:     "a first success is the first reachable state, later ones change nothing",
			outcomes: []outcome{ok(0), ok(time.Second), ok(2 * time.Second)},
			want:     []change{firstReachable, unchanged, unchanged},
		},
		{
			name:     "a failure before any success is a loss",
			outcomes: []outcome{fail(0, "connection refused")},
			want:     []change{lost},
		},
		{
			name:      "reachable, failing at every retry, reachable: one loss and one recovery",
			outcomes:  []outcome{ok(0), fail(time.Second, "service unavailable"), fail(2*time.Second, "service unavailable"), fail(4*time.Second, "service unavailable"), ok(9 * time.Second)},
			want:      []change{firstReachable, lost, unchanged, unchanged, recovered},
			failedFor: 8 * time.Second,
		},
		{
			name:     "another error within the minute after the last log line is not logged",
			outcomes: []outcome{fail(0, "service unavailable"), fail(30*time.Second, "connection refused"), fail(59*time.Second, "forbidden")},
			want:     []change{lost, unchanged, unchanged},
		},
		{
			name:     "another error a minute or more after the last log line is logged, then not again within the minute",
			outcomes: []outcome{fail(0, "service unavailable"), fail(time.Minute, "connection refused"), fail(90*time.Second, "service unavailable"), fail(2*time.Minute+time.Second, "service unavailable")},
			want:     []change{lost, newError, unchanged, newError},
		},
		{
			name:     "the same error for long is logged once",
			outcomes: []outcome{fail(0, "connection refused"), fail(time.Minute, "connection refused"), fail(time.Hour, "connection refused")},
			want:     []change{lost, unchanged, unchanged},
		},
		{
			name:      "a recovery counts from the first failure, and a new loss starts afresh",
			outcomes:  []outcome{ok(0), fail(time.Second, "a"), fail(2*time.Minute, "b"), ok(3 * time.Minute), fail(4*time.Minute, "a"), ok(4*time.Minute + 500*time.Millisecond)},
			want:      []change{firstReachable, lost, newError, recovered, lost, recovered},
			failedFor: 500 * time.Millisecond,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			var s state
			var got []change
			var failedFor time.Duration
			for _, o := range tt.outcomes {
				now := start.Add(o.at)
				if o.cause == "" {
					ch, d := s.succeeded(now)
					if ch == recovered {
						failedFor = d
					}
					got = append(got, ch)
				} else {
					got = append(got, s.failed(now, o.cause))
				}
			}
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.failedFor, failedFor)
		})
	}
}
