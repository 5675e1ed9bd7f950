package clusterset

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestAFailingMemberIsFlaggedThenRemovedAndComesBack(t *testing.T) {
	th := thresholds{unreachableAfter: 10 * time.Second, removeAfter: time.Minute}
	down := errors.New("connection refused")
	type probe struct {
		at          time.Duration // since the first probe
		err         error
		wantChanged bool
		wantState   string // reachable, unreachable, removed
		wantNext    time.Duration
	}
	tests := []struct {
		name   string
		th     thresholds
		probes []probe
	}{
		{
			name: "a member failing past each threshold is flagged, then removed",
			th:   th,
			probes: []probe{
				{at: 0, err: down, wantState: "reachable", wantNext: 10 * time.Second},
				{at: 4 * time.Second, err: down, wantState: "reachable", wantNext: 6 * time.Second},
				{at: 10 * time.Second, err: down, wantChanged: true, wantState: "unreachable", wantNext: 50 * time.Second},
				{at: 30 * time.Second, err: down, wantState: "unreachable", wantNext: 30 * time.Second},
				{at: time.Minute, err: down, wantChanged: true, wantState: "removed"},
				{at: 2 * time.Minute, err: down, wantState: "removed"},
				{at: 2*time.Minute + time.Second, wantChanged: true, wantState: "reachable"},
			},
		},
		{
			name: "a member that answers before the threshold was never flagged",
			th:   th,
			probes: []probe{
				{at: 0, err: down, wantState: "reachable", wantNext: 10 * time.Second},
				{at: 9 * time.Second, wantState: "reachable"},
				// Failing since it last answered, at 9s.
				{at: 10 * time.Second, err: down, wantState: "reachable", wantNext: 9 * time.Second},
			},
		},
		{
			name: "an outage counts from the last answer, not from the probe that noticed it",
			th:   th,
			probes: []probe{
				{at: 0, wantState: "reachable"},
				{at: 8 * time.Second, err: down, wantState: "reachable", wantNext: 2 * time.Second},
				{at: 10 * time.Second, err: down, wantChanged: true, wantState: "unreachable", wantNext: 50 * time.Second},
			},
		},
		{
			name: "the local cluster is flagged but never removed",
			th:   thresholds{unreachableAfter: 10 * time.Second},
			probes: []probe{
				{at: 0, err: down, wantState: "reachable", wantNext: 10 * time.Second},
				{at: 10 * time.Second, err: down, wantChanged: true, wantState: "unreachable"},
				{at: time.Hour, err: down, wantState: "unreachable"},
			},
		},
	}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &reachability{}
			for _, p := range tc.probes {
				changed, next := r.assess(t0.Add(p.at), t0.Add(p.at), p.err, tc.th)
				assert.Equal(t, p.wantChanged, changed, "changed at %s", p.at)
				assert.Equal(t, p.wantNext, next, "time to the next threshold at %s", p.at)
				state := "reachable"
				if st := r.status(); st != nil {
					state = "unreachable"
					if st.removed {
						state = "removed"
					}
				}
				assert.Equal(t, p.wantState, state, "state at %s", p.at)
			}
		})
	}
}

func TestAThresholdCrossedDuringAProbeIsLoggedWithThePreviousProbesError(t *testing.T) {
	tests := []struct {
		name      string
		lastError string
		want      string
	}{
		{name: "a member that never answered a probe", want: errProbePending.Error()},
		{
			name:      "a member whose last probe failed",
			lastError: "Get \"https://127.0.0.77:1/readyz\": dial tcp 127.0.0.77:1: connect: connection refused",
			want:      "Get \"https://127.0.0.77:1/readyz\": dial tcp 127.0.0.77:1: connect: connection refused (the latest probe has not answered yet)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &reachability{lastError: tc.lastError}
			assert.EqualError(t, r.pendingProbeError(), tc.want)
		})
	}
}
