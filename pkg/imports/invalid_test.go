package imports

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// An exporter whose export is invalid stays in the import, not Ready, with
// the exporter's reason: the importing cluster's users see why a cluster
// they expected is not routable, instead of one exporter fewer.
func TestInvalidExportsAreListedNotReady(t *testing.T) {
	exportTo := func(extra map[string]string) map[string]string {
		a := map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
		for k, v := range extra {
			a[k] = v
		}
		return a
	}
	policy := func(v string) map[string]string { return map[string]string{v1alpha1.ClusterPolicyAnnotation: v} }
	tests := []struct {
		name string
		// cluster-a's pool options; cluster-b always exports validly.
		a []poolOption
		// wantReady is cluster-a's Ready status; wantMessage what its
		// message must quote when it is not Ready.
		wantReady   bool
		wantMessage []string
	}{
		{
			name:        "a typo in the export annotation: listed, not Ready, with the exporter's reason",
			a:           []poolOption{annotations(map[string]string{v1alpha1.ExportAnnotation: "Clusterset"})},
			wantMessage: []string{"cluster cluster-a: invalid export", `"Clusterset"`, `"ClusterSet"`},
		},
		{
			name:        "an unknown routing mode",
			a:           []poolOption{annotations(exportTo(map[string]string{v1alpha1.ExportModeAnnotation: "Endpoint"}))},
			wantMessage: []string{`"Endpoint"`, "EndpointMode"},
		},
		{
			name:        "an unknown cluster policy in the pool's annotation makes the export invalid",
			a:           []poolOption{annotations(exportTo(policy("Fastest")))},
			wantMessage: []string{"annotation", v1alpha1.ClusterPolicyAnnotation, `"Fastest"`, "PrefixAffinity"},
		},
		{
			name:        "an inline configuration that does not parse",
			a:           []poolOption{annotations(exportTo(policy("prefix-cache=3,speed=2")))},
			wantMessage: []string{`"speed"`},
		},
		{
			name:        "an unknown cluster policy in the pool's label (the one imports carry)",
			a:           []poolOption{labelled(policy("Fastest"))},
			wantMessage: []string{"label", `"Fastest"`},
		},
		{
			name:      "a named cluster policy is valid",
			a:         []poolOption{annotations(exportTo(policy("MetricsBased"))), labelled(policy("PrefixAffinity"))},
			wantReady: true,
		},
		{
			name:      "an inline configuration that parses is valid",
			a:         []poolOption{annotations(exportTo(policy("prefix-cache=3,queue=2,kv-cache=2,affinity-margin=off")))},
			wantReady: true,
		},
		{
			name:      "an empty cluster policy names none, as sidecars read it",
			a:         []poolOption{annotations(exportTo(policy(""))), labelled(policy(""))},
			wantReady: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := clusterSet("cluster-c",
				member(t, "cluster-a", readyEPP(testNamespace, testPool, tc.a...)...),
				member(t, "cluster-b", readyEPP(testNamespace, testPool)...),
				member(t, "cluster-c", namespace(testNamespace)),
			)
			imp, ok := importBothWays(t, cs, testNamespace, testPool)
			require.True(t, ok)
			require.Equal(t, []string{"cluster-a", "cluster-b"}, clusterNames(imp))
			a := imp.Status.Clusters[0]
			ready := condition(t, a.Conditions, v1alpha1.ConditionReady)
			assert.Equal(t, condStatus(tc.wantReady), ready.Status, ready.Message)
			assert.Equal(t, metav1.ConditionTrue, condition(t, imp.Status.Conditions, v1alpha1.ConditionReady).Status, "cluster-b still serves the import")
			if tc.wantReady {
				return
			}
			assert.Equal(t, v1alpha1.ReasonInvalidExport, ready.Reason)
			for _, s := range tc.wantMessage {
				assert.Contains(t, ready.Message, s)
			}
			assert.Empty(t, a.RoutingMode, "an invalid export asks for no mode")
			assert.Equal(t, inference.EndpointPickerImport{}, a.EndpointPicker, "nor gives an EPP to reach")

			// The exporting side says the same in its Valid condition.
			own := cs
			own.Local = "cluster-a"
			exp, ok := Export(own, testNamespace, testPool)
			require.True(t, ok)
			valid := condition(t, exp.Status.Conditions, v1alpha1.ConditionValid)
			assert.Equal(t, v1alpha1.ReasonInvalidExport, valid.Reason)
			assert.Equal(t, "cluster cluster-a: "+valid.Message, ready.Message)
		})
	}
}

