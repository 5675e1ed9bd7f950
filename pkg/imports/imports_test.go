package imports

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

func TestImportPlacement(t *testing.T) {
	tests := []struct {
		name string
		cs   ClusterSet
		// wantClusters are the exporting clusters listed, in order; nil: no import.
		wantClusters []string
	}{
		{
			name: "a pool exported by another cluster is imported where its namespace exists",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
				member(t, "cluster-b", namespace(testNamespace)),
			),
			wantClusters: []string{"cluster-a"},
		},
		{
			name: "no import is served where the namespace does not exist",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
				member(t, "cluster-b", namespace("other")),
			),
		},
		{
			name: "no import is served where the namespace is being deleted",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
				member(t, "cluster-b", terminating(namespace(testNamespace))),
			),
		},
		{
			name: "the exporting cluster does not import its own pool",
			cs: clusterSet("cluster-a",
				member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
				member(t, "cluster-b", namespace(testNamespace)),
			),
		},
		{
			name: "a cluster that also exports the pool sees the other exporters only",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
				member(t, "cluster-b", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
				member(t, "cluster-c", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
			),
			wantClusters: []string{"cluster-a", "cluster-c"},
		},
		{
			name: "several exporters are merged into one import sorted by cluster name",
			cs: clusterSet("cluster-z",
				member(t, "cluster-c", readyEPP(testNamespace, testPool)...),
				member(t, "cluster-a", readyEPP(testNamespace, testPool)...),
				member(t, "cluster-b", readyEPP(testNamespace, testPool)...),
				member(t, "cluster-z", namespace(testNamespace)),
			),
			wantClusters: []string{"cluster-a", "cluster-b", "cluster-c"},
		},
		{
			name: "members given out of order are still listed by cluster name",
			cs: ClusterSet{Name: testClusterSet, Local: "cluster-z", Members: []Member{
				member(t, "cluster-c", readyEPP(testNamespace, testPool)...),
				member(t, "cluster-z", namespace(testNamespace)),
				member(t, "cluster-a", readyEPP(testNamespace, testPool)...),
			}},
			wantClusters: []string{"cluster-a", "cluster-c"},
		},
		{
			name: "a pool without export annotations is not imported",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", readyEPP(testNamespace, testPool, annotations(nil))...),
				member(t, "cluster-b", namespace(testNamespace)),
			),
		},
		{
			name: "export-mode without the export annotation asks for no export: not imported (InferencePoolExport says it is invalid)",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", readyEPP(testNamespace, testPool, annotations(map[string]string{v1alpha1.ExportModeAnnotation: "ParentMode"}))...),
				member(t, "cluster-b", namespace(testNamespace)),
			),
		},
		{
			name: "an invalid export is imported as a cluster that is not Ready (TestInvalidExportsAreListedNotReady)",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", readyEPP(testNamespace, testPool, annotations(map[string]string{v1alpha1.ExportAnnotation: "Everywhere"}))...),
				member(t, "cluster-b", namespace(testNamespace)),
			),
			wantClusters: []string{"cluster-a"},
		},
		{
			name: "an invalid export in one cluster is listed beside the valid exporters",
			cs: clusterSet("cluster-c",
				member(t, "cluster-a", readyEPP(testNamespace, testPool, annotations(map[string]string{v1alpha1.ExportAnnotation: "Everywhere"}))...),
				member(t, "cluster-b", readyEPP(testNamespace, testPool)...),
				member(t, "cluster-c", namespace(testNamespace)),
			),
			wantClusters: []string{"cluster-a", "cluster-b"},
		},
		{
			name: "a pool of the same name in another namespace is a different pool",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a", readyEPP("other", testPool)...),
				member(t, "cluster-b", namespace(testNamespace), namespace("other-too")),
			),
		},
		{
			name: "nothing is served when the local cluster is not a member",
			cs: clusterSet("cluster-x",
				member(t, "cluster-a", readyEPP(testNamespace, testPool)...),
			),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			imp, ok := importBothWays(t, tc.cs, testNamespace, testPool)
			if tc.wantClusters == nil {
				assert.False(t, ok)
				assert.Nil(t, imp)
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.wantClusters, clusterNames(imp))
		})
	}
}

