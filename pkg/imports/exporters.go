package imports

import (
	"cmp"
	"slices"

	"github.com/mci-dev/mci/pkg/apis/inference"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// poolKey is a namespace/name: of a pool, or of a Service within a member.
type poolKey struct {
	namespace, name string
}

// exporter is one member's valid export of a pool. pool is the member's
// cached object: read it, never change it.
type exporter struct {
	member *Member
	pool   *poolv1.InferencePool
	mode   inference.RoutingMode
}

// exportersOf returns the valid exporters of namespace/name among the
// members other than local, sorted by cluster name. One Get per member.
func exportersOf(cs ClusterSet, namespace, name string) []exporter {
	var out []exporter
	for _, m := range cs.others() {
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

// exportGroup is every valid exporter (other than local) of one pool.
type exportGroup struct {
	key       poolKey
	exporters []exporter // sorted by cluster name
}

// exportGroups lists the pools of every member other than local once, in
// namespace ("" = all namespaces), and groups the valid exports by
// namespace/name, sorted by namespace then name. O(P log P) for P pools.
func exportGroups(cs ClusterSet, namespace string) []exportGroup {
	members := cs.others()
	var all []exporter
	for _, m := range members {
		for _, p := range m.pools(namespace) {
			if p == nil {
				continue
			}
			if mode, ok, err := ParseExport(p.Annotations); ok && err == nil {
				all = append(all, exporter{member: m, pool: p, mode: mode})
			}
		}
	}
	slices.SortFunc(all, func(a, b exporter) int {
		if c := cmp.Compare(a.pool.Namespace, b.pool.Namespace); c != 0 {
			return c
		}
		if c := cmp.Compare(a.pool.Name, b.pool.Name); c != 0 {
			return c
		}
		return cmp.Compare(a.member.Name, b.member.Name)
	})

	var groups []exportGroup
	for start := 0; start < len(all); {
		end := start + 1
		for end < len(all) && all[end].pool.Namespace == all[start].pool.Namespace && all[end].pool.Name == all[start].pool.Name {
			end++
		}
		groups = append(groups, exportGroup{
			key:       poolKey{namespace: all[start].pool.Namespace, name: all[start].pool.Name},
			exporters: all[start:end:end],
		})
		start = end
	}
	return groups
}
