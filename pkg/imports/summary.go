package imports

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// ExportSummary computes the InferencePoolExportSummary of the local pool
// namespace/name: what importing clusters need of it. ok=false when the
// pool does not exist or carries no export annotation; an invalid export
// is published not Ready, with reason InvalidExport. It reads the local
// cluster only, so the summary is the same whatever the other members do.
func ExportSummary(cs ClusterSet, namespace, name string) (*inference.InferencePoolExportSummary, bool) {
	local := cs.localMember()
	e, ok := poolExporter(local, local.pool(namespace, name))
	if !ok {
		return nil, false
	}
	return buildSummary(cs, e, sliceLister{lister: local.EndpointSlices}), true
}

// ExportSummaries computes the summary of every export of the local
// cluster in namespace ("" = all namespaces), sorted by namespace then
// name, from one pass over its pools and one over its EndpointSlices.
func ExportSummaries(cs ClusterSet, namespace string) []*inference.InferencePoolExportSummary {
	local := cs.localMember()
	if local == nil {
		return nil
	}
	exports := exportsOf(local, namespace)
	slices.SortFunc(exports, func(a, b exporter) int {
		if c := cmp.Compare(a.pool.Namespace, b.pool.Namespace); c != 0 {
			return c
		}
		return cmp.Compare(a.pool.Name, b.pool.Name)
	})
	counter := sliceIndexes([]exportGroup{{exporters: exports}}, namespace)[local]
	if counter == nil {
		counter = sliceLister{lister: local.EndpointSlices}
	}
	out := make([]*inference.InferencePoolExportSummary, len(exports))
	for i, e := range exports {
		out[i] = buildSummary(cs, e, counter)
	}
	return out
}

// buildSummary is one export as importers read it: the cluster entry
// of its imports, without the cluster's name, and the pool's identity.
func buildSummary(cs ClusterSet, e exporter, counter endpointCounter) *inference.InferencePoolExportSummary {
	generation := max(e.pool.Generation, 0)
	entry, ready := clusterEntry(e, counter)
	entry.Conditions = []metav1.Condition{ready.condition(v1alpha1.ConditionReady, generation)}
	if e.draining {
		entry.Conditions = append(entry.Conditions, drainingCondition(e.member.Name, e.pool.Namespace, e.pool.Name, generation))
	}
	settings := e.settings(entry)
	entry.ExportSettings = settings.settings
	if c := settings.condition(generation); c != nil {
		entry.Conditions = append(entry.Conditions, *c)
	}
	return &inference.InferencePoolExportSummary{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         e.pool.Namespace,
			Name:              e.pool.Name,
			UID:               virtualUID(cs.Name, kindSummary, cs.Local, e.pool.Namespace, e.pool.Name),
			Generation:        generation,
			CreationTimestamp: e.pool.CreationTimestamp,
			Labels:            copyLabels(e.pool.Labels),
			Annotations:       summaryAnnotations(e),
		},
		Status: entry,
	}
}

// summaryAnnotations are what a summary carries of its pool's
// annotations: the cluster policy (servedPolicy) and, of a valid export,
// its export-to scope as written, which readers check too (exportsTo).
func summaryAnnotations(e exporter) map[string]string {
	out := servedPolicy(&e.pool.ObjectMeta)
	if v, ok := e.pool.Annotations[v1alpha1.ExportToAnnotation]; ok && e.invalid == nil {
		if out == nil {
			out = map[string]string{}
		}
		out[v1alpha1.ExportToAnnotation] = v
	}
	return out
}

// ExportScopeIncludes says whether the export a summary describes may be
// sent to the member of that name and labels: the rule by which the
// summary stream leaves out of a member's view every export whose scope
// does not include it, the rule importers apply too.
func ExportScopeIncludes(s *inference.InferencePoolExportSummary, member string, memberLabels map[string]string) bool {
	return exportScopeOf(s.Annotations).includes(member, memberLabels)
}

// clusterEntry is the one rule for an exporting cluster's entry of an
// import, from that cluster's own objects: how to reach the pool in its
// routing mode, and whether it is ready. The exporting cluster's server
// publishes it as a summary; a server that watches a member's objects
// computes the same from them. An invalid export has no routing mode and
// is not ready, with the exporter's reason.
func clusterEntry(e exporter, counter endpointCounter) (inference.InferencePoolExportSummaryStatus, verdict) {
	entry := inference.InferencePoolExportSummaryStatus{
		RoutingMode:      e.mode,
		TargetPortNumber: targetPortNumber(e.pool),
	}
	if e.invalid != nil {
		return entry, verdict{
			reason:  v1alpha1.ReasonInvalidExport,
			message: fmt.Sprintf("cluster %s: %s", e.member.Name, invalidExportMessage(e.pool.Annotations, e.pool.Labels, e.invalid)),
		}
	}
	var ready verdict
	switch e.mode {
	case inference.RoutingModeParent:
		entry.Parents, ready = parentImports(e.member, e.pool)
	default:
		epp, v := endpointPickerImport(e.member, e.pool, counter)
		entry.EndpointPicker = &epp
		ready = withEndpointAddresses(e.member.Name, e, &entry, v)
	}
	return entry, ready
}