func TestImportsListsEveryServedImportSorted(t *testing.T) {
	cs := clusterSet("cluster-b",
		member(t, "cluster-a", objects(
			readyEPP("ns-b", "pool-2"), readyEPP("ns-b", "pool-1"),
			readyEPP("ns-a", "pool-9"),
			readyEPP("ns-missing", "pool-1"),
			readyEPP("ns-a", "not-exported", annotations(nil)),
		)...),
		member(t, "cluster-c", objects(readyEPP("ns-a", "pool-1"), readyEPP("ns-b", "pool-1"))...),
		member(t, "cluster-b", namespace("ns-a"), namespace("ns-b")),
	)

	tests := []struct {
		name      string
		namespace string
		want      []string
	}{
		{name: "all namespaces are listed by namespace then name", namespace: "", want: []string{"ns-a/pool-1", "ns-a/pool-9", "ns-b/pool-1", "ns-b/pool-2"}},
		{name: "a namespace lists only its own imports", namespace: "ns-b", want: []string{"ns-b/pool-1", "ns-b/pool-2"}},
		{name: "a namespace missing locally lists nothing", namespace: "ns-missing", want: nil},
		{name: "an unknown namespace lists nothing", namespace: "nowhere", want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, imp := range Imports(cs, tc.namespace) {
				got = append(got, imp.Namespace+"/"+imp.Name)
				one, ok := Import(cs, imp.Namespace, imp.Name)
				require.True(t, ok)
				assert.Equal(t, one, imp, "Import and Imports agree")
			}
			assert.Equal(t, tc.want, got)
		})
	}

	imp, ok := Import(cs, "ns-b", "pool-1")
	require.True(t, ok)
	assert.Equal(t, []string{"cluster-a", "cluster-c"}, clusterNames(imp), "exporters of one name are merged across clusters")
}

func TestImportMetadata(t *testing.T) {
	later, earlier := t0.Add(time.Hour), t0.Add(-time.Hour)
	tests := []struct {
		name        string
		exporters   map[string][]poolOption
		wantCreated time.Time
		wantLabels  map[string]string
	}{
		{
			name: "creationTimestamp and labels come from the oldest exporting pool",
			exporters: map[string][]poolOption{
				"cluster-a": {created(later), labelled(map[string]string{"from": "a"})},
				"cluster-c": {created(earlier), labelled(map[string]string{"from": "c"})},
			},
			wantCreated: earlier,
			wantLabels:  map[string]string{"from": "c"},
		},
		{
			name: "a tie on creationTimestamp goes to the first cluster by name",
			exporters: map[string][]poolOption{
				"cluster-c": {created(t0), labelled(map[string]string{"from": "c"})},
				"cluster-a": {created(t0), labelled(map[string]string{"from": "a"})},
			},
			wantCreated: t0,
			wantLabels:  map[string]string{"from": "a"},
		},
		{
			name: "the local cluster's own export does not count as the oldest",
			exporters: map[string][]poolOption{
				"cluster-a": {created(later), labelled(map[string]string{"from": "a"})},
				"cluster-b": {created(earlier), labelled(map[string]string{"from": "b (local)"})},
			},
			wantCreated: later,
			wantLabels:  map[string]string{"from": "a"},
		},
		{
			name:        "an exporter without labels gives an import without labels",
			exporters:   map[string][]poolOption{"cluster-a": nil},
			wantCreated: t0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			members := []Member{}
			hasLocal := false
			for name, opts := range tc.exporters {
				objs := objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool, opts...))
				members = append(members, member(t, name, objs...))
				hasLocal = hasLocal || name == "cluster-b"
			}
			if !hasLocal {
				members = append(members, member(t, "cluster-b", namespace(testNamespace)))
			}
			cs := clusterSet("cluster-b", members...)

			imp, ok := importBothWays(t, cs, testNamespace, testPool)
			require.True(t, ok)
			assert.Equal(t, testNamespace, imp.Namespace)
			assert.Equal(t, testPool, imp.Name)
			assert.True(t, tc.wantCreated.Equal(imp.CreationTimestamp.Time), "creationTimestamp %v", imp.CreationTimestamp)
			assert.Equal(t, tc.wantLabels, imp.Labels)
			assert.Equal(t, int64(1), imp.Generation, "imports have no spec: generation 1")
			assert.Equal(t, int64(1), imp.Status.ObservedGeneration)
			assert.Empty(t, imp.ResourceVersion, "the server sets resourceVersion")
		})
	}
}

