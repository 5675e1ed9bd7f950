package imports

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// poolKey is a namespace/name: of a pool, or of a Service within a member.
type poolKey struct {
	namespace, name string
}

// exporter is one member's export of a pool, valid or not: its pool, when
// this server watches the member's objects, or else the summary the member
// publishes. Both are the member's cached objects: read them, never change
// them. An invalid export is listed too, so that importers see why a
// cluster they expected is not routable.
type exporter struct {
	member  *Member
	pool    *poolv1.InferencePool
	summary *v1alpha1.InferencePoolExportSummary
	mode    inference.RoutingMode
	// invalid is why ParseExport refused the pool's export annotations
	// (pool exporters only; a summary says it in its Ready condition).
	invalid error
	// draining: the export is valid and drains (the pool's
	// DrainAnnotation, or a summary's Draining condition).
	draining bool
}

// poolExporter is a member's pool as an exporter; ok=false when the pool
// does not ask to be exported: it has no export annotation (a leftover
// export-mode alone is reported by InferencePoolExport, but removing the
// upstream export annotation is how a pool is withdrawn).
func poolExporter(m *Member, p *poolv1.InferencePool) (exporter, bool) {
	if p == nil || !asksExport(p.Annotations) {
		return exporter{}, false
	}
	mode, _, err := ParseExport(p.Annotations, p.Labels)
	draining, _ := Draining(p.Annotations)
	return exporter{member: m, pool: p, mode: mode, invalid: err, draining: draining && err == nil}, true
}

// valid says whether the export is valid: importers route to it when its
// entry is Ready, and take the import's metadata from it first.
func (e exporter) valid() bool {
	if e.summary != nil {
		c := meta.FindStatusCondition(e.summary.Status.Conditions, v1alpha1.ConditionReady)
		return c == nil || c.Reason != v1alpha1.ReasonInvalidExport
	}
	return e.invalid == nil
}

// exportersOf returns the exporters of namespace/name among the members
// other than local whose export scope includes local, sorted by cluster
// name. One Get per member.
func exportersOf(cs ClusterSet, namespace, name string) []exporter {
	local := cs.localMember()
	var out []exporter
	for _, m := range cs.others() {
		var (
			e  exporter
			ok bool
		)
		if m.Summaries != nil {
			if s, err := m.Summaries.InferencePoolExportSummaries(namespace).Get(name); err == nil && s != nil {
				e, ok = summaryExporter(m, s), true
			}
		} else {
			e, ok = poolExporter(m, m.pool(namespace, name))
		}
		if ok && e.exportsTo(local) {
			out = append(out, e)
		}
	}
	return out
}

// exportsTo says whether the export's scope includes the member: an
// exporter outside whose scope the member is serves it no import. The
// scope is the pool's export-to annotation, which a summary carries as
// it is. In summary mode the exporter's server does not send a member
// outside the scope the summary at all (see the summary registry); this
// check is the same rule applied by the reader, so that full mode, and a
// summary stream that reached a member anyway, place imports alike. An
// invalid export has no scope: every member lists it, not Ready, as any
// invalid export, and it carries nothing to route to.
func (e exporter) exportsTo(m *Member) bool {
	if m == nil {
		return false
	}
	if !e.valid() {
		return true
	}
	return exportScopeOf(e.meta().Annotations).includes(m.Name, m.Labels)
}

// summaryExporter is a member's published summary as an exporter.
func summaryExporter(m *Member, s *v1alpha1.InferencePoolExportSummary) exporter {
	return exporter{member: m, summary: s, mode: inference.RoutingMode(s.Status.RoutingMode),
		draining: meta.IsStatusConditionTrue(s.Status.Conditions, v1alpha1.ConditionDraining)}
}

// exportsOf lists the exports of one member in namespace ("" = all
// namespaces), unsorted.
func exportsOf(m *Member, namespace string) []exporter {
	var out []exporter
	if m.Summaries != nil {
		var (
			summaries []*v1alpha1.InferencePoolExportSummary
			err       error
		)
		if namespace == "" {
			summaries, err = m.Summaries.List(labels.Everything())
		} else {
			summaries, err = m.Summaries.InferencePoolExportSummaries(namespace).List(labels.Everything())
		}
		if err != nil {
			return nil
		}
		for _, s := range summaries {
			if s != nil {
				out = append(out, summaryExporter(m, s))
			}
		}
		return out
	}
	for _, p := range m.pools(namespace) {
		if e, ok := poolExporter(m, p); ok {
			out = append(out, e)
		}
	}
	return out
}

// exportGroup is every exporter (other than local) of one pool.
type exportGroup struct {
	key       poolKey
	exporters []exporter // sorted by cluster name
}

// exportGroups lists the exports of every member other than local once, in
// namespace ("" = all namespaces), and groups them by namespace/name,
// sorted by namespace then name. O(P log P) for P exports.
func exportGroups(cs ClusterSet, namespace string) []exportGroup {
	local := cs.localMember()
	var all []exporter
	for _, m := range cs.others() {
		for _, e := range exportsOf(m, namespace) {
			if e.exportsTo(local) {
				all = append(all, e)
			}
		}
	}
	slices.SortFunc(all, func(a, b exporter) int {
		am, bm := a.meta(), b.meta()
		if c := cmp.Compare(am.Namespace, bm.Namespace); c != 0 {
			return c
		}
		if c := cmp.Compare(am.Name, bm.Name); c != 0 {
			return c
		}
		return cmp.Compare(a.member.Name, b.member.Name)
	})

	var groups []exportGroup
	for start := 0; start < len(all); {
		first := all[start].meta()
		end := start + 1
		for end < len(all) && all[end].meta().Namespace == first.Namespace && all[end].meta().Name == first.Name {
			end++
		}
		groups = append(groups, exportGroup{
			key:       poolKey{namespace: first.Namespace, name: first.Name},
			exporters: all[start:end:end],
		})
		start = end
	}
	return groups
}
