package routetable

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// Arrival is where the connection of a request arrived at the sidecar:
// the local port, and whether it is the main ext_proc listener, which the
// shim pools whose endpointPickerRef names no port use.
type Arrival struct {
	Port int32
	Main bool
}

// at reports whether a shim pool's connections arrive at a.
func (b *Backend) at(a Arrival) bool {
	return b.ShimPort == a.Port || (b.ShimPort == 0 && a.Main)
}

// ShimFor finds the shim pool a request is for, in this order: the pool
// named by v, the value of the gateway's filter metadata
// ShimMetadataNamespace/ShimPoolKey ("" when it has none); else, among the
// shim pools whose endpointPickerRef names the port the connection arrived
// on (at; all shim pools when none names it), the only one, or the only
// one among the backendRefs of the request's HTTPRoute rule. Gateways that
// send nothing naming a route or pool (NGINX Gateway Fabric) connect to
// the port of the pool they route to, so pools that share the sidecar's
// Service on different ports are told apart. Without one it returns nil
// with the status and message to answer.
//
// The backend returned is the pool as the request's HTTPRoute rule names
// it, when the rule has a backendRef to it: the route's policy and
// cluster weights apply, as they do to every backendRef (builder.backend);
// else the pool's own (its annotations, else the defaults). The gateway
// applies the rule's filters itself in shim mode.
func (t *Table) ShimFor(v string, at Arrival, attrs *RequestAttrs) (*Backend, int, string) {
	var rule *Rule
	if len(t.rules) > 0 {
		rule, _ = t.Match(attrs)
	}
	if v != "" {
		ns, name, ok := strings.Cut(v, "/")
		if !ok || ns == "" || name == "" {
			return nil, http.StatusBadRequest, fmt.Sprintf("the gateway's metadata %s/%s is %q, not namespace/name", ShimMetadataNamespace, ShimPoolKey, v)
		}
		if be := t.shims[types.NamespacedName{Namespace: ns, Name: name}]; be != nil {
			return asRouted(rule, be), 0, ""
		}
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("InferencePool %s, which the gateway's metadata names, does not name mci-sidecar's Service as its endpoint picker", v)
	}
	if len(t.shimList) == 0 {
		return nil, http.StatusServiceUnavailable, "no InferencePool names mci-sidecar's Service as its endpoint picker"
	}
	candidates := t.shimList
	var atPort []*Backend
	for _, be := range t.shimList {
		if be.at(at) {
			atPort = append(atPort, be)
		}
	}
	if len(atPort) > 0 {
		candidates = atPort
	}
	if len(candidates) == 1 {
		return asRouted(rule, candidates[0]), 0, ""
	}
	if found := ruleChoice(rule, candidates); found != nil {
		return found, 0, ""
	}
	which := fmt.Sprintf("%d InferencePools use mci-sidecar as their endpoint picker", len(candidates))
	if len(atPort) > 0 {
		which = fmt.Sprintf("InferencePools %s name port %d of mci-sidecar's Service as their endpoint picker", shimNames(atPort), at.Port)
	}
	return nil, http.StatusInternalServerError, fmt.Sprintf("%s and neither the gateway's metadata (%s/%s) nor the request's HTTPRoute rule says which one this request is for", which, ShimMetadataNamespace, ShimPoolKey)
}

// ruleChoice is the only one of the shim pools candidates that rule names
// (as the rule names it); nil when it names none or several.
func ruleChoice(rule *Rule, candidates []*Backend) *Backend {
	if rule == nil {
		return nil
	}
	var found *Backend
	for _, be := range rule.Backends {
		if !be.Shim || be.Invalid != "" || !slices.ContainsFunc(candidates, func(c *Backend) bool { return c.Namespace == be.Namespace && c.Name == be.Name }) {
			continue
		}
		if found != nil && (found.Namespace != be.Namespace || found.Name != be.Name) {
			return nil
		}
		found = be
	}
	return found
}

func shimNames(bes []*Backend) string {
	names := make([]string, len(bes))
	for i, be := range bes {
		names[i] = be.Namespace + "/" + be.Name
	}
	return strings.Join(names, ", ")
}

// asRouted is the backend of the shim pool pool as rule names it (the
// first valid backendRef of rule to it); pool itself when rule is nil or
// does not name it.
func asRouted(rule *Rule, pool *Backend) *Backend {
	if rule == nil {
		return pool
	}
	for _, be := range rule.Backends {
		if be.Shim && be.Invalid == "" && be.Namespace == pool.Namespace && be.Name == pool.Name {
			return be
		}
	}
	return pool
}

// LocalOnly returns the backend restricted to the shim pool's local EPP,
// failing closed: what a request relayed by another cluster's sidecar may
// use.
func (b *Backend) LocalOnly() *Backend {
	out := *b
	out.Clusters = nil
	out.FailureMode = poolv1.FailClose
	if b.Local != nil {
		c := *b.Local
		c.Weight = 1
		out.Local = &c
		out.Clusters = []*Cluster{&c}
	}
	out.wrr = newClusterRotation("relayed", out.Clusters)
	out.candidates = candidatesOf(&out)
	return &out
}

