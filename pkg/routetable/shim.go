package routetable

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// ShimFor finds the shim pool a request is for, in this order: the pool
// named by v, the value of the gateway's filter metadata
// ShimMetadataNamespace/ShimPoolKey ("" when it has none); the only shim
// pool; the only shim pool among the backendRefs of the request's
// HTTPRoute rule. Without one it returns nil with the status and message
// to answer.
//
// The backend returned is the pool as the request's HTTPRoute rule names
// it, when the rule has a backendRef to it: the route's policy and
// cluster weights apply, as they do to every backendRef (builder.backend);
// else the pool's own (its annotations, else the defaults). The gateway
// applies the rule's filters itself in shim mode.
func (t *Table) ShimFor(v string, attrs *RequestAttrs) (*Backend, int, string) {
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
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("InferencePool %s, which the gateway's metadata names, does not name mci-sidecar's Service as its endpointPickerRef", v)
	}
	switch len(t.shimList) {
	case 0:
		return nil, http.StatusServiceUnavailable, "no InferencePool names mci-sidecar's Service as its endpointPickerRef"
	case 1:
		return asRouted(rule, t.shimList[0]), 0, ""
	}
	if rule != nil {
		var found *Backend
		for _, be := range rule.Backends {
			if !be.Shim || be.Invalid != "" {
				continue
			}
			if found != nil && (found.Namespace != be.Namespace || found.Name != be.Name) {
				found = nil
				break
			}
			found = be
		}
		if found != nil {
			return found, 0, ""
		}
	}
	return nil, http.StatusInternalServerError, fmt.Sprintf("%d InferencePools use mci-sidecar as their endpoint picker and neither the gateway's metadata (%s/%s) nor the request's HTTPRoute rule says which one this request is for",
		len(t.shimList), ShimMetadataNamespace, ShimPoolKey)
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
	b.shimClusters(be, key, lr, nil)
	if len(be.Clusters) == 0 && b.imports[key] == nil {
		b.report(InferencePoolKind, key.Namespace, key.Name, ReasonNoShimClusters,
			"its endpoint picker is mci-sidecar, but no other cluster exports the pool and it has no %s annotation: its requests get 503, or follow FailOpen", LocalEndpointPickerAnnotation)
	}
	be.Policy = b.backendPolicy("", InferencePoolKind, p)
	be.wrr = newClusterRotation("shim "+key.String(), be.Clusters)
	return be
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
		c.Weight = 1
		if w, ok := weights[c.Name]; ok {
			c.Weight = w
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

// reportAmbiguousShims reports the sidecar Services that several shim pools
// name: requests through them must say which pool they are for.
func (b *builder) reportAmbiguousShims(t *Table) {
	bySvc := map[types.NamespacedName][]string{}
	for _, be := range t.shimList {
		p := b.pools[types.NamespacedName{Namespace: be.Namespace, Name: be.Name}]
		svc := types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.EndpointPickerRef.Name}
		bySvc[svc] = append(bySvc[svc], p.Name)
	}
	for _, svc := range b.in.EndpointPickerServices {
		if names := bySvc[svc]; len(names) > 1 {
			b.report("Service", svc.Namespace, svc.Name, ReasonAmbiguousShimPool,
				"InferencePools %v all name this sidecar Service as their endpoint picker: a request through it is routed only when the gateway's metadata (%s/%s) or its HTTPRoute rule says which pool it is for, else it gets 500",
				names, ShimMetadataNamespace, ShimPoolKey)
		}
	}
}
