package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

func TestDrainingAnnotationIsOneRule(t *testing.T) {
	tests := []struct {
		name         string
		value        *string
		wantDraining bool
		wantInvalid  bool
	}{
		{name: "no annotation: not draining"},
		{name: "true drains", value: ptr("true"), wantDraining: true},
		{name: "false is as no annotation", value: ptr("false")},
		{name: "another spelling makes the export invalid", value: ptr("True"), wantInvalid: true},
		{name: "an empty value makes the export invalid", value: ptr(""), wantInvalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
			if tt.value != nil {
				a[v1alpha1.DrainAnnotation] = *tt.value
			}
			draining, err := Draining(a)
			assert.Equal(t, tt.wantDraining, draining)
			_, exported, perr := ParseExport(a, nil)
			if tt.wantInvalid {
				require.Error(t, err)
				require.Error(t, perr)
				assert.Contains(t, perr.Error(), v1alpha1.DrainAnnotation)
				assert.False(t, exported)
				return
			}
			require.NoError(t, err)
			require.NoError(t, perr)
			assert.True(t, exported)
		})
	}
}

// A drained export stays in the import, Ready as before, with a Draining
// condition on its cluster's entry; its InferencePoolExport says so too,
// and a server that reads the member's summaries serves the same.
func TestDrainedExportStaysVisibleAndFlagged(t *testing.T) {
	drain := func(v string) poolOption {
		return func(p *poolv1.InferencePool) { p.Annotations[v1alpha1.DrainAnnotation] = v }
	}
	cs := clusterSet("cluster-b",
		member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool, drain("true")))...),
		member(t, "cluster-b", namespace(testNamespace)),
		member(t, "cluster-c", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
	)
	imp, ok := Import(cs, testNamespace, testPool)
	require.True(t, ok)
	require.Len(t, imp.Status.Clusters, 2)
	a, c := imp.Status.Clusters[0], imp.Status.Clusters[1]
	assert.True(t, meta.IsStatusConditionTrue(a.Conditions, v1alpha1.ConditionReady), "a draining cluster stays Ready: it serves what it holds")
	d := meta.FindStatusCondition(a.Conditions, v1alpha1.ConditionDraining)
	require.NotNil(t, d, "the draining cluster's entry says so")
	assert.Equal(t, metav1.ConditionTrue, d.Status)
	assert.Equal(t, v1alpha1.ReasonDrainRequested, d.Reason)
	assert.Contains(t, d.Message, v1alpha1.DrainAnnotation)
	assert.Nil(t, meta.FindStatusCondition(c.Conditions, v1alpha1.ConditionDraining), "a cluster that does not drain has no Draining condition")

	own := cs
	own.Local = "cluster-a"
	exp, ok := Export(own, testNamespace, testPool)
	require.True(t, ok)
	assert.True(t, meta.IsStatusConditionTrue(exp.Status.Conditions, v1alpha1.ConditionValid))
	assert.True(t, meta.IsStatusConditionTrue(exp.Status.Conditions, v1alpha1.ConditionDraining), "the exporter's InferencePoolExport says it drains")

	requireSummaryModeAgrees(t, cs)

	t.Run("an invalid drain value withdraws the export with the reason", func(t *testing.T) {
		cs := clusterSet("cluster-b",
			member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool, drain("yes")))...),
			member(t, "cluster-b", namespace(testNamespace)),
		)
		imp, ok := Import(cs, testNamespace, testPool)
		require.True(t, ok)
		r := meta.FindStatusCondition(imp.Status.Clusters[0].Conditions, v1alpha1.ConditionReady)
		require.NotNil(t, r)
		assert.Equal(t, v1alpha1.ReasonInvalidExport, r.Reason)
		assert.Contains(t, r.Message, v1alpha1.DrainAnnotation)
		assert.Nil(t, meta.FindStatusCondition(imp.Status.Clusters[0].Conditions, v1alpha1.ConditionDraining))
		requireSummaryModeAgrees(t, cs)
	})
}
