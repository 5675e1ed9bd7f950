package imports

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestParseExportRejectsABadTransport(t *testing.T) {
	_, exported, err := ParseExport(map[string]string{
		v1alpha1.ExportAnnotation:                  v1alpha1.ExportScopeClusterSet,
		v1alpha1.EndpointPickerTransportAnnotation: "ext-proc=tls",
	}, nil)
	require.Error(t, err)
	assert.False(t, exported, "never exported to be reached in a transport nobody asked for")
	assert.Contains(t, err.Error(), `"ext-proc=tls"`)
}

func btlsPolicy(name string, age time.Duration, section string) *gatewayv1.BackendTLSPolicy {
	ref := gatewayv1.LocalPolicyTargetReferenceWithSectionName{LocalPolicyTargetReference: gatewayv1.LocalPolicyTargetReference{Kind: "Service", Name: testEPP}}
	if section != "" {
		ref.SectionName = ptr(gatewayv1.SectionName(section))
	}
	return &gatewayv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-age))},
		Spec: gatewayv1.BackendTLSPolicySpec{
			TargetRefs: []gatewayv1.LocalPolicyTargetReferenceWithSectionName{ref},
			Validation: gatewayv1.BackendTLSPolicyValidation{
				CACertificateRefs: []gatewayv1.LocalObjectReference{{Kind: "ConfigMap", Name: gatewayv1.ObjectName(name + "-ca")}},
				Hostname:          "epp.example.com",
			},
		},
	}
}

func TestImportCarriesTheTransportOfEachPort(t *testing.T) {
	validation := func(name string) *inference.BackendTLSValidation {
		return &inference.BackendTLSValidation{PolicyName: name, CACertificateRefs: []inference.CACertificateRef{{Kind: "ConfigMap", Name: name + "-ca"}}, Hostname: "epp.example.com"}
	}
	tls := inference.TransportTLS
	plain := inference.TransportPlaintext
	tests := []struct {
		name                                 string
		annotation                           string
		policies                             []*gatewayv1.BackendTLSPolicy
		wantExtProc, wantHealth, wantMetrics *inference.EndpointTransport
	}{
		{name: "no annotation, no policy: nothing said, the importer decides"},
		{
			name:        "the upstream defaults: ext-proc over TLS",
			annotation:  "ext-proc=TLS",
			wantExtProc: &inference.EndpointTransport{Mode: tls},
		},
		{
			name:        "one mode for every port",
			annotation:  "Plaintext",
			wantExtProc: &inference.EndpointTransport{Mode: plain}, wantHealth: &inference.EndpointTransport{Mode: plain}, wantMetrics: &inference.EndpointTransport{Mode: plain},
		},
		{
			name:        "a BackendTLSPolicy of the Service makes ext-proc TLS and verifies every TLS port; health stays as asked",
			annotation:  "health=Plaintext",
			policies:    []*gatewayv1.BackendTLSPolicy{btlsPolicy("svc", 0, "")},
			wantExtProc: &inference.EndpointTransport{Mode: tls, Validation: validation("svc")},
			wantHealth:  &inference.EndpointTransport{Mode: plain, Validation: validation("svc")},
			wantMetrics: &inference.EndpointTransport{Validation: validation("svc")},
		},
		{
			name:        "a BackendTLSPolicy of the metrics port only",
			annotation:  "metrics=TLS",
			policies:    []*gatewayv1.BackendTLSPolicy{btlsPolicy("metrics", 0, "metrics")},
			wantMetrics: &inference.EndpointTransport{Mode: tls, Validation: validation("metrics")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []poolOption
			if tt.annotation != "" {
				opts = append(opts, annotations(map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet, v1alpha1.EndpointPickerTransportAnnotation: tt.annotation}))
			}
			objs := objects(nsObjects("ns"), readyEPP("ns", "pool", opts...))
			for _, p := range tt.policies {
				objs = append(objs, p)
			}
			cs := clusterSet("cluster-b", member(t, "cluster-a", objs...), member(t, "cluster-b", nsObjects("ns")...))
			imp, ok := Import(cs, "ns", "pool")
			require.True(t, ok)
			require.Len(t, imp.Status.Clusters, 1)
			epp := imp.Status.Clusters[0].EndpointPicker
			require.NotNil(t, epp.Health)
			require.NotNil(t, epp.Metrics)
			assert.Equal(t, tt.wantExtProc, epp.Transport, "ext-proc")
			assert.Equal(t, tt.wantHealth, epp.Health.Transport, "health")
			assert.Equal(t, tt.wantMetrics, epp.Metrics.Transport, "metrics")
		})
	}
}
