package imports

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// Export computes the InferencePoolExport of the local pool namespace/name;
// ok=false when the pool does not exist or carries neither export
// annotation.
func Export(cs ClusterSet, namespace, name string) (*inference.InferencePoolExport, bool) {
	pool := cs.localMember().pool(namespace, name)
	if pool == nil || !hasExportAnnotation(pool.Annotations) {
		return nil, false
	}
	return buildExport(cs, pool, cs.others(), namespaceCache{}), true
}

// Exports computes the InferencePoolExport of every local pool in namespace
// ("" = all namespaces) that carries an export annotation, sorted by
// namespace then name.
func Exports(cs ClusterSet, namespace string) []*inference.InferencePoolExport {
	var pools []*poolv1.InferencePool
	for _, p := range cs.localMember().pools(namespace) {
		if p != nil && hasExportAnnotation(p.Annotations) {
			pools = append(pools, p)
		}
	}
	slices.SortFunc(pools, func(a, b *poolv1.InferencePool) int {
		if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})

	others := cs.others()
	namespaces := namespaceCache{}
	out := make([]*inference.InferencePoolExport, 0, len(pools))
	for _, p := range pools {
		out = append(out, buildExport(cs, p, others, namespaces))
	}
	return out
}

// buildExport reports what became of one local pool's export in each other
// member (others, sorted by name).
func buildExport(cs ClusterSet, pool *poolv1.InferencePool, others []*Member, namespaces namespaceCache) *inference.InferencePoolExport {
	mode, _, err := ParseExport(pool.Annotations, pool.Labels)
	// A member's apiserver never sets a negative generation, but one that
	// did must not make this server serve an object the API would refuse.
	generation := max(pool.Generation, 0)
	exp := &inference.InferencePoolExport{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         pool.Namespace,
			Name:              pool.Name,
			UID:               virtualUID(cs.Name, kindExport, cs.Local, pool.Namespace, pool.Name),
			Generation:        generation,
			CreationTimestamp: pool.CreationTimestamp,
			Labels:            copyLabels(pool.Labels),
		},
		Status: inference.InferencePoolExportStatus{
			ObservedGeneration: generation,
		},
	}

	valid := verdict{
		ok:      true,
		reason:  v1alpha1.ReasonExported,
		message: fmt.Sprintf("exported to the ClusterSet in %s", mode),
	}
	if err != nil {
		valid = verdict{reason: v1alpha1.ReasonInvalidExport, message: invalidExportMessage(pool.Annotations, pool.Labels, err)}
	} else {
		exp.Status.RoutingMode = mode
	}
	exp.Status.Conditions = []metav1.Condition{valid.condition(v1alpha1.ConditionValid, generation)}
	if draining, _ := Draining(pool.Annotations); err == nil {
		local := cs.localMember()
		if local == nil {
			local = &Member{Name: cs.Local}
		}
		if c, ok := drainCondition(local, draining, pool.Namespace, pool.Name, generation); ok {
			exp.Status.Conditions = append(exp.Status.Conditions, c)
		}
	}
	if err == nil {
		if c := poolSettings(cs.Local, pool.Annotations).condition(generation); c != nil {
			exp.Status.Conditions = append(exp.Status.Conditions, *c)
		}
	}

	if len(others) > 0 {
		scope := exportScopeOf(pool.Annotations)
		exp.Status.Clusters = make([]inference.ExportTargetCluster, len(others))
		for i, m := range others {
			if err == nil && !scope.includes(m.Name, m.Labels) {
				exp.Status.Clusters[i] = inference.ExportTargetCluster{
					Name:    m.Name,
					Reason:  v1alpha1.ReasonOutsideExportScope,
					Message: outOfScopeMessage(m.Name, pool.Namespace, pool.Name),
				}
				continue
			}
			exp.Status.Clusters[i] = exportTarget(m, pool, err, namespaces)
		}
	}
	return exp
}

// maxQuotedValue is how much of an annotation value the message of an
// invalid export quotes.
const maxQuotedValue = 256

// invalidExportMessage is the message of an export that ParseExport found
// invalid with err. ParseExport quotes the values it refuses, and a value
// may be 256 KiB while a condition's message may be 32 KiB: with every long
// value shortened, the message still says what is wrong and what is
// allowed. The verdict always comes from the real values; should the
// shortened ones read differently, the real message is kept (and the
// condition truncates it).
func invalidExportMessage(annotations, labels map[string]string, err error) string {
	var shortened map[string]string
	for k, v := range annotations {
		if len(v) <= maxQuotedValue {
			continue
		}
		if shortened == nil {
			shortened = maps.Clone(annotations)
		}
		shortened[k] = validPrefix(v, maxQuotedValue) + "... (" + strconv.Itoa(len(v)) + " bytes)"
	}
	if shortened != nil {
		if _, _, shortErr := ParseExport(shortened, labels); shortErr != nil {
			return shortErr.Error()
		}
	}
	return err.Error()
}

// exportTarget says whether one other member imports the pool, and why not.
func exportTarget(m *Member, pool *poolv1.InferencePool, invalid error, namespaces namespaceCache) inference.ExportTargetCluster {
	t := inference.ExportTargetCluster{Name: m.Name}
	has := namespaces.has(m, pool.Namespace)
	t.Imported = has
	if invalid != nil {
		// The importer lists this cluster, not Ready, with the reason,
		// when the pool asks to be exported.
		t.Imported = has && asksExport(pool.Annotations)
		t.Reason = v1alpha1.ReasonInvalidExport
		t.Message = fmt.Sprintf("cluster %s does not route to %s/%s: the export annotations are invalid (see the Valid condition)", m.Name, pool.Namespace, pool.Name)
		return t
	}

	switch {
	case m.Unreachable != nil:
		t.Reason = m.Unreachable.Reason()
		t.Message = m.Unreachable.Describe(m.Name)
		if m.Unreachable.Message != "" {
			t.Message += ": " + m.Unreachable.Message
		}
		if has {
			t.Message += fmt.Sprintf("; by its last known data it imports %s/%s", pool.Namespace, pool.Name)
		} else {
			t.Message += fmt.Sprintf("; by its last known data namespace %s does not exist there", pool.Namespace)
		}
	case !has:
		t.Reason = v1alpha1.ReasonNamespaceNotFound
		t.Message = fmt.Sprintf("namespace %s does not exist in cluster %s", pool.Namespace, m.Name)
	default:
		t.Reason = v1alpha1.ReasonImported
		t.Message = fmt.Sprintf("cluster %s imports %s/%s", m.Name, pool.Namespace, pool.Name)
	}
	return t
}
