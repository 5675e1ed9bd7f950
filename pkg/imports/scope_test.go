package imports

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// labelledMember gives m the labels its membership source (ClusterProfile
// or member Secret) carries.
func labelledMember(m Member, l map[string]string) Member {
	m.Labels = l
	return m
}

func TestParseExportScope(t *testing.T) {
	const exportTo = v1alpha1.ExportToAnnotation
	tests := []struct {
		name  string
		value string
		// wantErr lists substrings the error must contain; none means valid.
		wantErr []string
	}{
		{name: "a list of cluster names is a valid scope", value: `{"clusters": ["cluster-b", "cluster-c"]}`},
		{name: "a label selector is a valid scope", value: `{"selector": "region=eu"}`},
		{name: "a set-based selector is a valid scope", value: `{"selector": "region in (eu-west, eu-central), tier!=batch"}`},
		{name: "names and a selector together are a valid scope", value: `{"clusters": ["cluster-b"], "selector": "region=eu"}`},
		{name: "a scope that is not JSON makes the export invalid and shows how to write it", value: `cluster-b,cluster-c`, wantErr: []string{`"` + exportTo + `"`, "not a JSON object", `{"clusters": ["cluster-b"]`}},
		{name: "a JSON list instead of an object makes the export invalid", value: `["cluster-b"]`, wantErr: []string{"not a JSON object"}},
		{name: "a misspelled field makes the export invalid rather than exporting wider", value: `{"cluster": ["cluster-b"]}`, wantErr: []string{`"cluster"`}},
		{name: "an empty object names no cluster and makes the export invalid", value: `{}`, wantErr: []string{"names no cluster"}},
		{name: "null names no cluster and makes the export invalid", value: `null`, wantErr: []string{"names no cluster"}},
		{name: "an empty list of clusters makes the export invalid", value: `{"clusters": []}`, wantErr: []string{"names no cluster"}},
		{name: "an empty selector would select every member and makes the export invalid", value: `{"selector": " "}`, wantErr: []string{"empty selector", "remove the annotation"}},
		{name: "a selector that does not parse makes the export invalid and is quoted", value: `{"selector": "region in eu"}`, wantErr: []string{`"region in eu"`}},
		{name: "a cluster name that cannot name a member makes the export invalid", value: `{"clusters": ["Cluster_B"]}`, wantErr: []string{`"Cluster_B"`, "DNS subdomain"}},
		{name: "two JSON values make the export invalid", value: `{"clusters": ["b"]} {"clusters": ["c"]}`, wantErr: []string{"more than one JSON value"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mode, exported, err := ParseExport(map[string]string{v1alpha1.ExportAnnotation: "ClusterSet", exportTo: tc.value}, nil)
			if len(tc.wantErr) == 0 {
				require.NoError(t, err)
				assert.True(t, exported)
				assert.NotEmpty(t, mode)
				return
			}
			require.Error(t, err)
			assert.False(t, exported, "an invalid scope must not export the pool")
			for _, s := range tc.wantErr {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

// An exporter in cluster-a limits its pool to some members; cluster-b is
// in the EU, cluster-c in the US, cluster-d has no labels.
func TestExportScope(t *testing.T) {
	eu := map[string]string{"region": "eu"}
	us := map[string]string{"region": "us"}
	tests := []struct {
		name     string
		exportTo string
		// importers are the members that serve an import; every other
		// member is listed as OutsideExportScope by the exporter.
		importers []string
	}{
		{name: "without export-to every member imports", importers: []string{"cluster-b", "cluster-c", "cluster-d"}},
		{name: "a named cluster imports and no other does", exportTo: `{"clusters": ["cluster-c"]}`, importers: []string{"cluster-c"}},
		{name: "a selector picks the members whose labels match", exportTo: `{"selector": "region=eu"}`, importers: []string{"cluster-b"}},
		{name: "names and a selector add up", exportTo: `{"clusters": ["cluster-d"], "selector": "region=eu"}`, importers: []string{"cluster-b", "cluster-d"}},
		{name: "a member without labels matches a selector that asks for a label's absence only", exportTo: `{"selector": "!region"}`, importers: []string{"cluster-d"}},
		{name: "a name that is no member imports nowhere", exportTo: `{"clusters": ["cluster-z"]}`},
		{name: "the exporter naming itself changes nothing for it", exportTo: `{"clusters": ["cluster-a", "cluster-b"]}`, importers: []string{"cluster-b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := map[string]string{v1alpha1.ExportAnnotation: "ClusterSet"}
			if tc.exportTo != "" {
				a[v1alpha1.ExportToAnnotation] = tc.exportTo
			}
			members := []Member{
				member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool, annotations(a)))...),
				labelledMember(member(t, "cluster-b", namespace(testNamespace)), eu),
				labelledMember(member(t, "cluster-c", namespace(testNamespace)), us),
				member(t, "cluster-d", namespace(testNamespace)),
			}
			var importers []string
			for _, local := range []string{"cluster-b", "cluster-c", "cluster-d"} {
				cs := clusterSet(local, members...)
				imp, ok := importBothWays(t, cs, testNamespace, testPool)
				if ok {
					importers = append(importers, local)
					assert.Equal(t, []string{"cluster-a"}, clusterNames(imp))
				}
				assert.Equal(t, ok, len(Imports(summaryMode(t, cs), "")) == 1, "%s: Imports in summary mode", local)
			}
			assert.Equal(t, tc.importers, importers, "members serving an import")

			exporter := clusterSet("cluster-a", members...)
			for _, cs := range []ClusterSet{exporter, summaryMode(t, exporter)} {
				exp, ok := Export(cs, testNamespace, testPool)
				require.True(t, ok)
				var listed []string
				for _, c := range exp.Status.Clusters {
					if c.Imported {
						listed = append(listed, c.Name)
						assert.Equal(t, v1alpha1.ReasonImported, c.Reason)
						continue
					}
					assert.Equal(t, v1alpha1.ReasonOutsideExportScope, c.Reason, c.Name)
					assert.Contains(t, c.Message, v1alpha1.ExportToAnnotation)
				}
				assert.Equal(t, tc.importers, listed, "InferencePoolExport's imported clusters")

				exported, ok := Exported(cs, testNamespace, testPool)
				require.True(t, ok)
				assert.Equal(t, metav1.ConditionTrue, exported.Status, "members outside the scope are no problem of the export: %s", exported.Message)
			}

			// What the exporter's server publishes carries the scope, and
			// the rule the summary stream filters by agrees with placement.
			summary, ok := ExportSummary(exporter, testNamespace, testPool)
			require.True(t, ok)
			for _, m := range members[1:] {
				assert.Equal(t, slices.Contains(tc.importers, m.Name), ExportScopeIncludes(summary, m.Name, m.Labels), "summary sent to %s", m.Name)
			}
		})
	}
}

// An invalid scope withdraws the export as any invalid annotation does:
// every member lists the cluster, not Ready, and routes to nothing.
func TestInvalidExportScopeIsAnInvalidExport(t *testing.T) {
	a := map[string]string{v1alpha1.ExportAnnotation: "ClusterSet", v1alpha1.ExportToAnnotation: `{"clusterz": ["cluster-b"]}`}
	cs := clusterSet("cluster-b",
		member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool, annotations(a)))...),
		member(t, "cluster-b", namespace(testNamespace)),
	)
	imp, ok := importBothWays(t, cs, testNamespace, testPool)
	require.True(t, ok)
	ready := condition(t, imp.Status.Clusters[0].Conditions, v1alpha1.ConditionReady)
	assert.Equal(t, v1alpha1.ReasonInvalidExport, ready.Reason)
	assert.Contains(t, ready.Message, v1alpha1.ExportToAnnotation)

	cs.Local = "cluster-a"
	exp, ok := Export(cs, testNamespace, testPool)
	require.True(t, ok)
	assert.Equal(t, v1alpha1.ReasonInvalidExport, condition(t, exp.Status.Conditions, v1alpha1.ConditionValid).Reason)
}

// Whatever a pool's writer puts in export-to, parsing neither panics nor
// accepts a scope that includes nobody, and what it refuses says so.
func FuzzParseExportScope(f *testing.F) {
	f.Add(`{"clusters": ["cluster-b"], "selector": "region=eu"}`)
	f.Add(`{"selector": "!region"}`)
	f.Add(`{"clusters": []}`)
	f.Add(`null`)
	f.Add("{\"clusters\": [\"\xff\"]}")
	f.Fuzz(func(t *testing.T, value string) {
		scope, err := parseExportScope(map[string]string{v1alpha1.ExportToAnnotation: value})
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("empty error for %q", value)
			}
			return
		}
		if !scope.limited || (len(scope.clusters) == 0 && scope.selector == nil) {
			t.Fatalf("accepted %q as a scope that names and selects nobody", value)
		}
	})
}
