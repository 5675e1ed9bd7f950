package eppaddr

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// FuzzParseTransport feeds ParseTransport what an exporter may write in
// its pool's endpoint-picker-transport annotation (which reaches every
// importing sidecar). It never panics, and an accepted value is exactly
// what it says: every mode is TLS, Plaintext or unset; a port is Plaintext
// only when the value says Plaintext (no spelling downgrades a port that
// was asked for TLS); the modes written back parse to the same modes; and
// a rejected value yields nothing half-parsed.
func FuzzParseTransport(f *testing.F) {
	for _, seed := range []string{
		"", " ", "TLS", "Plaintext", " Plaintext ", "tls", "plaintext", "TLS ",
		"ext-proc=TLS", "ext-proc=TLS,health=Plaintext,metrics=Plaintext",
		"ext-proc=TLS, health=Plaintext", "health=TLS,health=TLS", "ext-proc=TLS,ext-proc=Plaintext",
		"grpc=TLS", "ext-proc", "ext-proc=", "=TLS", ",", "ext-proc=TLS,", "ext-proc==TLS",
		"ext-proc=TLS=Plaintext", "ext-proc=TLS\x00", "ext-proc=\u0054LS", "ext\u2011proc=TLS",
		"EXT-PROC=TLS", "metrics=Plain text", strings.Repeat("ext-proc=TLS,", 1000),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		got, err := ParseTransport(value)
		if err != nil {
			require.Equal(t, TransportModes{}, got, "a rejected value yields nothing half-parsed")
			return
		}
		modes := []string{got.ExtProc, got.Health, got.Metrics}
		for _, m := range modes {
			require.Contains(t, []string{"", string(v1alpha1.TransportTLS), string(v1alpha1.TransportPlaintext)}, m, "mode of %q", value)
			if m == string(v1alpha1.TransportPlaintext) {
				require.Contains(t, value, string(v1alpha1.TransportPlaintext), "a port is Plaintext only when the value says so")
			}
		}
		if !strings.Contains(value, "=") {
			require.Equal(t, got.ExtProc, got.Health, "one mode for every port")
			require.Equal(t, got.ExtProc, got.Metrics, "one mode for every port")
		}
		var pairs []string
		for i, port := range []string{PortExtProc, PortHealth, PortMetrics} {
			if modes[i] != "" {
				pairs = append(pairs, port+"="+modes[i])
			}
		}
		again, err := ParseTransport(strings.Join(pairs, ","))
		require.NoError(t, err, "the modes written back parse")
		require.Equal(t, got, again, "the modes written back parse to the same modes")
	})
}
