package clusterset

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

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
			m := &member{name: "cluster-a", lastError: tc.lastError}
			assert.EqualError(t, m.pendingProbeError(), tc.want)
		})
	}
}