// isShim reports whether the pool's endpointPickerRef names one of the
// sidecar's own Services.
func isShim(p *poolv1.InferencePool, services []types.NamespacedName) bool {
	ref := p.Spec.EndpointPickerRef
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != "" && ref.Kind != "Service") {
		return false
	}
	return slices.Contains(services, types.NamespacedName{Namespace: p.Namespace, Name: ref.Name})
}

// shim builds the backend of a shim pool as requests reach it without an
// HTTPRoute; nil when the pool is no shim pool.
func (b *builder) shim(p *poolv1.InferencePool) *Backend {
	if !isShim(p, b.in.EndpointPickerServices) {
		return nil
	}
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	lr := b.localPool(key)
	be := &Backend{Kind: BackendInferencePool, Namespace: p.Namespace, Name: p.Name, Weight: 1, Shim: true, models: b.models[key]}
	be.FailureMode = failureMode(p)
	if port := p.Spec.EndpointPickerRef.Port; port != nil {
		be.ShimPort = port.Number
		b.checkShimPort(p, port.Number)
	}
	b.shimClusters(be, key, lr, nil)
	if len(be.Clusters) == 0 && b.imports[key] == nil {
		b.report(InferencePoolKind, key.Namespace, key.Name, ReasonNoShimClusters,
			"its endpoint picker is mci-sidecar, but no other cluster exports the pool and it has no %s annotation: its requests get 503, or follow FailOpen", LocalEndpointPickerAnnotation)
	}
	be.Policy = b.backendPolicy(routingpolicy.Config{}, InferencePoolKind, p)
	be.wrr = newClusterRotation("shim "+key.String(), be.Clusters)
	return be
}

// checkShimPort reports a sidecar Service whose port, which the shim pool
// p names, does not reach the sidecar on the same port number: the sidecar
// listens on the number the pool names and tells the pool by the port a
// connection arrives on. (A Service the sidecar cannot read says nothing.)
func (b *builder) checkShimPort(p *poolv1.InferencePool, port int32) {
	svc := b.svcs[types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.EndpointPickerRef.Name}]
	if svc == nil {
		return
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Port == port })
	switch {
	case i < 0:
		b.report(InferencePoolKind, p.Namespace, p.Name, ReasonShimPortMismatch,
			"its endpointPickerRef names port %d of mci-sidecar's Service %s, which has no such port: gateways cannot reach the pool's EPP", port, svc.Name)
	case svc.Spec.Ports[i].TargetPort.String() != "0" && svc.Spec.Ports[i].TargetPort.String() != strconv.Itoa(int(port)):
		b.report(InferencePoolKind, p.Namespace, p.Name, ReasonShimPortMismatch,
			"port %d of mci-sidecar's Service %s forwards to target port %s, but the sidecar listens on port %d for this pool and tells it by that port: set targetPort to %d (or leave it out)",
			port, svc.Name, svc.Spec.Ports[i].TargetPort.String(), port, port)
	}
}

// shimClusters gives a shim pool's backend its clusters: the pool's real
// local EPP (LocalEndpointPickerAnnotation), when it has one, also as
// Local, then the clusters of the import of the same namespace/name.
// weights are the route's cluster weights; nil: the pool's.
func (b *builder) shimClusters(be *Backend, key types.NamespacedName, lr localResult, weights map[string]int64) {
	if weights == nil {
		weights = lr.weights
	}
	weigh := func(c *Cluster) *Cluster {
		// c weighs what its exporter states (1 for the local pool).
		if w, ok := weights[c.Name]; ok {
			c.Weight *= w
		}
		return c
	}
	if lr.cluster != nil {
		c := *lr.cluster
		be.Local = weigh(&c)
		be.Clusters = append(be.Clusters, be.Local)
	}
	if imp := b.imports[key]; imp != nil {
		for _, c := range b.remoteClusters(imp) {
			c := *c
			be.Clusters = append(be.Clusters, weigh(&c))
		}
	}
}

// reportAmbiguousShims reports the ports of sidecar Services that several
// shim pools name: requests through them must say which pool they are
// for. Pools that share a Service on different ports are told apart by
// the port (ShimFor).
func (b *builder) reportAmbiguousShims(t *Table) {
	type servicePort struct {
		svc  types.NamespacedName
		port int32
	}
	byPort := map[servicePort][]string{}
	var order []servicePort
	for _, be := range t.shimList {
		p := b.pools[types.NamespacedName{Namespace: be.Namespace, Name: be.Name}]
		k := servicePort{types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.EndpointPickerRef.Name}, be.ShimPort}
		if byPort[k] == nil {
			order = append(order, k)
		}
		byPort[k] = append(byPort[k], p.Name)
	}
	for _, k := range order {
		if names := byPort[k]; len(names) > 1 {
			port := "no port (the sidecar's main ext_proc port)"
			if k.port != 0 {
				port = fmt.Sprintf("port %d", k.port)
			}
			b.report("Service", k.svc.Namespace, k.svc.Name, ReasonAmbiguousShimPool,
				"InferencePools %v all name this sidecar Service with %s as their endpoint picker: a request through it is routed only when the gateway's metadata (%s/%s) or its HTTPRoute rule says which pool it is for, else it gets 500 (give each pool a port of its own)",
				names, port, ShimMetadataNamespace, ShimPoolKey)
		}
	}
}
