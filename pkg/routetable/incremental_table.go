package routetable

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/requestmodel"
)

// carryOver gives the weighted pickers of a recompiled route or shim the
// state of the ones they replace, when they pick among the same
// candidates with the same weights (see Router.Publish).
func carryOver(old map[string]*rotation, w **rotation) {
	if *w == nil {
		return
	}
	if p, ok := old[(*w).key]; ok {
		*w = p
	}
}

func wrrsOf(rules []*Rule, backends []*Backend) map[string]*rotation {
	m := map[string]*rotation{}
	add := func(w *rotation) {
		if w != nil {
			m[w.key] = w
		}
	}
	for _, r := range rules {
		add(r.wrr)
		for _, be := range r.Backends {
			add(be.wrr)
		}
	}
	for _, be := range backends {
		add(be.wrr)
	}
	return m
}

// routeNames are the namespace/names a route's backendRefs name.
func routeNames(r *gatewayv1.HTTPRoute) []types.NamespacedName {
	var out []types.NamespacedName
	for _, rule := range r.Spec.Rules {
		for _, ref := range rule.BackendRefs {
			ns := r.Namespace
			if ref.Namespace != nil && *ref.Namespace != "" {
				ns = string(*ref.Namespace)
			}
			k := keyOf(ns, string(ref.Name))
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

// Table returns the table of the objects set so far, and whether it
// differs from the table the previous call returned (which it is, when
// nothing that matters changed).
func (x *Incremental) Table() (*Table, bool) {
	for pk := range x.dirtyModels {
		ms, objs := x.modelsOf[pk], x.objectivesOf[pk]
		if len(ms) > 0 || len(objs) > 0 {
			var c requestmodel.ModelConfig
			for _, m := range ms {
				c.Models = append(c.Models, m)
			}
			for _, o := range objs {
				c.Objectives = append(c.Objectives, o)
			}
			x.b.models[pk], x.modelErrs[pk] = modelsOf(pk, c)
		} else {
			delete(x.b.models, pk)
			delete(x.modelErrs, pk)
		}
		x.dirtyNames[pk] = struct{}{}
		// Their conflicts are the table's problems, whoever uses them.
		x.changed = true
	}
	clear(x.dirtyModels)
	for k := range x.dirtyNames {
		for rk := range x.byName[k] {
			x.dirtyRoutes[rk] = struct{}{}
		}
		x.changed = x.changed || x.shimMode()
	}
	for rk := range x.dirtyRoutes {
		x.compileRoute(rk)
	}
	if x.shimMode() {
		for k := range x.dirtyNames {
			x.compileShim(k)
		}
	}
	clear(x.dirtyRoutes)
	clear(x.dirtyNames)
	if !x.changed && x.last != nil {
		return x.last, false
	}
	x.last = x.assemble()
	x.changed = false
	return x.last, true
}

func (x *Incremental) shimMode() bool { return len(x.b.in.EndpointPickerServices) > 0 }

// compileRoute compiles one route afresh, or drops it.
func (x *Incremental) compileRoute(rk types.NamespacedName) {
	old := x.entries[rk]
	if old != nil {
		x.indexEntry(old, false)
		x.unhost(old)
		x.using(old.used, -1)
		delete(x.entries, rk)
		x.changed = true
	}
	r := x.routes[rk]
	if r == nil {
		if old != nil {
			x.order = nil
		}
		return
	}
	e, ours := x.entry(rk, r)
	if !ours {
		// None of the sidecar's business until it names a served Gateway.
		if old != nil {
			x.order = nil
		}
		return
	}
	x.indexEntry(e, true)
	x.using(e.used, 1)
	if old != nil {
		prev := wrrsOf(old.rules, nil)
		for _, r := range e.rules {
			carryOver(prev, &r.wrr)
			for _, be := range r.Backends {
				carryOver(prev, &be.wrr)
			}
		}
	}
	x.host(e)
	x.entries[rk] = e
	if old == nil || !old.route.CreationTimestamp.Equal(&r.CreationTimestamp) {
		x.order = nil
	} else if i := slices.Index(x.order, old); i >= 0 {
		x.order[i] = e
	} else {
		x.order = nil
	}
	x.changed = true
}

// entry compiles route r: its rules when it is attached, and what it
// depends on. ours is false when it is neither attached nor names a
// served Gateway.
func (x *Incremental) entry(rk types.NamespacedName, r *gatewayv1.HTTPRoute) (e *routeEntry, ours bool) {
	e = &routeEntry{key: rk, route: r, used: map[objectRef]struct{}{}}
	x.b.errs, x.b.used = nil, e.used
	hostnames, attached := x.b.attached(r)
	if attached {
		e.names = routeNames(r)
		for _, k := range e.names {
			if k.Namespace != rk.Namespace && !slices.Contains(e.targets, k.Namespace) {
				e.targets = append(e.targets, k.Namespace)
			}
		}
		t := &Table{}
		x.b.route(t, r, hostnames)
		e.rules, e.index = t.rules, t.index
	}
	e.errs = x.b.errs
	x.b.errs, x.b.used = nil, nil
	e.gateways, _ = servedParents(r, x.b.in.ServedGateways)
	return e, attached || len(e.gateways) > 0
}

// host records the hosts of e's index as its hosts, each with e's route
// and dirty.
func (x *Incremental) host(e *routeEntry) {
	for h := range e.index.exact {
		e.hosts = append(e.hosts, h)
	}
	for _, g := range e.index.wildcards {
		e.hosts = append(e.hosts, "*"+g.suffix)
	}
	if len(e.index.any) > 0 {
		e.hosts = append(e.hosts, "")
	}
	for _, h := range e.hosts {
		if x.hostRoutes[h] == nil {
			x.hostRoutes[h] = map[types.NamespacedName]struct{}{}
		}
		x.hostRoutes[h][e.key] = struct{}{}
		x.dirtyHosts[h] = struct{}{}
	}
}

// indexEntry adds (or removes) an entry's dependencies to the indexes
// that say which routes a change affects.
func (x *Incremental) indexEntry(e *routeEntry, add bool) {
	for _, k := range e.names {
		index(x.byName, k, e.key, add)
	}
	for _, g := range e.gateways {
		index(x.byGateway, g, e.key, add)
	}
	if len(e.gateways) > 0 {
		index(x.inNamespace, e.key.Namespace, e.key, add)
	}
	for _, ns := range e.targets {
		index(x.byTarget, ns, e.key, add)
	}
}

func (x *Incremental) unhost(e *routeEntry) {
	for _, h := range e.hosts {
		delete(x.hostRoutes[h], e.key)
		if len(x.hostRoutes[h]) == 0 {
			delete(x.hostRoutes, h)
		}
		x.dirtyHosts[h] = struct{}{}
	}
}

func (x *Incremental) compileShim(k types.NamespacedName) {
	old := x.shims[k]
	if old != nil {
		x.using(old.used, -1)
		delete(x.shims, k)
	}
	p := x.b.pools[k]
	if p == nil {
		return
	}
	e := &shimEntry{used: map[objectRef]struct{}{}}
	x.b.errs, x.b.used = nil, e.used
	e.be = x.b.shim(p)
	e.errs = x.b.errs
	x.b.errs, x.b.used = nil, nil
	if e.be == nil {
		return
	}
	x.using(e.used, 1)
	if old != nil {
		carryOver(wrrsOf(nil, []*Backend{old.be}), &e.be.wrr)
	}
	x.shims[k] = e
}

// matchersOf returns a route entry's matchers of one hostname group.
func (e *routeEntry) matchersOf(h string) []*matcher {
	switch {
	case h == "":
		return e.index.any
	case strings.HasPrefix(h, "*."):
		for _, g := range e.index.wildcards {
			if "*"+g.suffix == h {
				return g.matchers
			}
		}
		return nil
	default:
		return e.index.exact[h]
	}
}

// assemble makes a new table from the entries: the host groups of
// recompiled routes are sorted again, the others shared.
func (x *Incremental) assemble() *Table {
	x.regroupDirtyHosts()
	t := &Table{shimMode: x.shimMode(), local: x.b.local, carried: true}
	t.index = x.buildHostIndex()
	for _, e := range x.routeOrder() {
		t.rules = append(t.rules, e.rules...)
		t.Errors = append(t.Errors, e.errs...)
	}
	if t.shimMode {
		x.addShims(t)
	}
	x.appendObjectErrors(t)
	return t
}

// regroupDirtyHosts recomputes the sorted matchers of each hostname that a
// change touched.
func (x *Incremental) regroupDirtyHosts() {
	for h := range x.dirtyHosts {
		var ms []*matcher
		for rk := range x.hostRoutes[h] {
			ms = append(ms, x.entries[rk].matchersOf(h)...)
		}
		if len(ms) == 0 {
			delete(x.hostGroups, h)
			continue
		}
		slices.SortFunc(ms, compareMatchers)
		x.hostGroups[h] = ms
	}
	clear(x.dirtyHosts)
}

// routeOrder is the routes oldest first (Gateway API's precedence among
// equal matches), then by name; kept until a route is added or removed.
func (x *Incremental) routeOrder() []*routeEntry {
	if x.order == nil {
		x.order = slices.SortedFunc(maps.Values(x.entries), func(a, b *routeEntry) int {
			if c := a.route.CreationTimestamp.Time.Compare(b.route.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.key.String(), b.key.String())
		})
	}
	return x.order
}

// buildHostIndex files each hostname's matchers as any-host, wildcard (longest
// suffix first) or exact.
func (x *Incremental) buildHostIndex() hostIndex {
	var idx hostIndex
	for h, ms := range x.hostGroups {
		switch {
		case h == "":
			idx.any = ms
		case strings.HasPrefix(h, "*."):
			idx.wildcards = append(idx.wildcards, wildcardGroup{suffix: h[1:], matchers: ms})
		default:
			if idx.exact == nil {
				idx.exact = make(map[string][]*matcher, len(x.hostGroups))
			}
			idx.exact[h] = ms
		}
	}
	slices.SortFunc(idx.wildcards, func(a, b wildcardGroup) int {
		if c := cmp.Compare(len(b.suffix), len(a.suffix)); c != 0 {
			return c
		}
		return strings.Compare(a.suffix, b.suffix)
	})
	return idx
}

// addShims adds the shim pools, by name, with their errors and those of
// shim pools that share one EPP port.
func (x *Incremental) addShims(t *Table) {
	for _, k := range slices.SortedFunc(maps.Keys(x.shims), compareNames) {
		e := x.shims[k]
		t.addShim(e.be)
		t.Errors = append(t.Errors, e.errs...)
	}
	b := *x.b
	b.errs = nil
	b.reportAmbiguousShims(t)
	t.Errors = append(t.Errors, b.errs...)
}

// appendObjectErrors adds the errors of the objects that routes still use,
// then those of the models, each in a stable order.
func (x *Incremental) appendObjectErrors(t *Table) {
	refs := make([]objectRef, 0, len(x.errRefs))
	for ref := range x.errRefs {
		if x.uses[ref] > 0 {
			refs = append(refs, ref)
		}
	}
	slices.SortFunc(refs, func(a, b objectRef) int {
		if c := compareNames(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(b2i(a.remote), b2i(b.remote))
	})
	for _, ref := range refs {
		t.Errors = append(t.Errors, x.errsOf(ref)...)
	}
	for _, k := range slices.SortedFunc(maps.Keys(x.modelErrs), compareNames) {
		t.Errors = append(t.Errors, x.modelErrs[k]...)
	}
}

func compareNames(a, b types.NamespacedName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}
