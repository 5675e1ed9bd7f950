package imports

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
)

// CarryTransitionTimes keeps lastTransitionTime stable across recomputations
// of one import. For every condition of next whose LastTransitionTime is
// zero (every condition the computation itself writes), at every level
// (status.conditions, clusters[].conditions, clusters[].parents[].conditions,
// controllers[].conditions, controllers[].parents[].conditions), it copies the time of prev's condition of the
// same type when its status is unchanged, and sets now when the status
// changed, the condition is new, or prev's time is zero. Conditions that
// already carry a time are left alone: those are a member Gateway's own
// conditions, copied with the time that Gateway reported.
//
// Entries are matched by cluster name, parent namespace/name, controller
// name and, for a controller's parents, the whole parentRef. prev may be nil (a first sighting: every time becomes now). next is
// changed in place; prev is only read.
func CarryTransitionTimes(prev, next *inference.InferencePoolImport, now metav1.Time) {
	if next == nil {
		return
	}
	var old *inference.InferencePoolImportStatus
	if prev != nil {
		old = &prev.Status
	}

	carryConditions(conditionsOf(old), next.Status.Conditions, now)

	prevClusters := clusterFinder{}
	if old != nil {
		prevClusters.clusters = old.Clusters
	}
	for i := range next.Status.Clusters {
		nc := &next.Status.Clusters[i]
		pc := prevClusters.find(nc.Name)
		var prevConds []metav1.Condition
		var prevParents []inference.ParentImport
		if pc != nil {
			prevConds, prevParents = pc.Conditions, pc.Parents
		}
		carryConditions(prevConds, nc.Conditions, now)
		for j := range nc.Parents {
			np := &nc.Parents[j]
			var prevParentConds []metav1.Condition
			for k := range prevParents {
				if prevParents[k].Namespace == np.Namespace && prevParents[k].Name == np.Name {
					prevParentConds = prevParents[k].Conditions
					break
				}
			}
			carryConditions(prevParentConds, np.Conditions, now)
		}
	}

	for i := range next.Status.Controllers {
		nc := &next.Status.Controllers[i]
		var prevConds []metav1.Condition
		var prevParents []inference.ParentStatus
		if old != nil {
			for k := range old.Controllers {
				if old.Controllers[k].Name == nc.Name {
					prevConds, prevParents = old.Controllers[k].Conditions, old.Controllers[k].Parents
					break
				}
			}
		}
		carryConditions(prevConds, nc.Conditions, now)
		for j := range nc.Parents {
			np := &nc.Parents[j]
			var prevParentConds []metav1.Condition
			for k := range prevParents {
				if sameParentRef(prevParents[k].ParentRef, np.ParentRef) {
					prevParentConds = prevParents[k].Conditions
					break
				}
			}
			carryConditions(prevParentConds, np.Conditions, now)
		}
	}
}

// CarryExportTransitionTimes does for an export's status.conditions what
// CarryTransitionTimes does for an import. prev may be nil.
func CarryExportTransitionTimes(prev, next *inference.InferencePoolExport, now metav1.Time) {
	if next == nil {
		return
	}
	var prevConds []metav1.Condition
	if prev != nil {
		prevConds = prev.Status.Conditions
	}
	carryConditions(prevConds, next.Status.Conditions, now)
}

// CarrySummaryTransitionTimes does for a summary's status.conditions what
// CarryTransitionTimes does for an import. prev may be nil.
func CarrySummaryTransitionTimes(prev, next *inference.InferencePoolExportSummary, now metav1.Time) {
	if next == nil {
		return
	}
	var prevConds []metav1.Condition
	if prev != nil {
		prevConds = prev.Status.Conditions
	}
	carryConditions(prevConds, next.Status.Conditions, now)
}

func conditionsOf(s *inference.InferencePoolImportStatus) []metav1.Condition {
	if s == nil {
		return nil
	}
	return s.Conditions
}

// clusterFinder finds clusters of an import by name, in linear time for
// the whole walk when they are looked up in the order they are listed (an
// import lists its clusters by name, and the next computation in the same
// order): each lookup tries the entry after the last one found first. Any
// other order is found too, by a scan.
type clusterFinder struct {
	clusters []inference.ImportedCluster
	next     int
}

func (f *clusterFinder) find(name string) *inference.ImportedCluster {
	if f.next < len(f.clusters) && f.clusters[f.next].Name == name {
		f.next++
		return &f.clusters[f.next-1]
	}
	for i := range f.clusters {
		if f.clusters[i].Name == name {
			f.next = i + 1
			return &f.clusters[i]
		}
	}
	return nil
}

// carryConditions fills the zero LastTransitionTimes of next from prev.
func carryConditions(prev, next []metav1.Condition, now metav1.Time) {
	for i := range next {
		c := &next[i]
		if !c.LastTransitionTime.IsZero() {
			continue
		}
		c.LastTransitionTime = now
		for j := range prev {
			if prev[j].Type == c.Type {
				if prev[j].Status == c.Status && !prev[j].LastTransitionTime.IsZero() {
					c.LastTransitionTime = prev[j].LastTransitionTime
				}
				break
			}
		}
	}
}

func sameParentRef(a, b inference.ParentReference) bool {
	return a.Kind == b.Kind && a.Namespace == b.Namespace && a.Name == b.Name && ptrEqual(a.Group, b.Group)
}