func TestImportUIDIsDeterministic(t *testing.T) {
	build := func(setName, local string) ClusterSet {
		cs := clusterSet(local,
			member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
			member(t, "cluster-b", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...),
		)
		cs.Name = setName
		return cs
	}
	uidOf := func(cs ClusterSet) types.UID {
		imp, ok := Import(cs, testNamespace, testPool)
		require.True(t, ok)
		return imp.UID
	}

	first := uidOf(build("set-1", "cluster-b"))
	t.Run("the uid is a SHA-1 UUID of clusterset, kind, namespace and name", func(t *testing.T) {
		want := uuid.NewSHA1(uidNamespace, []byte("set-1/InferencePoolImport/example/llm-pool")).String()
		assert.Equal(t, types.UID(want), first)
		parsed, err := uuid.Parse(string(first))
		require.NoError(t, err)
		assert.Equal(t, uuid.Version(5), parsed.Version())
	})
	t.Run("recomputing from fresh caches gives the same uid", func(t *testing.T) {
		assert.Equal(t, first, uidOf(build("set-1", "cluster-b")))
	})
	t.Run("every importing cluster serves the same uid for the same import", func(t *testing.T) {
		assert.Equal(t, first, uidOf(build("set-1", "cluster-a")))
	})
	t.Run("another ClusterSet serves another uid", func(t *testing.T) {
		assert.NotEqual(t, first, uidOf(build("set-2", "cluster-b")))
	})
}

func TestImportStatus(t *testing.T) {
	cs := clusterSet("cluster-c",
		member(t, "cluster-a", readyEPP(testNamespace, testPool)...),
		member(t, "cluster-b", pool(testNamespace, testPool), service(testNamespace, testEPP)),
		member(t, "cluster-c", namespace(testNamespace)),
	)
	imp, ok := importBothWays(t, cs, testNamespace, testPool)
	require.True(t, ok)

	t.Run("Accepted is True when the import is synthesized", func(t *testing.T) {
		c := condition(t, imp.Status.Conditions, v1alpha1.ConditionAccepted)
		assert.Equal(t, metav1.ConditionTrue, c.Status)
		assert.Equal(t, v1alpha1.ReasonAccepted, c.Reason)
		assert.Contains(t, c.Message, "cluster-a, cluster-b")
		assert.Equal(t, int64(1), c.ObservedGeneration)
	})
	t.Run("Ready is True when at least one cluster is ready", func(t *testing.T) {
		c := condition(t, imp.Status.Conditions, v1alpha1.ConditionReady)
		assert.Equal(t, metav1.ConditionTrue, c.Status)
		assert.Equal(t, v1alpha1.ReasonReady, c.Reason)
		assert.Contains(t, c.Message, "1 of 2")
	})
	t.Run("the computation leaves lastTransitionTime zero for the server to carry", func(t *testing.T) {
		for _, c := range imp.Status.Conditions {
			assert.True(t, c.LastTransitionTime.IsZero())
		}
	})
	t.Run("controllers has exactly one entry for this implementation, in cluster order", func(t *testing.T) {
		require.Len(t, imp.Status.Controllers, 1)
		ctrl := imp.Status.Controllers[0]
		assert.Equal(t, v1alpha1.ControllerName, ctrl.Name)
		assert.Equal(t, []inference.ExportingCluster{{Name: "cluster-a"}, {Name: "cluster-b"}}, ctrl.ExportingClusters)
		assert.Equal(t, imp.Status.Conditions, ctrl.Conditions)
		require.NotEmpty(t, ctrl.Conditions)
	})

	t.Run("Ready is False with the reason of every cluster when none is ready", func(t *testing.T) {
		cs := clusterSet("cluster-c",
			member(t, "cluster-a", pool(testNamespace, testPool)),
			member(t, "cluster-b", pool(testNamespace, testPool), service(testNamespace, testEPP)),
			member(t, "cluster-c", namespace(testNamespace)),
		)
		imp, ok := importBothWays(t, cs, testNamespace, testPool)
		require.True(t, ok)
		c := condition(t, imp.Status.Conditions, v1alpha1.ConditionReady)
		assert.Equal(t, metav1.ConditionFalse, c.Status)
		assert.Equal(t, v1alpha1.ReasonNotReady, c.Reason)
		assert.Contains(t, c.Message, "cluster-a: "+v1alpha1.ReasonEndpointPickerNotFound)
		assert.Contains(t, c.Message, "cluster-b: "+v1alpha1.ReasonNoReadyEndpoints)
		assert.Equal(t, imp.Status.Conditions, imp.Status.Controllers[0].Conditions)
	})
}

