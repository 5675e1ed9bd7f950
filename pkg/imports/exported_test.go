package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// The cases follow proposal 1374's InferencePool Status section: an
// exported pool gets an Exported condition, True when the pool is exported
// to all members of the ClusterSet and False for every other reason; a pool
// without the export annotation gets none.
func TestExportedCondition(t *testing.T) {
	withoutEPPName := func(p *poolv1.InferencePool) { p.Spec.EndpointPickerRef.Name = "" }
	tests := []struct {
		name string
		// local holds cluster-a's objects beyond the namespace.
		local []runtime.Object
		b, c  Member
		// wantNone: no condition, hence no parent status entry.
		wantNone    bool
		wantStatus  metav1.ConditionStatus
		wantReason  string
		wantMessage []string
	}{
		{
			name:        "a pool imported by every other member is Exported",
			local:       readyEPP(testNamespace, testPool),
			b:           member(t, "cluster-b", namespace(testNamespace)),
			c:           member(t, "cluster-c", namespace(testNamespace)),
			wantStatus:  metav1.ConditionTrue,
			wantReason:  v1alpha1.ReasonExported,
			wantMessage: []string{"EndpointMode", "cluster-b, cluster-c"},
		},
		{
			name:        "a ParentMode export needs no EPP Service to be Exported",
			local:       []runtime.Object{pool(testNamespace, testPool, mode(inference.RoutingModeParent))},
			b:           member(t, "cluster-b", namespace(testNamespace)),
			c:           member(t, "cluster-c", namespace(testNamespace)),
			wantStatus:  metav1.ConditionTrue,
			wantReason:  v1alpha1.ReasonExported,
			wantMessage: []string{"ParentMode"},
		},
		{
			name:       "EPP readiness does not matter: an EPP without ready endpoints is still Exported",
			local:      []runtime.Object{pool(testNamespace, testPool), service(testNamespace, testEPP), slice(testNamespace, testEPP, isNotReady)},
			b:          member(t, "cluster-b", namespace(testNamespace)),
			c:          member(t, "cluster-c", namespace(testNamespace)),
			wantStatus: metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonExported,
		},
		{
			name:        "a member without the namespace makes the pool not Exported, naming the cluster",
			local:       readyEPP(testNamespace, testPool),
			b:           member(t, "cluster-b", namespace(testNamespace)),
			c:           member(t, "cluster-c"),
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonNamespaceNotFound,
			wantMessage: []string{"namespace example does not exist in cluster cluster-c"},
		},
		{
			name:        "an unreachable member makes the pool not Exported, without its last error",
			local:       readyEPP(testNamespace, testPool),
			b:           unreachable(member(t, "cluster-b", namespace(testNamespace)), t0, "dial tcp: connection refused"),
			c:           member(t, "cluster-c", namespace(testNamespace)),
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonClusterUnreachable,
			wantMessage: []string{"cluster cluster-b has been unreachable since 2025-01-02T03:04:05Z"},
		},
		{
			name:        "a member that rejects the credentials makes the pool not Exported, under its own reason",
			local:       readyEPP(testNamespace, testPool),
			b:           rejecting(member(t, "cluster-b", namespace(testNamespace)), t0, "it answers 401 Unauthorized"),
			c:           unreachable(member(t, "cluster-c", namespace(testNamespace)), t0, "dial tcp: connection refused"),
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonCredentialsRejected,
			wantMessage: []string{"cluster cluster-b has rejected mci-apiserver's credentials since 2025-01-02T03:04:05Z", "cluster cluster-c has been unreachable since 2025-01-02T03:04:05Z"},
		},
		{
			name:        "a missing EPP Service makes an EndpointMode export not Exported",
			local:       []runtime.Object{pool(testNamespace, testPool)},
			b:           member(t, "cluster-b", namespace(testNamespace)),
			c:           member(t, "cluster-c", namespace(testNamespace)),
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonEndpointPickerNotFound,
			wantMessage: []string{"Service example/epp", "does not exist in cluster cluster-a"},
		},
		{
			name:       "an endpointPickerRef without a name makes the pool not Exported",
			local:      []runtime.Object{pool(testNamespace, testPool, withoutEPPName)},
			b:          member(t, "cluster-b", namespace(testNamespace)),
			c:          member(t, "cluster-c", namespace(testNamespace)),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonInvalidEndpointPickerRef,
		},
		{
			name:        "invalid export annotations make the pool not Exported, quoting the bad value",
			local:       objects(readyEPP(testNamespace, testPool, annotations(map[string]string{v1alpha1.ExportAnnotation: "World"}))),
			b:           member(t, "cluster-b", namespace(testNamespace)),
			c:           member(t, "cluster-c", namespace(testNamespace)),
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonInvalidExport,
			wantMessage: []string{`"World"`},
		},
		{
			name:        "several problems: the most fundamental names the reason, the message names them all",
			local:       []runtime.Object{pool(testNamespace, testPool)},
			b:           unreachable(member(t, "cluster-b", namespace(testNamespace)), t0, "timeout"),
			c:           member(t, "cluster-c"),
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonEndpointPickerNotFound,
			wantMessage: []string{"Service example/epp", "cluster-b has been unreachable", "does not exist in cluster cluster-c"},
		},
		{
			name:     "a pool without the export annotation has no Exported condition",
			local:    readyEPP(testNamespace, testPool, annotations(map[string]string{"other": "x"})),
			b:        member(t, "cluster-b", namespace(testNamespace)),
			c:        member(t, "cluster-c", namespace(testNamespace)),
			wantNone: true,
		},
		{
			name:     "a pool that does not exist has no Exported condition",
			b:        member(t, "cluster-b", namespace(testNamespace)),
			c:        member(t, "cluster-c", namespace(testNamespace)),
			wantNone: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			local := member(t, "cluster-a", append([]runtime.Object{namespace(testNamespace)}, tc.local...)...)
			cs := clusterSet("cluster-a", local, tc.b, tc.c)
			cond, ok := Exported(cs, testNamespace, testPool)
			if tc.wantNone {
				assert.False(t, ok)
				return
			}
			require.True(t, ok)
			assert.Equal(t, v1alpha1.ConditionExported, cond.Type)
			assert.Equal(t, tc.wantStatus, cond.Status)
			assert.Equal(t, tc.wantReason, cond.Reason)
			assert.Equal(t, int64(1), cond.ObservedGeneration)
			assert.True(t, cond.LastTransitionTime.IsZero(), "the computation has no clock")
			for _, s := range tc.wantMessage {
				assert.Contains(t, cond.Message, s)
			}
			assert.NotContains(t, cond.Message, "connection refused")
		})
	}
}

// The Exported condition changes only with the export's state: flapping the
// EPP's readiness leaves it identical.
func TestExportedConditionIgnoresReadiness(t *testing.T) {
	conditionWith := func(ready *bool) metav1.Condition {
		local := member(t, "cluster-a", namespace(testNamespace), pool(testNamespace, testPool), service(testNamespace, testEPP), slice(testNamespace, testEPP, ready))
		cs := clusterSet("cluster-a", local, member(t, "cluster-b", namespace(testNamespace)))
		cond, ok := Exported(cs, testNamespace, testPool)
		require.True(t, ok)
		return cond
	}
	assert.Equal(t, conditionWith(isReady), conditionWith(isNotReady))
}

// A ClusterSet of one cluster: nothing to export to, and nothing failed.
func TestExportedConditionWithoutOtherMembers(t *testing.T) {
	cs := clusterSet("cluster-a", member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool))...))
	cond, ok := Exported(cs, testNamespace, testPool)
	require.True(t, ok)
	assert.Equal(t, metav1.ConditionTrue, cond.Status)
	assert.Contains(t, cond.Message, "no other member")
}