func TestAnImportOfInvalidExportsOnlySaysWhy(t *testing.T) {
	cs := clusterSet("cluster-b",
		member(t, "cluster-a", readyEPP(testNamespace, testPool, annotations(map[string]string{v1alpha1.ExportAnnotation: "Everywhere"}))...),
		member(t, "cluster-b", namespace(testNamespace)),
	)
	imp, ok := importBothWays(t, cs, testNamespace, testPool)
	require.True(t, ok)
	ready := condition(t, imp.Status.Conditions, v1alpha1.ConditionReady)
	assert.Equal(t, metav1.ConditionFalse, ready.Status)
	assert.Equal(t, v1alpha1.ReasonNotReady, ready.Reason)
	assert.Contains(t, ready.Message, "cluster-a: InvalidExport: cluster cluster-a: invalid export")
}

// An unreachable member's last known EPP stays a candidate for sidecars;
// an invalid export never had one, so it stays InvalidExport.
func TestAnUnreachableInvalidExportStaysInvalid(t *testing.T) {
	cs := clusterSet("cluster-b",
		unreachable(member(t, "cluster-a", readyEPP(testNamespace, testPool, labelled(map[string]string{v1alpha1.ClusterPolicyAnnotation: "Fastest"}))...), t0, "connection refused"),
		member(t, "cluster-b", namespace(testNamespace)),
	)
	imp, ok := importBothWays(t, cs, testNamespace, testPool)
	require.True(t, ok)
	ready := condition(t, imp.Status.Clusters[0].Conditions, v1alpha1.ConditionReady)
	assert.Equal(t, v1alpha1.ReasonInvalidExport, ready.Reason)
	assert.Contains(t, ready.Message, `"Fastest"`)
}

// The import carries the labels of its oldest exporter, valid ones first:
// an invalid export's labels (its cluster policy) never reach importers in
// place of a valid one's.
func TestImportMetadataComesFromTheOldestValidExporter(t *testing.T) {
	bad := map[string]string{v1alpha1.ClusterPolicyAnnotation: "Fastest", "from": "cluster-a"}
	tests := []struct {
		name        string
		b           []poolOption
		wantLabels  map[string]string
		wantCreated time.Time
	}{
		{
			name:        "a younger valid exporter wins over an older invalid one",
			b:           []poolOption{created(t0.Add(time.Hour)), labelled(map[string]string{"from": "cluster-b"})},
			wantLabels:  map[string]string{"from": "cluster-b"},
			wantCreated: t0.Add(time.Hour),
		},
		{
			name:        "with no valid exporter, the oldest invalid one",
			b:           []poolOption{created(t0.Add(time.Hour)), annotations(map[string]string{v1alpha1.ExportAnnotation: "Everywhere"})},
			wantLabels:  bad,
			wantCreated: t0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := clusterSet("cluster-c",
				member(t, "cluster-a", readyEPP(testNamespace, testPool, created(t0), labelled(bad))...),
				member(t, "cluster-b", readyEPP(testNamespace, testPool, tc.b...)...),
				member(t, "cluster-c", namespace(testNamespace)),
			)
			imp, ok := importBothWays(t, cs, testNamespace, testPool)
			require.True(t, ok)
			assert.Equal(t, tc.wantLabels, imp.Labels)
			assert.True(t, imp.CreationTimestamp.Time.Equal(tc.wantCreated), "created %v", imp.CreationTimestamp)
		})
	}
}

func condStatus(ok bool) metav1.ConditionStatus {
	if ok {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}