func TestImportOfUnreachableExporter(t *testing.T) {
	since := time.Date(2025, 6, 7, 8, 9, 10, 0, time.UTC)
	tests := []struct {
		name      string
		members   []Member
		wantReady metav1.ConditionStatus
	}{
		{
			name: "an unreachable exporter keeps its last known data but is not Ready",
			members: []Member{
				unreachable(member(t, "cluster-a", readyEPP(testNamespace, testPool)...), since, "dial tcp: i/o timeout"),
			},
			wantReady: metav1.ConditionFalse,
		},
		{
			name: "another reachable ready exporter keeps the import Ready",
			members: []Member{
				unreachable(member(t, "cluster-a", readyEPP(testNamespace, testPool)...), since, "dial tcp: i/o timeout"),
				member(t, "cluster-c", readyEPP(testNamespace, testPool)...),
			},
			wantReady: metav1.ConditionTrue,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := clusterSet("cluster-b", append(tc.members, member(t, "cluster-b", namespace(testNamespace)))...)
			imp, ok := importBothWays(t, cs, testNamespace, testPool)
			require.True(t, ok)

			a := imp.Status.Clusters[0]
			require.Equal(t, "cluster-a", a.Name, "the unreachable cluster is never dropped")
			assert.Equal(t, testEPP, a.EndpointPicker.Name)
			require.Len(t, a.EndpointPicker.Service, 1, "last known data is served")
			assert.Equal(t, []string{"10.96.0.10"}, a.EndpointPicker.Service[0].Addresses)

			c := condition(t, a.Conditions, v1alpha1.ConditionReady)
			assert.Equal(t, metav1.ConditionFalse, c.Status)
			assert.Equal(t, v1alpha1.ReasonClusterUnreachable, c.Reason)
			assert.Contains(t, c.Message, "2025-06-07T08:09:10Z")
			assert.Contains(t, c.Message, "dial tcp: i/o timeout")
			assert.Contains(t, c.Message, "last known data")

			assert.Equal(t, tc.wantReady, condition(t, imp.Status.Conditions, v1alpha1.ConditionReady).Status)
		})
	}
}

func TestImportNeverPanics(t *testing.T) {
	tests := []struct {
		name string
		cs   ClusterSet
	}{
		{name: "an empty ClusterSet", cs: ClusterSet{}},
		{name: "members without listers", cs: ClusterSet{Local: "b", Members: []Member{{Name: "a"}, {Name: "b"}}}},
		{
			name: "an exporter whose only listers are pools",
			cs: ClusterSet{Local: "cluster-b", Members: []Member{
				{Name: "cluster-a", Pools: member(t, "x", pool(testNamespace, testPool)).Pools},
				{Name: "cluster-b", Namespaces: member(t, "x", namespace(testNamespace)).Namespaces},
			}},
		},
		{
			name: "a pool with nil annotations, no target ports, no ref port, no group and no kind",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a",
					pool(testNamespace, "bare", annotations(nil), targetPorts(), eppRef(poolv1.EndpointPickerRef{})),
					pool(testNamespace, testPool, targetPorts(), eppRef(poolv1.EndpointPickerRef{Name: testEPP})),
					service(testNamespace, testEPP, ports()),
				),
				member(t, "cluster-b", namespace(testNamespace)),
			),
		},
		{
			name: "a ParentMode pool with empty parent refs and nil groups",
			cs: clusterSet("cluster-b",
				member(t, "cluster-a",
					pool(testNamespace, testPool, parentMode(poolv1.ParentReference{}, poolv1.ParentReference{Name: "gw"})),
					gateway(testNamespace, "gw", nil),
				),
				member(t, "cluster-b", namespace(testNamespace)),
			),
		},
		{
			name: "an unreachable member with an empty message",
			cs: clusterSet("cluster-b",
				unreachable(member(t, "cluster-a", pool(testNamespace, testPool)), time.Time{}, ""),
				member(t, "cluster-b", namespace(testNamespace)),
			),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.NotPanics(t, func() {
				Imports(tc.cs, "")
				Imports(tc.cs, testNamespace)
				Import(tc.cs, testNamespace, testPool)
				Import(tc.cs, "", "")
				Exports(tc.cs, "")
				Export(tc.cs, testNamespace, testPool)
				for _, imp := range Imports(tc.cs, "") {
					CarryTransitionTimes(nil, imp, metav1.NewTime(t0))
				}
			})
		})
	}
}

