package sidecar

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseResponsePhase reads --epp-response-phase: an error gives no
// phase; an accepted name is one of the three phases and reads back as
// itself.
//
// Trusted input: the operator's command line.
func FuzzParseResponsePhase(f *testing.F) {
	for _, s := range []string{"", "Relay", "Intercept", "Skip", "relay", " Relay", "Relay\x00", "Skipped"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseResponsePhase(s)
		if err != nil {
			require.Empty(t, p)
			require.Contains(t, err.Error(), "response phase")
			return
		}
		require.Contains(t, []ResponsePhase{ResponsePhaseRelay, ResponsePhaseIntercept, ResponsePhaseSkip}, p)
		require.True(t, s == "" || s == string(p), "%q read as %q", s, p)
		again, err := ParseResponsePhase(string(p))
		require.NoError(t, err)
		require.Equal(t, p, again)
	})
}
