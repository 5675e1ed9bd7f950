package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestResolveTransport(t *testing.T) {
	secret := types.NamespacedName{Namespace: "example", Name: "epp-creds"}
	policy := &v1alpha1.BackendTLSValidation{PolicyName: "epp-tls", Hostname: "epp.example.com", CACertificateRefs: []v1alpha1.CACertificateRef{{Kind: "ConfigMap", Name: "epp-ca"}}}
	tests := []struct {
		name       string
		port       string
		explicit   string
		secret     types.NamespacedName
		validation *v1alpha1.BackendTLSValidation
		def        string
		wantKind   string
		wantErr    string
	}{
		{name: "nothing said: plaintext, as before", port: PortExtProc, wantKind: TransportKindPlaintext},
		{name: "the sidecar's default TLS, nothing to verify with: TLS not verified", port: PortExtProc, def: "TLS", wantKind: TransportKindUnverified},
		{name: "the pool's TLS wins over the sidecar's default", port: PortHealth, explicit: "Plaintext", def: "TLS", wantKind: TransportKindPlaintext},
		{name: "a Secret makes every port TLS with it", port: PortHealth, secret: secret, wantKind: TransportKindSecret},
		{name: "a Secret wins over the sidecar's plaintext default", port: PortMetrics, secret: secret, def: "Plaintext", wantKind: TransportKindSecret},
		{name: "the pool's Plaintext for the health port of a Secret's EPP", port: PortHealth, explicit: "Plaintext", secret: secret, wantKind: TransportKindPlaintext},
		{name: "a BackendTLSPolicy makes ext-proc TLS, verified", port: PortExtProc, validation: policy, wantKind: TransportKindVerified},
		{name: "a BackendTLSPolicy of the whole Service leaves the health port as asked", port: PortHealth, validation: policy, wantKind: TransportKindPlaintext},
		{name: "a BackendTLSPolicy verifies a health port asked to be TLS", port: PortHealth, explicit: "TLS", validation: policy, wantKind: TransportKindVerified},
		{name: "the Secret verifies when both say how", port: PortExtProc, secret: secret, validation: policy, wantKind: TransportKindSecret},
		{name: "Plaintext for an ext-proc port a BackendTLSPolicy targets is refused", port: PortExtProc, explicit: "Plaintext", validation: policy, wantErr: "BackendTLSPolicy epp-tls targets the EPP's ext-proc port, but its transport is Plaintext"},
		{name: "an unknown mode is refused", port: PortExtProc, explicit: "mTLS", wantErr: `unknown transport mode "mTLS"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolvePortTransport(tt.port, tt.explicit, tt.secret, tt.validation, "example", tt.def)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantKind, got.Kind())
		})
	}
}
