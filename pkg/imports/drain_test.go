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

// A member drained as a whole (the drain annotation on the Secret or
// ClusterProfile that names it: Member.Draining) flags every export of its
// cluster, Ready as before, with the member's reason; where its pool
// drains too, the pool's drain is the one named; the local member's
// InferencePoolExports say it; an invalid export is not flagged.
func TestADrainedMemberFlagsEveryExportOfItsCluster(t *testing.T) {
	const other = "second-pool"
	drain := func(p *poolv1.InferencePool) { p.Annotations[v1alpha1.DrainAnnotation] = "true" }
	invalid := func(p *poolv1.InferencePool) { p.Annotations[v1alpha1.DrainAnnotation] = "yes" }
	drained := func(m Member) Member { m.Draining = true; return m }
	cs := clusterSet("cluster-b",
		drained(member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool), readyEPP(testNamespace, other, drain), readyEPP(testNamespace, "invalid-pool", invalid))...)),
		member(t, "cluster-b", namespace(testNamespace)),
		member(t, "cluster-c", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
	)
	for _, tt := range []struct {
		pool       string
		wantReason string
	}{
		{pool: testPool, wantReason: v1alpha1.ReasonMemberDrainRequested},
		{pool: other, wantReason: v1alpha1.ReasonDrainRequested},
		{pool: "invalid-pool"},
	} {
		t.Run(tt.pool, func(t *testing.T) {
			imp, ok := Import(cs, testNamespace, tt.pool)
			require.True(t, ok)
			a := imp.Status.Clusters[0]
			require.Equal(t, "cluster-a", a.Name)
			d := meta.FindStatusCondition(a.Conditions, v1alpha1.ConditionDraining)
			if tt.wantReason == "" {
				assert.Nil(t, d, "an invalid export has nothing to drain")
				return
			}
			assert.True(t, meta.IsStatusConditionTrue(a.Conditions, v1alpha1.ConditionReady), "a draining cluster stays Ready: it serves what it holds")
			require.NotNil(t, d)
			assert.Equal(t, metav1.ConditionTrue, d.Status)
			assert.Equal(t, tt.wantReason, d.Reason)
			assert.Contains(t, d.Message, v1alpha1.DrainAnnotation)
			if len(imp.Status.Clusters) > 1 {
				assert.Nil(t, meta.FindStatusCondition(imp.Status.Clusters[1].Conditions, v1alpha1.ConditionDraining), "the other member does not drain")
			}
		})
	}
	requireSummaryModeAgrees(t, cs)

	own := cs
	own.Local = "cluster-a"
	exp, ok := Export(own, testNamespace, testPool)
	require.True(t, ok)
	d := meta.FindStatusCondition(exp.Status.Conditions, v1alpha1.ConditionDraining)
	require.NotNil(t, d, "the drained member's own InferencePoolExport says it drains")
	assert.Equal(t, v1alpha1.ReasonMemberDrainRequested, d.Reason)
}
