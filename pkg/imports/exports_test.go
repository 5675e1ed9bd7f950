package imports

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestExportValidity(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		wantMode    inference.RoutingMode
		wantReason  string
		wantMessage []string
	}{
		{
			name:        "export ClusterSet is a valid export in EndpointMode",
			annotations: map[string]string{v1alpha1.ExportAnnotation: "ClusterSet"},
			wantMode:    inference.RoutingModeEndpoint,
			wantReason:  v1alpha1.ReasonExported,
		},
		{
			name:        "export ClusterSet with ParentMode is a valid export in ParentMode",
			annotations: map[string]string{v1alpha1.ExportAnnotation: "ClusterSet", v1alpha1.ExportModeAnnotation: "ParentMode"},
			wantMode:    inference.RoutingModeParent,
			wantReason:  v1alpha1.ReasonExported,
		},
		{
			name:        "export-mode without export is reported invalid",
			annotations: map[string]string{v1alpha1.ExportModeAnnotation: "EndpointMode"},
			wantReason:  v1alpha1.ReasonInvalidExport,
			wantMessage: []string{"is missing"},
		},
		{
			name:        "an unknown export value is reported invalid",
			annotations: map[string]string{v1alpha1.ExportAnnotation: "World"},
			wantReason:  v1alpha1.ReasonInvalidExport,
			wantMessage: []string{`"World"`, `"ClusterSet"`},
		},
		{
			name:        "an unknown export-mode value is reported invalid",
			annotations: map[string]string{v1alpha1.ExportAnnotation: "ClusterSet", v1alpha1.ExportModeAnnotation: "Tunnel"},
			wantReason:  v1alpha1.ReasonInvalidExport,
			wantMessage: []string{`"Tunnel"`, `"EndpointMode"`, `"ParentMode"`},
		},
		{
			name:        "an endpoint-picker-secret that is not a Secret name is reported invalid",
			annotations: map[string]string{v1alpha1.ExportAnnotation: "ClusterSet", v1alpha1.EndpointPickerSecretAnnotation: "EPP TLS"},
			wantReason:  v1alpha1.ReasonInvalidExport,
			wantMessage: []string{`"` + v1alpha1.EndpointPickerSecretAnnotation + `"`, `"EPP TLS"`, "not a Secret name"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := clusterSet("cluster-a",
				member(t, "cluster-a", namespace(testNamespace), pool(testNamespace, testPool, annotations(tc.annotations), generation(7))),
				member(t, "cluster-b", namespace(testNamespace)),
				member(t, "cluster-c", namespace(testNamespace)),
			)
			exp, ok := Export(cs, testNamespace, testPool)
			require.True(t, ok)
			assert.Equal(t, tc.wantMode, exp.Status.RoutingMode)
			assert.Equal(t, int64(7), exp.Status.ObservedGeneration)

			valid := condition(t, exp.Status.Conditions, v1alpha1.ConditionValid)
			assert.Equal(t, tc.wantReason, valid.Reason)
			assert.Equal(t, int64(7), valid.ObservedGeneration)
			assert.True(t, valid.LastTransitionTime.IsZero())
			for _, s := range tc.wantMessage {
				assert.Contains(t, valid.Message, s)
			}

			if tc.wantReason == v1alpha1.ReasonExported {
				assert.Equal(t, metav1.ConditionTrue, valid.Status)
			} else {
				assert.Equal(t, metav1.ConditionFalse, valid.Status)
				_, _, err := ParseExport(tc.annotations, nil)
				require.Error(t, err)
				assert.Equal(t, err.Error(), valid.Message, "the message is ParseExport's error")
			}

			require.Len(t, exp.Status.Clusters, 2)
			for _, c := range exp.Status.Clusters {
				if tc.wantReason == v1alpha1.ReasonExported {
					assert.True(t, c.Imported, c.Name)
					assert.Equal(t, v1alpha1.ReasonImported, c.Reason)
				} else {
					// The importer lists the cluster, not Ready, with why,
					// when the pool asks to be exported.
					_, asks := tc.annotations[v1alpha1.ExportAnnotation]
					assert.Equal(t, asks, c.Imported, c.Name)
					assert.Equal(t, v1alpha1.ReasonInvalidExport, c.Reason)
					assert.NotEmpty(t, c.Message)
				}
			}
		})
	}
}

