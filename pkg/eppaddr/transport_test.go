package eppaddr

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestParseTransport(t *testing.T) {
	tests := []struct {
		value   string
		want    TransportModes
		wantErr string
	}{
		{value: "", want: TransportModes{}},
		{value: "TLS", want: TransportModes{ExtProc: "TLS", Health: "TLS", Metrics: "TLS"}},
		{value: " Plaintext ", want: TransportModes{ExtProc: "Plaintext", Health: "Plaintext", Metrics: "Plaintext"}},
		{value: "ext-proc=TLS", want: TransportModes{ExtProc: "TLS"}},
		{value: "ext-proc=TLS, health=Plaintext,metrics=Plaintext", want: TransportModes{ExtProc: "TLS", Health: "Plaintext", Metrics: "Plaintext"}},
		{value: "tls", wantErr: `transport mode "tls": want TLS or Plaintext`},
		{value: "ext-proc=TLS,ext-proc=Plaintext", wantErr: "port ext-proc is named twice"},
		{value: "grpc=TLS", wantErr: `unknown port "grpc"`},
		{value: "ext-proc=TLS,health", wantErr: `"health": want port=mode`},
		{value: "health=", wantErr: `port health: transport mode ""`},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := ParseTransport(tt.value)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Equal(t, TransportModes{}, got, "nothing half-parsed")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// targeting is a BackendTLSPolicy name, created age before a fixed time,
// that targets Service svc, or only its port named section.
func targeting(name, svc, section string, age time.Duration) *gatewayv1.BackendTLSPolicy {
	ref := gatewayv1.LocalPolicyTargetReferenceWithSectionName{LocalPolicyTargetReference: gatewayv1.LocalPolicyTargetReference{Kind: "Service", Name: gatewayv1.ObjectName(svc)}}
	if section != "" {
		ref.SectionName = ptr.To(gatewayv1.SectionName(section))
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &gatewayv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-age))},
		Spec:       gatewayv1.BackendTLSPolicySpec{TargetRefs: []gatewayv1.LocalPolicyTargetReferenceWithSectionName{ref}},
	}
}

func TestTLSPolicyForPort(t *testing.T) {
	other := targeting("other-service", "another-svc", "", 0)
	tests := []struct {
		name     string
		policies []*gatewayv1.BackendTLSPolicy
		port     string
		want     string
	}{
		{name: "no policy", port: "ext-proc"},
		{name: "a policy of another Service", policies: []*gatewayv1.BackendTLSPolicy{other}, port: "ext-proc"},
		{name: "a policy of the whole Service", policies: []*gatewayv1.BackendTLSPolicy{targeting("svc", "epp", "", 0)}, port: "ext-proc", want: "svc"},
		{name: "a policy of another port", policies: []*gatewayv1.BackendTLSPolicy{targeting("metrics", "epp", "metrics", 0)}, port: "ext-proc"},
		{name: "the port's own policy wins over the Service's", policies: []*gatewayv1.BackendTLSPolicy{targeting("svc", "epp", "", time.Hour), targeting("port", "epp", "ext-proc", 0)}, port: "ext-proc", want: "port"},
		{name: "the oldest of two for the same port", policies: []*gatewayv1.BackendTLSPolicy{targeting("young", "epp", "", 0), targeting("old", "epp", "", time.Hour)}, port: "ext-proc", want: "old"},
		{name: "an unnamed port gets the Service's policy only", policies: []*gatewayv1.BackendTLSPolicy{targeting("svc", "epp", "", 0), targeting("port", "epp", "ext-proc", 0)}, port: "", want: "svc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := TLSPolicyForPort(tt.policies, "epp", tt.port)
			if tt.want == "" {
				assert.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			assert.Equal(t, tt.want, got.Name)
		})
	}
}

func TestTLSPolicyForAPortNumber(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "epp"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "ext-proc", Port: 9002}, {Port: 9003}}}}
	policies := []*gatewayv1.BackendTLSPolicy{targeting("svc", "epp", "", time.Hour), targeting("port", "epp", "ext-proc", 0)}
	assert.Equal(t, "port", TLSPolicyFor(policies, svc, 9002).Name, "the port's name selects its own policy")
	assert.Equal(t, "svc", TLSPolicyFor(policies, svc, 9003).Name, "an unnamed port gets the Service's")
	assert.Nil(t, TLSPolicyFor(policies, svc, 0), "no port")
	assert.Nil(t, TLSPolicyFor(nil, svc, 9002), "no policy")
}

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
