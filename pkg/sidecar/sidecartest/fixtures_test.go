package sidecartest_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// TestBackendRefsNameWhatTheSidecarRoutes holds the groups and kinds of the
// fixtures' backendRefs, which sidecartest cannot import from the sidecar,
// to the sidecar's.
func TestBackendRefsNameWhatTheSidecarRoutes(t *testing.T) {
	weight := int32(3)
	tests := []struct {
		name            string
		ref             gatewayv1.HTTPBackendRef
		wantGroup, kind string
	}{
		{name: "InferencePool", ref: sidecartest.PoolRef("llm", &weight), wantGroup: routetable.InferencePoolGroup, kind: routetable.InferencePoolKind},
		{name: "InferencePoolImport", ref: sidecartest.ImportRef("llm", &weight), wantGroup: routetable.InferencePoolImportGroup, kind: routetable.InferencePoolImportKind},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NotNil(t, tt.ref.Group)
			require.NotNil(t, tt.ref.Kind)
			assert.Equal(t, tt.wantGroup, string(*tt.ref.Group))
			assert.Equal(t, tt.kind, string(*tt.ref.Kind))
			assert.Equal(t, gatewayv1.ObjectName("llm"), tt.ref.Name)
			assert.Equal(t, &weight, tt.ref.Weight)
		})
	}
}
