package imports

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// A drained export (v1alpha1.DrainAnnotation) stays what it was, Ready
// included: importers keep seeing it, and their sidecars keep sending it
// the requests it holds. Only the Draining condition is added, to the
// cluster's entry of each import, to the summary its own server publishes
// (whence servers that read the member in summary mode take it) and to its
// InferencePoolExport. The condition is absent while the export does not
// drain, so that objects of clusters that never drain are served as they
// were.

// A member drains as a whole when the Secret or ClusterProfile that names
// it in this server's membership carries the same annotation
// (Member.Draining): each of its exports is then flagged as if its pool
// did, in the imports and, for the local member, in its
// InferencePoolExports. Its own summaries do not carry it: each server
// applies the member's drain as its own membership has it.

// drainCondition is the Draining condition of member m's export of
// namespace/name, whose pool drains or not (poolDrains); ok=false when
// neither the pool nor the member drains. The pool's own drain is the one
// named when both do.
func drainCondition(m *Member, poolDrains bool, namespace, name string, generation int64) (metav1.Condition, bool) {
	switch {
	case poolDrains:
		return drainingCondition(m.Name, namespace, name, generation), true
	case m != nil && m.Draining:
		return verdict{
			ok:     true,
			reason: v1alpha1.ReasonMemberDrainRequested,
			message: fmt.Sprintf("cluster %s drains (annotation %s on the Secret or ClusterProfile that names it): importers send its %s/%s no new requests, only those of the sessions and conversations it serves, until they end",
				m.Name, v1alpha1.DrainAnnotation, namespace, name),
		}.condition(v1alpha1.ConditionDraining, generation), true
	}
	return metav1.Condition{}, false
}

// drainingCondition is the Draining condition of cluster's export of
// namespace/name.
func drainingCondition(cluster, namespace, name string, generation int64) metav1.Condition {
	return verdict{
		ok:     true,
		reason: v1alpha1.ReasonDrainRequested,
		message: fmt.Sprintf("cluster %s drains %s/%s (annotation %s): importers send it no new requests, only those of the sessions and conversations it serves, until they end",
			cluster, namespace, name, v1alpha1.DrainAnnotation),
	}.condition(v1alpha1.ConditionDraining, generation)
}
