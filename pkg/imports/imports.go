package imports

import (
	"fmt"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// importGeneration is the generation of every import: it has no spec, so
// nothing a user does can move it.
const importGeneration = 1

// Import computes the import of namespace/name that cs.Local serves;
// ok=false when it serves none: the local cluster lacks the namespace, or no
// member other than Local exports the pool. An invalid export is listed as
// a cluster that is not Ready, with the exporter's reason.
//
// Conditions come with a zero LastTransitionTime (see CarryTransitionTimes).
// The result shares nothing with the member caches.
func Import(cs ClusterSet, namespace, name string) (*inference.InferencePoolImport, bool) {
	if !cs.localMember().hasNamespace(namespace) {
		return nil, false
	}
	exporters := exportersOf(cs, namespace, name)
	if len(exporters) == 0 {
		return nil, false
	}
	counter := func(m *Member) endpointCounter { return sliceLister{lister: m.EndpointSlices} }
	return buildImport(cs, poolKey{namespace: namespace, name: name}, exporters, counter), true
}

// Imports computes every import cs.Local serves in namespace ("" = all
// namespaces), sorted by namespace then name.
//
// It lists each member's pools once and each member's EndpointSlices at most
// once, so its cost is linear in the size of the caches (plus a sort), not in
// pools times slices.
func Imports(cs ClusterSet, namespace string) []*inference.InferencePoolImport {
	local := cs.localMember()
	if local == nil || (namespace != "" && !local.hasNamespace(namespace)) {
		return nil
	}
	groups := exportGroups(cs, namespace)

	// Placement first, so that only the Services of imports actually served
	// are looked up.
	localNamespaces := namespaceCache{}
	placed := groups[:0]
	for _, g := range groups {
		if localNamespaces.has(local, g.key.namespace) {
			placed = append(placed, g)
		}
	}

	counters := sliceIndexes(placed, namespace)
	counter := func(m *Member) endpointCounter {
		if c, ok := counters[m]; ok {
			return c
		}
		return sliceLister{lister: m.EndpointSlices}
	}

	out := make([]*inference.InferencePoolImport, 0, len(placed))
	for _, g := range placed {
		out = append(out, buildImport(cs, g.key, g.exporters, counter))
	}
	return out
}

// sliceIndexes builds, for each member that exports in EndpointMode, the
// readiness counts of the EPP Services the imports will look at, from one
// pass over its EndpointSlices.
func sliceIndexes(groups []exportGroup, namespace string) map[*Member]endpointCounter {
	wanted := map[*Member]map[poolKey]struct{}{}
	for _, g := range groups {
		for _, e := range g.exporters {
			if e.pool == nil || e.mode != inference.RoutingModeEndpoint {
				continue
			}
			name, invalid := eppServiceName(e.member.Name, e.pool)
			if invalid != nil {
				continue
			}
			w, ok := wanted[e.member]
			if !ok {
				w = map[poolKey]struct{}{}
				wanted[e.member] = w
			}
			w[poolKey{namespace: e.pool.Namespace, name: name}] = struct{}{}
		}
	}
	out := make(map[*Member]endpointCounter, len(wanted))
	for m, w := range wanted {
		out[m] = newSliceIndex(m.EndpointSlices, namespace, w)
	}
	return out
}

// buildImport assembles the import of one pool from its exporters, which
// are sorted by cluster name and do not include the local cluster.
func buildImport(cs ClusterSet, key poolKey, exporters []exporter, counter func(*Member) endpointCounter) *inference.InferencePoolImport {
	oldest := oldestExporter(exporters)

	imp := &inference.InferencePoolImport{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         key.namespace,
			Name:              key.name,
			UID:               virtualUID(cs.Name, kindImport, key.namespace, key.name),
			Generation:        importGeneration,
			CreationTimestamp: oldest.CreationTimestamp,
			Labels:            copyLabels(oldest.Labels),
			Annotations:       servedPolicy(oldest),
		},
	}

	clusters := make([]inference.ImportedCluster, len(exporters))
	exporting := make([]inference.ExportingCluster, len(exporters))
	names := make([]string, len(exporters))
	var readyNames, notReady []string
	for i, e := range exporters {
		ic, ready := importedCluster(e, counter(e.member), importGeneration)
		clusters[i] = ic
		exporting[i] = inference.ExportingCluster{Name: ic.Name}
		names[i] = ic.Name
		if ready.ok {
			readyNames = append(readyNames, ic.Name)
		} else {
			notReady = append(notReady, fmt.Sprintf("%s: %s: %s", ic.Name, ready.reason, ready.message))
		}
	}

	accepted := verdict{
		ok:      true,
		reason:  v1alpha1.ReasonAccepted,
		message: "imported from " + strconv.Itoa(len(names)) + " exporting cluster(s): " + strings.Join(names, ", "),
	}
	ready := verdict{
		ok:      true,
		reason:  v1alpha1.ReasonReady,
		message: "ready in " + strconv.Itoa(len(readyNames)) + " of " + strconv.Itoa(len(names)) + " exporting cluster(s): " + strings.Join(readyNames, ", "),
	}
	if len(readyNames) == 0 {
		ready = verdict{
			reason:  v1alpha1.ReasonNotReady,
			message: "no exporting cluster is ready: " + strings.Join(notReady, "; "),
		}
	}
	// The import's conditions are mci's own, so its entry in
	// status.controllers shares them: served objects are never mutated in
	// place (CarryTransitionTimes sets both the same), and one slice instead
	// of two saves memory per import.
	conditions := []metav1.Condition{
		accepted.condition(v1alpha1.ConditionAccepted, importGeneration),
		ready.condition(v1alpha1.ConditionReady, importGeneration),
	}

	imp.Status = inference.InferencePoolImportStatus{
		Clusters: clusters,
		Controllers: []inference.ImportController{{
			Name:              v1alpha1.ControllerName,
			ExportingClusters: exporting,
			Parents:           importParents(cs.localMember(), key),
			Conditions:        conditions,
		}},
		Conditions:         conditions,
		ObservedGeneration: importGeneration,
	}
	return imp
}

// oldestExporter is the exporter whose metadata (labels, creation time) the
// import carries: the oldest valid one, else the oldest, so that an invalid
// export's labels (its cluster policy, say) never reach importers in place
// of a valid one's. Strictly older only: on a tie the first cluster by name
// wins.
func oldestExporter(exporters []exporter) *metav1.ObjectMeta {
	var oldest *metav1.ObjectMeta
	oldestValid := false
	for _, e := range exporters {
		m, valid := e.meta(), e.valid()
		switch {
		case oldest == nil, valid && !oldestValid:
		case valid == oldestValid && m.CreationTimestamp.Before(&oldest.CreationTimestamp):
		default:
			continue
		}
		oldest, oldestValid = m, valid
	}
	return oldest
}
