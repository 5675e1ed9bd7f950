package imports

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// parentGateways are the Gateways among the pool's status.parents, as
// namespace/name (the pool's namespace when unset), without duplicates (a
// parent may be reported by several controllers), sorted.
func parentGateways(pool *poolv1.InferencePool) []poolKey {
	var out []poolKey
	for _, p := range pool.Status.Parents {
		ref := p.ParentRef
		if ref.Group != nil && *ref.Group != gatewayv1.GroupName {
			continue
		}
		if ref.Kind != "" && ref.Kind != "Gateway" {
			continue
		}
		if ref.Name == "" {
			continue
		}
		k := poolKey{namespace: ref.Namespace, name: ref.Name}
		if k.namespace == "" {
			k.namespace = pool.Namespace
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b poolKey) int {
		if c := cmp.Compare(a.namespace, b.namespace); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	return out
}

// parentImports computes a ParentMode cluster entry's parents and its Ready
// verdict: ready when some parent Gateway has a status address and is
// Programmed. A parent whose Gateway is missing is listed without a service
// and does not count.
func parentImports(m *Member, pool *poolv1.InferencePool) ([]inference.ParentImport, verdict) {
	keys := parentGateways(pool)
	if len(keys) == 0 {
		return nil, verdict{
			reason:  v1alpha1.ReasonNoReadyParents,
			message: fmt.Sprintf("InferencePool %s/%s in cluster %s has no Gateway in status.parents", pool.Namespace, pool.Name, m.Name),
		}
	}

	parents := make([]inference.ParentImport, 0, len(keys))
	var ready, problems []string
	for _, k := range keys {
		// service is a required list: [] rather than null for a missing Gateway.
		pi := inference.ParentImport{Name: k.name, Namespace: k.namespace, Service: []inference.ServiceImport{}}
		gw := m.gateway(k.namespace, k.name)
		if gw == nil {
			parents = append(parents, pi)
			problems = append(problems, fmt.Sprintf("Gateway %s/%s does not exist", k.namespace, k.name))
			continue
		}
		pi.Service = []inference.ServiceImport{gatewayService(gw)}
		pi.Conditions = slices.Clone(gw.Status.Conditions)
		parents = append(parents, pi)

		programmed := meta.IsStatusConditionTrue(gw.Status.Conditions, string(gatewayv1.GatewayConditionProgrammed))
		switch {
		case len(pi.Service[0].Addresses) == 0 && !programmed:
			problems = append(problems, fmt.Sprintf("Gateway %s/%s has no status address and is not Programmed", k.namespace, k.name))
		case len(pi.Service[0].Addresses) == 0:
			problems = append(problems, fmt.Sprintf("Gateway %s/%s has no status address", k.namespace, k.name))
		case !programmed:
			problems = append(problems, fmt.Sprintf("Gateway %s/%s is not Programmed", k.namespace, k.name))
		default:
			ready = append(ready, k.namespace+"/"+k.name)
		}
	}

	if len(ready) > 0 {
		return parents, verdict{
			ok:     true,
			reason: v1alpha1.ReasonReady,
			message: fmt.Sprintf("%d of %d parent Gateway(s) in cluster %s are Programmed with an address: %s",
				len(ready), len(keys), m.Name, strings.Join(ready, ", ")),
		}
	}
	return parents, verdict{
		reason:  v1alpha1.ReasonNoReadyParents,
		message: fmt.Sprintf("no parent Gateway of InferencePool %s/%s in cluster %s is Programmed with an address: %s", pool.Namespace, pool.Name, m.Name, strings.Join(problems, "; ")),
	}
}

// gatewayService is a Gateway as an importing gateway reaches it: its status
// addresses (in the order the Gateway reports them) and its listener ports
// (deduplicated, sorted).
func gatewayService(gw *gatewayv1.Gateway) inference.ServiceImport {
	si := inference.ServiceImport{Type: corev1.ServiceTypeLoadBalancer}
	for _, a := range gw.Status.Addresses {
		if a.Value != "" {
			si.Addresses = appendUnique(si.Addresses, a.Value)
		}
	}
	var ports []int32
	for _, l := range gw.Spec.Listeners {
		if l.Port != 0 {
			ports = appendUnique(ports, l.Port)
		}
	}
	slices.Sort(ports)
	if len(ports) > 0 {
		si.Ports = make([]inference.Port, len(ports))
		for i, p := range ports {
			si.Ports[i] = inference.Port{Number: p}
		}
	}
	return si
}

// gateway gets one Gateway of the member, or nil.
func (m *Member) gateway(namespace, name string) *gatewayv1.Gateway {
	if m.Gateways == nil {
		return nil
	}
	gw, err := m.Gateways.Gateways(namespace).Get(name)
	if err != nil {
		return nil
	}
	return gw
}

// namespaceLabels are the labels of one of the member's namespaces, nil
// when it has no such namespace (a listener's namespace selector is
// matched against them).
func (m *Member) namespaceLabels(namespace string) map[string]string {
	if m.Namespaces == nil {
		return nil
	}
	ns, err := m.Namespaces.Get(namespace)
	if err != nil {
		return nil
	}
	return ns.Labels
}