// summaryEntry reads a member's published summary as its cluster entry.
// The result shares nothing with the member's cache. A summary this server
// cannot read (an unknown routing mode, no Ready condition, endpoint
// addresses that do not parse) gives an entry that is not ready, with a
// message that says why.
func summaryEntry(member string, s *v1alpha1.InferencePoolExportSummary) (inference.InferencePoolExportSummaryStatus, verdict) {
	entry, ready := readSummary(member, s)
	if ready.reason == v1alpha1.ReasonInvalidExport {
		entry.EndpointAddresses = nil
		return entry, ready
	}
	return entry, checkPublishedAddresses(member, &entry, ready)
}

// readSummary is summaryEntry before the endpoint addresses are checked.
func readSummary(member string, s *v1alpha1.InferencePoolExportSummary) (inference.InferencePoolExportSummaryStatus, verdict) {
	var entry inference.InferencePoolExportSummaryStatus
	// The generated conversion shares memory with its input where the
	// types agree: convert a copy.
	in := s.Status.DeepCopy()
	if err := v1alpha1.Convert_v1alpha1_InferencePoolExportSummaryStatus_To_inference_InferencePoolExportSummaryStatus(in, &entry, nil); err != nil {
		return entry, verdict{reason: v1alpha1.ReasonInvalidExport, message: fmt.Sprintf("cluster %s published a summary of %s/%s this server cannot read: %v", member, s.Namespace, s.Name, err)}
	}
	entry.Conditions = nil
	c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady)
	if c != nil {
		// The member's reason becomes the import's: it must be one that a
		// condition can carry, and the status one of the three.
		if problems := readyConditionProblems(c); len(problems) > 0 {
			return entry, verdict{
				reason:  v1alpha1.ReasonInvalidExport,
				message: fmt.Sprintf("cluster %s published a summary of %s/%s whose Ready condition this server cannot read: %s", member, s.Namespace, s.Name, strings.Join(problems, "; ")),
			}
		}
	}
	if c != nil && c.Reason == v1alpha1.ReasonInvalidExport {
		// An invalid export has no routing mode to check.
		return entry, verdict{reason: c.Reason, message: c.Message}
	}
	switch entry.RoutingMode {
	case inference.RoutingModeEndpoint, inference.RoutingModeParent:
	default:
		return entry, verdict{
			reason:  v1alpha1.ReasonInvalidExport,
			message: fmt.Sprintf("cluster %s published a summary of %s/%s with routing mode %q, which this server does not know", member, s.Namespace, s.Name, entry.RoutingMode),
		}
	}
	if entry.RoutingMode == inference.RoutingModeEndpoint && entry.EndpointPicker == nil {
		entry.EndpointPicker = &inference.EndpointPickerImport{Service: []inference.ServiceImport{}}
	}
	if c == nil {
		return entry, verdict{
			reason:  v1alpha1.ReasonNotReady,
			message: fmt.Sprintf("cluster %s published a summary of %s/%s without a Ready condition", member, s.Namespace, s.Name),
		}
	}
	return entry, verdict{ok: c.Status == metav1.ConditionTrue, reason: c.Reason, message: c.Message}
}

// readyConditionProblems says what makes a member's Ready condition
// unfit to pass on: a status other than True, False or Unknown, or a reason
// that a condition cannot carry (metav1's rules).
func readyConditionProblems(c *metav1.Condition) []string {
	var problems []string
	switch c.Status {
	case metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown:
	default:
		problems = append(problems, fmt.Sprintf("status %q is not True, False or Unknown", c.Status))
	}
	switch {
	case c.Reason == "":
		problems = append(problems, "it has no reason")
	case len(c.Reason) > maxConditionReasonBytes:
		problems = append(problems, fmt.Sprintf("its reason is %d bytes, at most %d", len(c.Reason), maxConditionReasonBytes))
	default:
		for _, p := range metav1validation.IsValidConditionReason(c.Reason) {
			problems = append(problems, fmt.Sprintf("reason %q: %s", c.Reason, p))
		}
	}
	return problems
}

// maxConditionReasonBytes is the longest reason a condition may have
// (metav1 validation's limit).
const maxConditionReasonBytes = 1024

// ClusterSummary computes the local cluster's InferenceClusterSummary: its
// namespaces that are not being deleted, which decide by namespace
// sameness what it imports. nil when the local cluster is not a member.
func ClusterSummary(cs ClusterSet) *inference.InferenceClusterSummary {
	local := cs.localMember()
	if local == nil {
		return nil
	}
	return &inference.InferenceClusterSummary{
		ObjectMeta: metav1.ObjectMeta{
			Name: cs.Local,
			UID:  virtualUID(cs.Name, kindClusterSummary, cs.Local),
			// Generation 1: the object has no spec that could move it.
			Generation: 1,
		},
		Status: inference.InferenceClusterSummaryStatus{Namespaces: local.namespaceNames()},
	}
}

// namespaceNames lists the member's namespaces that are not being deleted,
// sorted (hasNamespace's rule).
func (m *Member) namespaceNames() []string {
	if m == nil || m.Namespaces == nil {
		return nil
	}
	all, err := m.Namespaces.List(labels.Everything())
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(all))
	for _, ns := range all {
		if ns != nil && ns.DeletionTimestamp == nil {
			out = append(out, ns.Name)
		}
	}
	slices.Sort(out)
	return out
}

// meta is the identity an import takes from its exporters: the
// pool's, or its summary's, which carries the pool's.
func (e exporter) meta() *metav1.ObjectMeta {
	if e.summary != nil {
		return &e.summary.ObjectMeta
	}
	return &e.pool.ObjectMeta
}
