package imports

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	inferencelisters "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha1"
)

// summaryMode is cs as a server sees it when every member other than the
// local one publishes summaries: each such member is replaced by what its
// own server publishes (ExportSummaries and ClusterSummary computed with it
// as the local cluster), served in the API's version.
func summaryMode(tb testing.TB, cs ClusterSet) ClusterSet {
	tb.Helper()
	out := cs
	out.Members = make([]Member, len(cs.Members))
	for i, m := range cs.Members {
		if m.Name == cs.Local {
			out.Members[i] = m
			continue
		}
		own := cs
		own.Local = m.Name
		idx := newIndexer()
		for _, s := range ExportSummaries(own, "") {
			var served v1alpha1.InferencePoolExportSummary
			require.NoError(tb, v1alpha1.Convert_inference_InferencePoolExportSummary_To_v1alpha1_InferencePoolExportSummary(s, &served, nil))
			require.NoError(tb, idx.Add(&served))
		}
		out.Members[i] = Member{
			Name:        m.Name,
			Labels:      m.Labels,
			Draining:    m.Draining,
			Unreachable: m.Unreachable,
			Namespaces:  SummaryNamespaces(ClusterSummary(own).Status.Namespaces),
			Summaries:   inferencelisters.NewInferencePoolExportSummaryLister(idx),
		}
	}
	return out
}

// requireSummaryModeAgrees requires a server that reads the other members'
// summaries to serve exactly what one that watches their objects serves.
func requireSummaryModeAgrees(tb testing.TB, cs ClusterSet) {
	tb.Helper()
	summaries := summaryMode(tb, cs)
	require.Equal(tb, Imports(cs, ""), Imports(summaries, ""), "imports differ in summary mode")
	require.Equal(tb, Exports(cs, ""), Exports(summaries, ""), "exports differ in summary mode")
	for _, imp := range Imports(cs, "") {
		one, ok := Import(summaries, imp.Namespace, imp.Name)
		require.True(tb, ok, "summary mode does not serve %s/%s", imp.Namespace, imp.Name)
		require.Equal(tb, imp, one, "Import of %s/%s differs in summary mode", imp.Namespace, imp.Name)
	}
}

// Before the cache holds the local cluster, nothing is served, and nothing
// panics.
func TestNothingIsComputedWithoutTheLocalCluster(t *testing.T) {
	for _, cs := range []ClusterSet{{Name: testClusterSet, Local: "a"}, clusterSet("a", member(t, "b", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...))} {
		require.Empty(t, ExportSummaries(cs, ""))
		_, ok := ExportSummary(cs, testNamespace, testPool)
		require.False(t, ok)
		require.Nil(t, ClusterSummary(cs))
		require.Empty(t, Imports(cs, ""))
		require.Empty(t, Exports(cs, ""))
	}
}

// A member's Ready condition becomes the import's: one whose status or
// reason a condition cannot carry makes the summary unreadable, rather
// than an import condition that fails validation.
func TestSummaryEntryRefusesAReadyConditionItCannotPassOn(t *testing.T) {
	tests := []struct {
		name      string
		condition metav1.Condition
		wantOK    bool
	}{
		{name: "a valid Ready condition is passed on", condition: metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady}, wantOK: true},
		{name: "a status that is not True, False or Unknown", condition: metav1.Condition{Type: v1alpha1.ConditionReady, Status: "Maybe", Reason: v1alpha1.ReasonReady}},
		{name: "no reason", condition: metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse}},
		{name: "a reason a condition cannot carry", condition: metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Not Ready!"}},
		{name: "a reason over 1024 bytes", condition: metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: strings.Repeat("R", 1025)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &v1alpha1.InferencePoolExportSummary{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool"},
				Status: v1alpha1.InferencePoolExportSummaryStatus{
					RoutingMode: v1alpha1.RoutingModeEndpoint,
					Conditions:  []metav1.Condition{tt.condition},
				},
			}
			_, v := summaryEntry("cluster-a", s)
			assert.Equal(t, tt.wantOK, v.ok)
			if !tt.wantOK {
				assert.Equal(t, v1alpha1.ReasonInvalidExport, v.reason)
				assert.Contains(t, v.message, "cluster cluster-a published a summary of ns/pool whose Ready condition this server cannot read")
			}
		})
	}
}
