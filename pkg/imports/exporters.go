package imports

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// poolKey is a namespace/name: of a pool, or of a Service within a member.
type poolKey struct {
	namespace, name string
}

// exporter is one member's valid export of a pool: its pool, when this
// server watches the member's objects, or else the summary the member
// publishes. Both are the member's cached objects: read them, never change
// them.
type exporter struct {
	member  *Member
	pool    *poolv1.InferencePool
	summary *v1alpha1.InferencePoolExportSummary
	mode    inference.RoutingMode
}

// exportersOf returns the valid exporters of namespace/name among the
// members other than local, sorted by cluster name. One Get per member.
func exportersOf(cs ClusterSet, namespace, name string) []exporter {
	var out []exporter
	for _, m := range cs.others() {
		if m.Summaries != nil {
			if s, err := m.Summaries.InferencePoolExportSummaries(namespace).Get(name); err == nil && s != nil {
				out = append(out, summaryExporter(m, s))
			}
			continue
		}
		p := m.pool(namespace, name)
		if p == nil {
			continue
		}
		if mode, ok, err := ParseExport(p.Annotations); ok && err == nil {
			out = append(out, exporter{member: m, pool: p, mode: mode})
		}
	}
	return out
}

// summaryExporter is a member's published summary as an exporter: every
// summary is a valid export (the member publishes no other).
func summaryExporter(m *Member, s *v1alpha1.InferencePoolExportSummary) exporter {
	return exporter{member: m, summary: s, mode: inference.RoutingMode(s.Status.RoutingMode)}
}

// exportsOf lists the valid exports of one member in namespace ("" = all
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
		if p == nil {
			continue
		}
		if mode, ok, err := ParseExport(p.Annotations); ok && err == nil {
			out = append(out, exporter{member: m, pool: p, mode: mode})
		}
	}
	return out
}

// exportGroup is every valid exporter (other than local) of one pool.
type exportGroup struct {
	key       poolKey
	exporters []exporter // sorted by cluster name
}

// exportGroups lists the exports of every member other than local once, in
// namespace ("" = all namespaces), and groups them by namespace/name,
// sorted by namespace then name. O(P log P) for P exports.
func exportGroups(cs ClusterSet, namespace string) []exportGroup {
	var all []exporter
	for _, m := range cs.others() {
		all = append(all, exportsOf(m, namespace)...)
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
