package imports

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// localMember returns the member the computation is for, or nil when Local
// names no member: then nothing is served.
func (cs ClusterSet) localMember() *Member {
	for i := range cs.Members {
		if cs.Members[i].Name == cs.Local {
			return &cs.Members[i]
		}
	}
	return nil
}

// others returns every member but the local one, sorted by name. It does not
// rely on Members being sorted.
func (cs ClusterSet) others() []*Member {
	out := make([]*Member, 0, len(cs.Members))
	for i := range cs.Members {
		if cs.Members[i].Name != cs.Local {
			out = append(out, &cs.Members[i])
		}
	}
	slices.SortStableFunc(out, func(a, b *Member) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// hasNamespace says whether the member has the namespace. A missing lister
// or any lister error counts as "no": placement then errs on the side of
// serving nothing rather than something wrong.
//
// A namespace being deleted counts as gone: the namespace controller waits
// until no object is left in it, and an import kept there while the
// namespace exists would keep it Terminating forever.
func (m *Member) hasNamespace(namespace string) bool {
	if m == nil || m.Namespaces == nil || namespace == "" {
		return false
	}
	ns, err := m.Namespaces.Get(namespace)
	return err == nil && ns != nil && ns.DeletionTimestamp == nil
}

// pool gets one pool of the member, or nil.
func (m *Member) pool(namespace, name string) *poolv1.InferencePool {
	if m == nil || m.Pools == nil {
		return nil
	}
	p, err := m.Pools.InferencePools(namespace).Get(name)
	if err != nil {
		return nil
	}
	return p
}

// pools lists the member's pools in namespace ("" = all namespaces).
func (m *Member) pools(namespace string) []*poolv1.InferencePool {
	if m == nil || m.Pools == nil {
		return nil
	}
	var (
		out []*poolv1.InferencePool
		err error
	)
	if namespace == "" {
		out, err = m.Pools.List(labels.Everything())
	} else {
		out, err = m.Pools.InferencePools(namespace).List(labels.Everything())
	}
	if err != nil {
		return nil
	}
	return out
}

// namespaceCache remembers, within one call, which namespaces a member has:
// a list of a thousand pools in one namespace asks once, not a thousand times.
type namespaceCache map[*Member]map[string]bool

func (c namespaceCache) has(m *Member, namespace string) bool {
	known, ok := c[m]
	if !ok {
		known = map[string]bool{}
		c[m] = known
	}
	has, ok := known[namespace]
	if !ok {
		has = m.hasNamespace(namespace)
		known[namespace] = has
	}
	return has
}
