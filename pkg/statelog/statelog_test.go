package statelog

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// step is one observation at a time after the start; clear clears.
type step struct {
	at           time.Duration
	class, value string
	clear        bool
}

func TestStateTellsChangesOncePerInterval(t *testing.T) {
	see := func(at time.Duration, class, value string) step { return step{at: at, class: class, value: value} }
	clear := func(at time.Duration) step { return step{at: at, clear: true} }
	minute := Rule{Interval: time.Minute}
	tests := []struct {
		name  string
		rule  Rule
		steps []step
		want  []Change
	}{
		{
			name:  "the first value is told, the same again is not",
			rule:  minute,
			steps: []step{see(0, "", "refused"), see(time.Second, "", "refused"), see(time.Hour, "", "refused")},
			want:  []Change{First, Same, Same},
		},
		{
			name:  "another value within the interval is a detail, once per value seen",
			rule:  minute,
			steps: []step{see(0, "", "reset"), see(time.Second, "", "EOF"), see(2*time.Second, "", "EOF"), see(3*time.Second, "", "reset")},
			want:  []Change{First, Minor, Same, Minor},
		},
		{
			name:  "another value than the one told is told once the interval has passed, then not again within it",
			rule:  minute,
			steps: []step{see(0, "", "a"), see(time.Minute, "", "b"), see(90*time.Second, "", "a"), see(2*time.Minute+time.Second, "", "a")},
			want:  []Change{First, Changed, Minor, Changed},
		},
		{
			name:  "a change of class is told at once",
			rule:  minute,
			steps: []step{see(0, "Unavailable", "reset"), see(time.Second, "DeadlineExceeded", "timeout"), see(2*time.Second, "DeadlineExceeded", "timeout")},
			want:  []Change{First, Changed, Same},
		},
		{
			name:  "a cleared subject starts afresh",
			rule:  minute,
			steps: []step{see(0, "", "a"), clear(time.Second), see(2*time.Second, "", "a")},
			want:  []Change{First, Same, First},
		},
		{
			name:  "without an interval every change is told",
			steps: []step{see(0, "", "a"), see(0, "", "b"), see(0, "", "b"), see(0, "", "a")},
			want:  []Change{First, Changed, Same, Changed},
		},
		{
			name:  "Repeat tells the same value again once the interval has passed",
			rule:  Rule{Interval: time.Minute, Repeat: true},
			steps: []step{see(0, "", ""), see(30*time.Second, "", ""), see(time.Minute, "", ""), see(61*time.Second, "", "")},
			want:  []Change{First, Same, Changed, Same},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			var s State
			var got []Change
			for _, st := range tt.steps {
				if st.clear {
					s.Clear(start.Add(st.at))
					got = append(got, Same)
					continue
				}
				got = append(got, s.Observe(start.Add(st.at), st.class, st.value, tt.rule))
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestLogKeepsEachSubjectApart(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := Log[string]{Rule: Rule{Interval: time.Minute}, Now: func() time.Time { return now }}
	assert.Equal(t, First, l.Observe("a", "", "down"))
	assert.Equal(t, First, l.Observe("b", "", "down"), "another subject")
	assert.Equal(t, Same, l.Observe("a", "", "down"))

	now = now.Add(5 * time.Second)
	was, lasted := l.Clear("a")
	assert.True(t, was)
	assert.Equal(t, 5*time.Second, lasted, "since its first value")
	was, _ = l.Clear("a")
	assert.False(t, was, "cleared already")
	assert.Equal(t, First, l.Observe("a", "", "down"))

	l.Retain(func(k string) bool { return k == "a" })
	assert.Equal(t, Same, l.Observe("a", "", "down"), "kept")
	assert.Equal(t, First, l.Observe("b", "", "down"), "forgotten")
}

// Clearing keys of a Log that holds no value is what a hot path does on
// almost every event (nothing to tell): it reads no clock, and still
// clears a value once one is held, forgotten or retained away.
func TestLogClearsWithoutAClockWhenNothingIsHeld(t *testing.T) {
	reads := 0
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := Log[string]{Now: func() time.Time { reads++; return now }}
	was, _ := l.Clear("a")
	assert.False(t, was)
	assert.Zero(t, reads, "no clock read with nothing held")

	l.Observe("a", "", "down")
	l.Observe("b", "", "down")
	was, _ = l.Clear("a")
	assert.True(t, was, "a value held is cleared")
	l.Retain(func(string) bool { return false })
	reads = 0
	was, _ = l.Clear("b")
	assert.False(t, was, "retained away")
	assert.Zero(t, reads, "nothing held once Retain forgot the last value")

	l.Observe("b", "", "down")
	was, _ = l.Clear("b")
	assert.True(t, was, "held again after Retain emptied the log")
}
