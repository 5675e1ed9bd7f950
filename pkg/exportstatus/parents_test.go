package exportstatus

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

var (
	t0 = metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	t1 = metav1.NewTime(t0.Add(time.Hour))
)

func exported(status metav1.ConditionStatus, reason, message string, generation int64) *metav1.Condition {
	return &metav1.Condition{Type: v1alpha1.ConditionExported, Status: status, Reason: reason, Message: message, ObservedGeneration: generation}
}

// ownEntry is mci's entry for example/llm-pool carrying cond, which
// changed at transition.
func ownEntry(cond *metav1.Condition, transition metav1.Time) poolv1.ParentStatus {
	group := v1alpha1.GroupName
	c := *cond
	c.LastTransitionTime = transition
	return poolv1.ParentStatus{
		ParentRef:      poolv1.ParentReference{Group: &group, Kind: "InferencePoolImport", Namespace: "example", Name: "llm-pool"},
		ControllerName: "mci.x-k8s.io/apiserver",
		Conditions:     []metav1.Condition{c},
	}
}

// gatewayEntry is another controller's entry: a gateway that accepted the pool.
func gatewayEntry(name string) poolv1.ParentStatus {
	return poolv1.ParentStatus{
		ParentRef:      poolv1.ParentReference{Kind: "Gateway", Name: name},
		ControllerName: "example.com/gateway-controller",
		Conditions:     []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: t0}},
	}
}

func TestDesiredParents(t *testing.T) {
	isExported := exported(metav1.ConditionTrue, "Exported", "exported in EndpointMode to every other member of the ClusterSet (cluster-b)", 1)
	nsMissing := exported(metav1.ConditionFalse, "NamespaceNotFound", "not exported to every other member of the ClusterSet: namespace example does not exist in cluster cluster-b", 1)
	tests := []struct {
		name        string
		current     []poolv1.ParentStatus
		want        *metav1.Condition
		wantParents []poolv1.ParentStatus
		wantChanged bool
	}{
		{
			name:        "an exported pool gets mci's entry, after the gateways' entries",
			current:     []poolv1.ParentStatus{gatewayEntry("gw")},
			want:        isExported,
			wantParents: []poolv1.ParentStatus{gatewayEntry("gw"), ownEntry(isExported, t1)},
			wantChanged: true,
		},
		{
			name:        "an entry that already says the same is not written again",
			current:     []poolv1.ParentStatus{ownEntry(isExported, t0), gatewayEntry("gw")},
			want:        isExported,
			wantParents: []poolv1.ParentStatus{ownEntry(isExported, t0), gatewayEntry("gw")},
		},
		{
			name:        "a new status moves the transition time and keeps the entry's place",
			current:     []poolv1.ParentStatus{gatewayEntry("a"), ownEntry(isExported, t0), gatewayEntry("b")},
			want:        nsMissing,
			wantParents: []poolv1.ParentStatus{gatewayEntry("a"), ownEntry(nsMissing, t1), gatewayEntry("b")},
			wantChanged: true,
		},
		{
			name:        "a new observedGeneration with the same status keeps the transition time",
			current:     []poolv1.ParentStatus{ownEntry(isExported, t0)},
			want:        exported(metav1.ConditionTrue, "Exported", isExported.Message, 2),
			wantParents: []poolv1.ParentStatus{ownEntry(exported(metav1.ConditionTrue, "Exported", isExported.Message, 2), t0)},
			wantChanged: true,
		},
		{
			name:        "removing the export removes mci's entry and nothing else",
			current:     []poolv1.ParentStatus{gatewayEntry("a"), ownEntry(isExported, t0), gatewayEntry("b")},
			wantParents: []poolv1.ParentStatus{gatewayEntry("a"), gatewayEntry("b")},
			wantChanged: true,
		},
		{
			name:        "a pool that is neither exported nor has mci's entry is left alone",
			current:     []poolv1.ParentStatus{gatewayEntry("gw")},
			wantParents: []poolv1.ParentStatus{gatewayEntry("gw")},
		},
		{
			name: "another controller's entry of kind InferencePoolImport is not mci's",
			current: []poolv1.ParentStatus{func() poolv1.ParentStatus {
				e := ownEntry(isExported, t0)
				e.ControllerName = "example.com/other-mcs"
				return e
			}()},
			want: isExported,
			wantParents: []poolv1.ParentStatus{func() poolv1.ParentStatus {
				e := ownEntry(isExported, t0)
				e.ControllerName = "example.com/other-mcs"
				return e
			}(), ownEntry(isExported, t1)},
			wantChanged: true,
		},
		{
			name:        "a duplicate mci entry is dropped",
			current:     []poolv1.ParentStatus{ownEntry(isExported, t0), gatewayEntry("gw"), ownEntry(nsMissing, t0)},
			want:        isExported,
			wantParents: []poolv1.ParentStatus{ownEntry(isExported, t0), gatewayEntry("gw")},
			wantChanged: true,
		},
		{
			name: "a stale condition type in mci's entry is dropped",
			current: []poolv1.ParentStatus{func() poolv1.ParentStatus {
				e := ownEntry(isExported, t0)
				e.Conditions = append(e.Conditions, metav1.Condition{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: t0})
				return e
			}()},
			want:        isExported,
			wantParents: []poolv1.ParentStatus{ownEntry(isExported, t0)},
			wantChanged: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := make([]poolv1.ParentStatus, len(tc.current))
			for i := range tc.current {
				tc.current[i].DeepCopyInto(&before[i])
			}
			got, changed := desiredParents(tc.current, "example", "llm-pool", tc.want, t1)
			assert.Equal(t, tc.wantChanged, changed)
			assert.Equal(t, tc.wantParents, got)
			assert.Equal(t, before, tc.current, "the cached object is never changed")
		})
	}
}