func TestComputationNeverChangesTheCaches(t *testing.T) {
	cached := objects(
		nsObjects(testNamespace),
		readyEPP(testNamespace, testPool, labelled(map[string]string{"app": "llm"})),
		[]runtime.Object{
			pool(testNamespace, "parents", parentMode(gatewayRef("", "gw")), labelled(map[string]string{"app": "gw"})),
			gateway(testNamespace, "gw", []int32{80}, addresses("203.0.113.1"), programmed(metav1.ConditionTrue)),
		},
	)
	before := make([]runtime.Object, len(cached))
	for i, o := range cached {
		before[i] = o.DeepCopyObject()
	}
	cs := clusterSet("cluster-b",
		member(t, "cluster-a", cached...),
		member(t, "cluster-b", namespace(testNamespace)),
	)

	imps := Imports(cs, "")
	require.Len(t, imps, 2)
	for _, imp := range imps {
		CarryTransitionTimes(nil, imp, metav1.NewTime(t0.Add(time.Hour)))
		imp.Labels["changed"] = "by a caller"
		for i := range imp.Status.Clusters {
			for j := range imp.Status.Clusters[i].Parents {
				for k := range imp.Status.Clusters[i].Parents[j].Conditions {
					imp.Status.Clusters[i].Parents[j].Conditions[k].Message = "changed by a caller"
				}
			}
		}
	}
	assert.Equal(t, before, cached, "the computation and changes to its output left the cached objects alone")
}

// TestImportCarriesTheExportersPolicy: the import carries its oldest
// exporter's cluster policy itself, canonical, as an annotation, whether
// the exporter wrote it as an annotation (an inline configuration, which
// no label value can hold) or as the label exporters set before; alike
// when the exporter is read through its own server's summary.
func TestImportCarriesTheExportersPolicy(t *testing.T) {
	later := t0.Add(time.Hour)
	exportAnd := func(kv ...string) poolOption {
		a := map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
		for i := 0; i+1 < len(kv); i += 2 {
			a[kv[i]] = kv[i+1]
		}
		return annotations(a)
	}
	policyLabel := func(v string) poolOption {
		return labelled(map[string]string{v1alpha1.ClusterPolicyAnnotation: v})
	}
	const inlineCanonical = "prefix-cache=3,in-flight=1,pick=two-choices,filters=health+ready+weight+model+saturation,affinity-margin=1,queue-margin=1,home-bound=off"
	tests := []struct {
		name      string
		exporters map[string][]poolOption
		want      map[string]string
	}{
		{
			name:      "an inline configuration written as an annotation",
			exporters: map[string][]poolOption{"cluster-a": {exportAnd(v1alpha1.ClusterPolicyAnnotation, " prefix-cache=3, in-flight=1,pick=two-choices")}},
			want:      map[string]string{v1alpha1.ClusterPolicyAnnotation: inlineCanonical},
		},
		{
			name:      "a named policy written as a label, as exporters set it before",
			exporters: map[string][]poolOption{"cluster-a": {policyLabel("MetricsBased")}},
			want:      map[string]string{v1alpha1.ClusterPolicyAnnotation: "MetricsBased"},
		},
		{
			name:      "the annotation wins over the label",
			exporters: map[string][]poolOption{"cluster-a": {exportAnd(v1alpha1.ClusterPolicyAnnotation, "Weighted"), policyLabel("MetricsBased")}},
			want:      map[string]string{v1alpha1.ClusterPolicyAnnotation: "Weighted"},
		},
		{
			name: "the oldest exporter's, as the labels",
			exporters: map[string][]poolOption{
				"cluster-a": {created(later), exportAnd(v1alpha1.ClusterPolicyAnnotation, "Weighted")},
				"cluster-c": {exportAnd(v1alpha1.ClusterPolicyAnnotation, "queue=2")},
			},
			want: map[string]string{v1alpha1.ClusterPolicyAnnotation: "queue=2,pick=max-score,filters=health+ready+weight+model+saturation,affinity-margin=1,queue-margin=1,home-bound=off"},
		},
		{
			name:      "an empty value names none",
			exporters: map[string][]poolOption{"cluster-a": {exportAnd(v1alpha1.ClusterPolicyAnnotation, "")}},
		},
		{
			name:      "no policy, no annotation",
			exporters: map[string][]poolOption{"cluster-a": nil},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			members := []Member{member(t, "cluster-b", namespace(testNamespace))}
			for name, opts := range tc.exporters {
				members = append(members, member(t, name, objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool, opts...))...))
			}
			imp, ok := importBothWays(t, clusterSet("cluster-b", members...), testNamespace, testPool)
			require.True(t, ok)
			assert.Equal(t, tc.want, imp.Annotations)
		})
	}
}
