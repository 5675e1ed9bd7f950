package imports

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// Exported computes the Exported condition of the local pool
// namespace/name: the condition of the parent status entry that upstream
// proposal 1374 asks an implementation to set on an exported InferencePool
// in its own cluster. ok=false when the pool does not exist or carries no
// export annotation: then the pool has no such entry.
//
// It reads the same computation as the pool's InferencePoolExport, so the
// two never disagree: True (reason Exported) when every other member
// imports the pool; False otherwise, with the reason of the most
// fundamental problem (InvalidExport, then InvalidEndpointPickerRef or
// EndpointPickerNotFound for an EndpointMode export whose EPP Service the
// importers could not be told about, then NamespaceNotFound, then
// CredentialsRejected, then ClusterUnreachable) and a message that names every problem.
//
// Only what an export's state is made of counts: the EPP Service's
// existence, never its readiness, so EPP readiness flaps never change the
// condition. Its messages carry no counts or error texts that move while
// the state stays the same.
func Exported(cs ClusterSet, namespace, name string) (metav1.Condition, bool) {
	local := cs.localMember()
	pool := local.pool(namespace, name)
	if pool == nil || !hasExportAnnotation(pool.Annotations) {
		return metav1.Condition{}, false
	}
	others := cs.others()
	exp := buildExport(cs, pool, others, namespaceCache{})
	generation := exp.Status.ObservedGeneration

	for _, c := range exp.Status.Conditions {
		if c.Type == v1alpha1.ConditionValid && c.Status != metav1.ConditionTrue {
			return verdict{reason: c.Reason, message: c.Message}.condition(v1alpha1.ConditionExported, generation), true
		}
	}

	var problems []problem
	if exp.Status.RoutingMode == inference.RoutingModeEndpoint {
		if p, bad := localEndpointPicker(local, cs.Local, pool); bad {
			problems = append(problems, p)
		}
	}
	var importers []string
	scoped := false
	for _, t := range exp.Status.Clusters {
		switch {
		case t.Reason == v1alpha1.ReasonOutsideExportScope:
			// Not importing is what the exporter asked of it.
			scoped = true
		case t.Reason == v1alpha1.ReasonImported:
			importers = append(importers, t.Name)
		case t.Reason == v1alpha1.ReasonClusterUnreachable || t.Reason == v1alpha1.ReasonCredentialsRejected:
			// The export's message quotes the member's last error, which
			// may change at every probe while the state does not.
			problems = append(problems, problem{reason: t.Reason, message: unreachableMessage(others, t.Name)})
		default:
			problems = append(problems, problem{reason: t.Reason, message: t.Message})
		}
	}

	if len(problems) == 0 {
		msg := fmt.Sprintf("exported in %s to every other member of the ClusterSet (%s)", exp.Status.RoutingMode, strings.Join(importers, ", "))
		switch {
		case scoped && len(importers) == 0:
			msg = fmt.Sprintf("exported in %s; no other member of the ClusterSet is in the export's scope (%s)", exp.Status.RoutingMode, v1alpha1.ExportToAnnotation)
		case scoped:
			msg = fmt.Sprintf("exported in %s to every other member in the export's scope (%s)", exp.Status.RoutingMode, strings.Join(importers, ", "))
		case len(importers) == 0:
			msg = fmt.Sprintf("exported in %s; the ClusterSet has no other member yet", exp.Status.RoutingMode)
		}
		return verdict{ok: true, reason: v1alpha1.ReasonExported, message: msg}.condition(v1alpha1.ConditionExported, generation), true
	}
	reason := problems[0].reason
	for _, p := range problems[1:] {
		if exportedReasonRank[p.reason] < exportedReasonRank[reason] {
			reason = p.reason
		}
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.message
	}
	msg := fmt.Sprintf("not exported to every other member of the ClusterSet: %s", strings.Join(msgs, "; "))
	return verdict{reason: reason, message: msg}.condition(v1alpha1.ConditionExported, generation), true
}

// problem is one reason why a pool is not exported everywhere.
type problem struct {
	reason, message string
}

// exportedReasonRank orders the reasons of a False Exported condition, most
// fundamental first: the one a person should fix first names the condition.
var exportedReasonRank = map[string]int{
	v1alpha1.ReasonInvalidExport:            0,
	v1alpha1.ReasonInvalidEndpointPickerRef: 1,
	v1alpha1.ReasonEndpointPickerNotFound:   2,
	v1alpha1.ReasonNamespaceNotFound:        3,
	v1alpha1.ReasonCredentialsRejected:      4,
	v1alpha1.ReasonClusterUnreachable:       5,
}

// localEndpointPicker says what is wrong, if anything, with the EPP
// Service that importers of an EndpointMode export are sent to: it is
// named by the pool's endpointPickerRef and must exist in the exporting
// (local) cluster. Its readiness is not looked at.
func localEndpointPicker(local *Member, cluster string, pool *poolv1.InferencePool) (problem, bool) {
	svcName, invalid := eppServiceName(cluster, pool)
	if invalid != nil {
		return problem{reason: invalid.reason, message: invalid.message}, true
	}
	if local.service(pool.Namespace, svcName) == nil {
		return problem{
			reason: v1alpha1.ReasonEndpointPickerNotFound,
			message: fmt.Sprintf("Service %s/%s, the endpointPickerRef of InferencePool %s/%s, does not exist in cluster %s",
				pool.Namespace, svcName, pool.Namespace, pool.Name, cluster),
		}, true
	}
	return problem{}, false
}

// unreachableMessage says since when member name has been unreachable,
// without its last error.
func unreachableMessage(others []*Member, name string) string {
	for _, m := range others {
		if m.Name == name && m.Unreachable != nil {
			return m.Unreachable.Describe(name)
		}
	}
	return fmt.Sprintf("cluster %s is unreachable", name)
}