func TestExportTargetClusters(t *testing.T) {
	since := time.Date(2025, 6, 7, 8, 9, 10, 0, time.UTC)
	cs := clusterSet("cluster-b",
		member(t, "cluster-e", namespace(testNamespace)),
		unreachable(member(t, "cluster-d"), since, "connection refused"),
		unreachable(member(t, "cluster-c", namespace(testNamespace)), since, "connection refused"),
		member(t, "cluster-b", namespace(testNamespace), pool(testNamespace, testPool)),
		member(t, "cluster-a", namespace("other")),
		rejecting(member(t, "cluster-f", namespace(testNamespace)), since, "it answers 401 Unauthorized"),
	)
	exp, ok := Export(cs, testNamespace, testPool)
	require.True(t, ok)

	want := []inference.ExportTargetCluster{
		{Name: "cluster-a", Imported: false, Reason: v1alpha1.ReasonNamespaceNotFound, Message: "namespace example does not exist in cluster cluster-a"},
		{Name: "cluster-c", Imported: true, Reason: v1alpha1.ReasonClusterUnreachable, Message: "cluster cluster-c has been unreachable since 2025-06-07T08:09:10Z: connection refused; by its last known data it imports example/llm-pool"},
		{Name: "cluster-d", Imported: false, Reason: v1alpha1.ReasonClusterUnreachable, Message: "cluster cluster-d has been unreachable since 2025-06-07T08:09:10Z: connection refused; by its last known data namespace example does not exist there"},
		{Name: "cluster-e", Imported: true, Reason: v1alpha1.ReasonImported, Message: "cluster cluster-e imports example/llm-pool"},
		{Name: "cluster-f", Imported: true, Reason: v1alpha1.ReasonCredentialsRejected, Message: "cluster cluster-f has rejected mci-apiserver's credentials since 2025-06-07T08:09:10Z: it answers 401 Unauthorized; by its last known data it imports example/llm-pool"},
	}
	assert.Equal(t, want, exp.Status.Clusters, "every other member, sorted by name, never the local cluster")

	t.Run("Imported agrees with what the other cluster actually serves", func(t *testing.T) {
		for _, c := range exp.Status.Clusters {
			other := cs
			other.Local = c.Name
			_, served := Import(other, testNamespace, testPool)
			assert.Equal(t, c.Imported, served, c.Name)
		}
	})
}

func TestExportPresence(t *testing.T) {
	cs := clusterSet("cluster-a",
		member(t, "cluster-a",
			namespace("ns-a"), namespace("ns-b"),
			pool("ns-b", "valid"),
			pool("ns-a", "valid"),
			pool("ns-a", "invalid", annotations(map[string]string{v1alpha1.ExportModeAnnotation: "ParentMode"})),
			pool("ns-a", "plain", annotations(map[string]string{"unrelated": "x"})),
			pool("ns-a", "nil-annotations", annotations(nil)),
		),
		member(t, "cluster-b", readyEPP("ns-a", "remote-only")...),
	)

	tests := []struct {
		name      string
		namespace string
		want      []string
	}{
		{name: "pools with either annotation are listed, valid or not, by namespace then name", want: []string{"ns-a/invalid", "ns-a/valid", "ns-b/valid"}},
		{name: "a namespace lists its own exports only", namespace: "ns-b", want: []string{"ns-b/valid"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range Exports(cs, tc.namespace) {
				got = append(got, e.Namespace+"/"+e.Name)
				one, ok := Export(cs, e.Namespace, e.Name)
				require.True(t, ok)
				assert.Equal(t, one, e, "Export and Exports agree")
			}
			assert.Equal(t, tc.want, got)
		})
	}

	for _, name := range []string{"plain", "nil-annotations", "missing", "remote-only"} {
		t.Run("there is no export for a local pool without annotations or a pool that is not local: "+name, func(t *testing.T) {
			exp, ok := Export(cs, "ns-a", name)
			assert.False(t, ok)
			assert.Nil(t, exp)
		})
	}
}

func TestExportMetadata(t *testing.T) {
	p := pool(testNamespace, testPool, generation(4), labelled(map[string]string{"app": "llm"}), created(t0))
	cs := clusterSet("cluster-a", member(t, "cluster-a", namespace(testNamespace), p))
	exp, ok := Export(cs, testNamespace, testPool)
	require.True(t, ok)

	assert.Equal(t, testNamespace, exp.Namespace)
	assert.Equal(t, testPool, exp.Name)
	assert.Equal(t, int64(4), exp.Generation)
	assert.True(t, t0.Equal(exp.CreationTimestamp.Time))
	assert.Equal(t, map[string]string{"app": "llm"}, exp.Labels)
	assert.Empty(t, exp.ResourceVersion)
	assert.Empty(t, exp.Status.Clusters, "a ClusterSet of one has no other cluster to list")

	wantUID := uuid.NewSHA1(uidNamespace, []byte("test-set/InferencePoolExport/cluster-a/example/llm-pool")).String()
	assert.Equal(t, types.UID(wantUID), exp.UID)
	imp := virtualUID(testClusterSet, kindImport, testNamespace, testPool)
	assert.NotEqual(t, imp, exp.UID, "an export and an import of the same pool have different uids")

	exp.Labels["changed"] = "by a caller"
	assert.Equal(t, map[string]string{"app": "llm"}, p.Labels, "labels are copied, not shared with the cache")
}
