package exportstatus

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// isOwnEntry says whether a parent status entry is mci's export entry. Only
// such entries are ever changed or removed: every other entry belongs to
// another controller (a gateway's, typically).
func isOwnEntry(p poolv1.ParentStatus) bool {
	return p.ControllerName == v1alpha1.ControllerName &&
		p.ParentRef.Kind == v1alpha1.ExportedParentKind &&
		p.ParentRef.Group != nil && *p.ParentRef.Group == v1alpha1.GroupName
}

// desiredParents returns the pool's status.parents with mci's export entry
// set to carry want, or removed when want is nil, and whether that differs
// from current. Other controllers' entries keep their content and order;
// mci's entry keeps its place, or is appended. The condition's
// lastTransitionTime is carried over while its status stays the same, and
// set to now when it changes.
//
// changed is false when mci's entry already says what want says (status,
// reason, message, observedGeneration): nothing is to be written.
func desiredParents(current []poolv1.ParentStatus, namespace, name string, want *metav1.Condition, now metav1.Time) ([]poolv1.ParentStatus, bool) {
	own := slices.IndexFunc(current, isOwnEntry)
	if want == nil {
		if own < 0 {
			return current, false
		}
		return slices.DeleteFunc(slices.Clone(current), isOwnEntry), true
	}

	group := v1alpha1.GroupName
	entry := poolv1.ParentStatus{
		ParentRef: poolv1.ParentReference{
			Group:     &group,
			Kind:      v1alpha1.ExportedParentKind,
			Namespace: namespace,
			Name:      name,
		},
		ControllerName: v1alpha1.ControllerName,
	}
	if own >= 0 {
		entry.Conditions = slices.Clone(current[own].Conditions)
	}
	cond := *want
	cond.LastTransitionTime = now
	// SetStatusCondition keeps the old lastTransitionTime when the status
	// is unchanged, and drops nothing else: mci's entry carries only the
	// Exported condition, so anything else there is stale and goes.
	meta.SetStatusCondition(&entry.Conditions, cond)
	entry.Conditions = slices.DeleteFunc(entry.Conditions, func(c metav1.Condition) bool { return c.Type != v1alpha1.ConditionExported })

	out := slices.Clone(current)
	if own >= 0 {
		if equality.Semantic.DeepEqual(current[own], entry) && !duplicateOwn(current, own) {
			return current, false
		}
		out[own] = entry
		// A second mci entry (written by hand, or by an older version) would
		// say something else: only one stays.
		out = append(out[:own+1], slices.DeleteFunc(out[own+1:], isOwnEntry)...)
		return out, true
	}
	return append(out, entry), true
}

// duplicateOwn says whether current holds another mci entry after own.
func duplicateOwn(current []poolv1.ParentStatus, own int) bool {
	return slices.IndexFunc(current[own+1:], isOwnEntry) >= 0
}
