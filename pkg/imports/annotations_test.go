package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestParseExport(t *testing.T) {
	const (
		exportKey = v1alpha1.ExportAnnotation
		modeKey   = v1alpha1.ExportModeAnnotation
		secretKey = v1alpha1.EndpointPickerSecretAnnotation
	)
	tests := []struct {
		name         string
		annotations  map[string]string
		wantMode     inference.RoutingMode
		wantExported bool
		// wantErr lists substrings the error must contain; none means no error.
		wantErr []string
	}{
		{
			name:        "a pool without annotations is not exported and is not an error",
			annotations: nil,
		},
		{
			name:        "unrelated annotations do not export a pool",
			annotations: map[string]string{"example.com/owner": "team-a"},
		},
		{
			name:         "export ClusterSet exports in EndpointMode by default",
			annotations:  map[string]string{exportKey: "ClusterSet"},
			wantMode:     inference.RoutingModeEndpoint,
			wantExported: true,
		},
		{
			name:         "an explicit EndpointMode is honoured",
			annotations:  map[string]string{exportKey: "ClusterSet", modeKey: "EndpointMode"},
			wantMode:     inference.RoutingModeEndpoint,
			wantExported: true,
		},
		{
			name:         "ParentMode is honoured",
			annotations:  map[string]string{exportKey: "ClusterSet", modeKey: "ParentMode"},
			wantMode:     inference.RoutingModeParent,
			wantExported: true,
		},
		{
			name:        "export-mode without export is invalid and says which annotation to add",
			annotations: map[string]string{modeKey: "ParentMode"},
			wantErr:     []string{`"` + modeKey + `"`, `"ParentMode"`, `"` + exportKey + `"`, `"ClusterSet"`},
		},
		{
			name:        "an export value in the wrong case is invalid and quotes the allowed value",
			annotations: map[string]string{exportKey: "clusterset"},
			wantErr:     []string{`"clusterset"`, `"ClusterSet"`},
		},
		{
			name:        "an empty export value is invalid",
			annotations: map[string]string{exportKey: ""},
			wantErr:     []string{`""`, `"ClusterSet"`},
		},
		{
			name:        "an unknown export-mode is invalid and lists the allowed modes",
			annotations: map[string]string{exportKey: "ClusterSet", modeKey: "GatewayMode"},
			wantErr:     []string{`"GatewayMode"`, `"EndpointMode"`, `"ParentMode"`},
		},
		{
			name:        "an empty export-mode is invalid",
			annotations: map[string]string{exportKey: "ClusterSet", modeKey: ""},
			wantErr:     []string{`""`, `"EndpointMode"`, `"ParentMode"`},
		},
		{
			name:        "both annotations wrong reports both problems",
			annotations: map[string]string{exportKey: "Global", modeKey: "Direct"},
			wantErr:     []string{`"Global"`, `"Direct"`},
		},
		{
			name:         "an endpoint-picker-secret naming a Secret keeps the export valid",
			annotations:  map[string]string{exportKey: "ClusterSet", secretKey: "epp-client-tls"},
			wantMode:     inference.RoutingModeEndpoint,
			wantExported: true,
		},
		{
			name:        "an endpoint-picker-secret that is not a Secret name makes the export invalid",
			annotations: map[string]string{exportKey: "ClusterSet", secretKey: "example/epp-tls"},
			wantErr:     []string{`"` + secretKey + `"`, `"example/epp-tls"`, "not a Secret name"},
		},
		{
			name:         "an endpoint-picker-metrics-token-secret naming a Secret keeps the export valid",
			annotations:  map[string]string{exportKey: "ClusterSet", v1alpha1.EndpointPickerMetricsTokenSecretAnnotation: "epp-metrics-token"},
			wantMode:     inference.RoutingModeEndpoint,
			wantExported: true,
		},
		{
			name:        "an endpoint-picker-metrics-token-secret that is not a Secret name makes the export invalid",
			annotations: map[string]string{exportKey: "ClusterSet", v1alpha1.EndpointPickerMetricsTokenSecretAnnotation: "Token!"},
			wantErr:     []string{`"` + v1alpha1.EndpointPickerMetricsTokenSecretAnnotation + `"`, `"Token!"`, "not a Secret name"},
		},
		{
			name:        "an empty endpoint-picker-secret makes the export invalid",
			annotations: map[string]string{exportKey: "ClusterSet", secretKey: ""},
			wantErr:     []string{`"` + secretKey + `"`, `""`},
		},
		{
			name:        "a bad endpoint-picker-secret is reported with the other problems",
			annotations: map[string]string{exportKey: "Global", secretKey: "Upper"},
			wantErr:     []string{`"Global"`, `"Upper"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mode, exported, err := ParseExport(tc.annotations, nil)
			if len(tc.wantErr) == 0 {
				require.NoError(t, err)
				assert.Equal(t, tc.wantExported, exported)
				assert.Equal(t, tc.wantMode, mode)
				return
			}
			require.Error(t, err)
			assert.False(t, exported, "an invalid export must not export the pool")
			assert.Empty(t, mode)
			for _, s := range tc.wantErr {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func FuzzParseExport(f *testing.F) {
	f.Add(true, "ClusterSet", true, "EndpointMode")
	f.Add(true, "ClusterSet", true, "ParentMode")
	f.Add(false, "", true, "ParentMode")
	f.Add(true, "clusterset", false, "")
	f.Add(true, "\x00\xff", true, "\n")
	f.Fuzz(func(t *testing.T, hasExport bool, export string, hasMode bool, mode string) {
		a := map[string]string{}
		if hasExport {
			a[v1alpha1.ExportAnnotation] = export
		}
		if hasMode {
			a[v1alpha1.ExportModeAnnotation] = mode
		}
		got, exported, err := ParseExport(a, nil)
		switch {
		case err != nil:
			if err.Error() == "" {
				t.Fatalf("empty error for %q", a)
			}
			if exported || got != "" {
				t.Fatalf("invalid export %q returned exported=%v mode=%q", a, exported, got)
			}
		case exported:
			if got != inference.RoutingModeEndpoint && got != inference.RoutingModeParent {
				t.Fatalf("exported with unknown mode %q for %q", got, a)
			}
		default:
			if hasExport || hasMode {
				t.Fatalf("annotations %q neither exported nor rejected", a)
			}
		}
	})
}
