package routetable

import (
	"cmp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// Build computes a routing table from scratch: the reference the tests hold
// Incremental to (the sidecar itself only ever builds incrementally). It is
// a pure function of its inputs and never fails as a whole: what cannot be
// used is reported in the returned errors (also kept in Table.Errors), in a
// stable order.
func Build(in Inputs) (*Table, []error) {
	b := newBuilder(in)
	for _, p := range in.Pools {
		b.pools[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p
	}
	for _, imp := range in.Imports {
		b.imports[types.NamespacedName{Namespace: imp.Namespace, Name: imp.Name}] = imp
	}
	for _, s := range in.Services {
		b.svcs[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	for _, g := range in.Gateways {
		if k := (types.NamespacedName{Namespace: g.Namespace, Name: g.Name}); slices.Contains(in.ServedGateways, k) {
			b.gateways[k] = g
		}
	}
	for _, n := range in.Namespaces {
		b.nsLabels[n.Name] = n.Labels
	}
	for _, g := range in.ReferenceGrants {
		b.setGrant(g)
	}
	for _, p := range in.BackendTLSPolicies {
		b.btls[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p
	}
	b.indexModels()

	routes := slices.Clone(in.Routes)
	slices.SortFunc(routes, func(x, y *gatewayv1.HTTPRoute) int {
		if c := x.CreationTimestamp.Time.Compare(y.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
	})
	t := &Table{shimMode: len(in.EndpointPickerServices) > 0, local: b.local}
	for _, r := range routes {
		if hostnames, ok := b.attached(r); ok {
			b.route(t, r, hostnames)
		}
	}
	t.index.sort()
	if t.shimMode {
		pools := slices.Clone(in.Pools)
		slices.SortFunc(pools, func(x, y *poolv1.InferencePool) int {
			return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
		})
		for _, p := range pools {
			if be := b.shim(p); be != nil {
				t.addShim(be)
			}
		}
		b.reportAmbiguousShims(t)
	}
	t.Errors = b.errs
	return t, b.errs
}

// indexModels groups the InferenceModels and InferenceObjectives by the
// pool they name.
func (b *builder) indexModels() {
	byPool := map[types.NamespacedName]*requestmodel.ModelConfig{}
	of := func(k types.NamespacedName) *requestmodel.ModelConfig {
		if byPool[k] == nil {
			byPool[k] = &requestmodel.ModelConfig{}
		}
		return byPool[k]
	}
	for _, m := range b.in.Models {
		c := of(types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.PoolRef.Name})
		c.Models = append(c.Models, m)
	}
	for _, o := range b.in.Objectives {
		if k, ok := objectivePool(o); ok {
			c := of(k)
			c.Objectives = append(c.Objectives, o)
		}
	}
	keys := make([]types.NamespacedName, 0, len(byPool))
	for k := range byPool {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y types.NamespacedName) int { return strings.Compare(x.String(), y.String()) })
	for _, k := range keys {
		ms, errs := modelsOf(k, *byPool[k])
		b.models[k] = ms
		b.errs = append(b.errs, errs...)
	}
}

// sort puts every group in precedence order.
func (h *hostIndex) sort() {
	for _, ms := range h.exact {
		slices.SortFunc(ms, compareMatchers)
	}
	slices.SortFunc(h.wildcards, func(a, b wildcardGroup) int {
		if c := cmp.Compare(len(b.suffix), len(a.suffix)); c != 0 {
			return c
		}
		return strings.Compare(a.suffix, b.suffix)
	})
	for _, g := range h.wildcards {
		slices.SortFunc(g.matchers, compareMatchers)
	}
	slices.SortFunc(h.any, compareMatchers)
}
