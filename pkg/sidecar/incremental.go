package sidecar

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// Incremental builds routing tables from objects that change one at a time,
// redoing only what a change touches, and gives the same table as Build
// over the same objects (up to the order of Table.Errors):
//
//   - An HTTPRoute is compiled on its own (matches, rules, backends) and
//     recompiled when it changes or when a pool, import, Service or
//     InferenceModel that one of its backendRefs depends on changes; when
//     the listeners of a served Gateway it names change, or the labels of
//     its namespace (allowedRoutes selectors); when a ReferenceGrant of a
//     namespace its backendRefs refer to changes.
//   - A local pool's EPP, an import's clusters and a pool's InferenceModels
//     and InferenceObjectives are resolved once and kept until they change.
//   - The host index keeps the precedence-sorted matchers of every
//     hostname; only the hostnames of recompiled routes are sorted again,
//     the others are shared with the previous table.
//
// A table is never modified once returned, so requests reading the
// previous one are undisturbed. Incremental is not safe for concurrent use:
// one goroutine applies changes and builds.
type Incremental struct {
	b *builder

	routes  map[types.NamespacedName]*gatewayv1.HTTPRoute
	entries map[types.NamespacedName]*routeEntry
	// order is the attached routes' entries in precedence order (oldest
	// first); nil when it must be sorted again.
	order []*routeEntry

	// byName are the routes whose backendRefs name a namespace/name (pool
	// or import); bySvc the pools that depend on a Service.
	byName   map[types.NamespacedName]map[types.NamespacedName]struct{}
	bySvc    map[types.NamespacedName]map[types.NamespacedName]struct{}
	poolSvcs map[types.NamespacedName][]types.NamespacedName
	// byGateway are the routes that name a served Gateway, inNamespace the
	// same routes by namespace; byTarget the routes with backendRefs to
	// another namespace, by that namespace.
	byGateway   map[types.NamespacedName]map[types.NamespacedName]struct{}
	inNamespace map[string]map[types.NamespacedName]struct{}
	byTarget    map[string]map[types.NamespacedName]struct{}

	models     map[types.NamespacedName]*v1alpha2.InferenceModel
	modelsOf   map[types.NamespacedName]map[types.NamespacedName]*v1alpha2.InferenceModel
	objectives map[ObjectiveKey]*v1alpha2.InferenceObjective
	// objectivesOf are the objectives by the pool they name.
	objectivesOf map[types.NamespacedName]map[ObjectiveKey]*v1alpha2.InferenceObjective
	modelErrs    map[types.NamespacedName][]error
	shims        map[types.NamespacedName]*shimEntry
	hostGroups   map[string][]*matcher
	hostRoutes   map[string]map[types.NamespacedName]struct{}
	// uses counts the entries (routes, shims) that use a resolved object;
	// errRefs are the resolved objects that have problems, so that a table
	// lists the problems of the objects in use without visiting them all.
	uses    map[objectRef]int
	errRefs map[objectRef]struct{}

	// What changed since the last table.
	dirtyRoutes map[types.NamespacedName]struct{}
	dirtyNames  map[types.NamespacedName]struct{}
	dirtyModels map[types.NamespacedName]struct{}
	dirtyHosts  map[string]struct{}
	changed     bool

	last *Table
}

// routeEntry is one compiled HTTPRoute: attached, or naming a served
// Gateway that refuses it (no rules then, only its errors).
type routeEntry struct {
	key   types.NamespacedName
	route *gatewayv1.HTTPRoute
	// gateways are the served Gateways it names; targets the other
	// namespaces its backendRefs refer to.
	gateways []types.NamespacedName
	targets  []string
	rules    []*Rule
	// index holds the route's own matchers, unsorted, by hostname group.
	index hostIndex
	hosts []string
	names []types.NamespacedName
	used  map[objectRef]struct{}
	errs  []error
}

type shimEntry struct {
	be   *Backend
	used map[objectRef]struct{}
	errs []error
}

// NewIncremental returns a builder with Build's settings (the object lists
// of in are ignored) and no objects.
func NewIncremental(in Inputs) *Incremental {
	in.Routes, in.Imports, in.Pools, in.Services, in.Models, in.Objectives = nil, nil, nil, nil, nil, nil
	in.Gateways, in.Namespaces, in.ReferenceGrants = nil, nil, nil
	in.BackendTLSPolicies = nil
	b := newBuilder(in)
	b.incremental = true
	return &Incremental{
		b:            b,
		routes:       map[types.NamespacedName]*gatewayv1.HTTPRoute{},
		entries:      map[types.NamespacedName]*routeEntry{},
		byName:       map[types.NamespacedName]map[types.NamespacedName]struct{}{},
		bySvc:        map[types.NamespacedName]map[types.NamespacedName]struct{}{},
		poolSvcs:     map[types.NamespacedName][]types.NamespacedName{},
		byGateway:    map[types.NamespacedName]map[types.NamespacedName]struct{}{},
		inNamespace:  map[string]map[types.NamespacedName]struct{}{},
		byTarget:     map[string]map[types.NamespacedName]struct{}{},
		models:       map[types.NamespacedName]*v1alpha2.InferenceModel{},
		modelsOf:     map[types.NamespacedName]map[types.NamespacedName]*v1alpha2.InferenceModel{},
		objectives:   map[ObjectiveKey]*v1alpha2.InferenceObjective{},
		objectivesOf: map[types.NamespacedName]map[ObjectiveKey]*v1alpha2.InferenceObjective{},
		modelErrs:    map[types.NamespacedName][]error{},
		shims:        map[types.NamespacedName]*shimEntry{},
		hostGroups:   map[string][]*matcher{},
		hostRoutes:   map[string]map[types.NamespacedName]struct{}{},
		uses:         map[objectRef]int{},
		errRefs:      map[objectRef]struct{}{},
		dirtyRoutes:  map[types.NamespacedName]struct{}{},
		dirtyNames:   map[types.NamespacedName]struct{}{},
		dirtyModels:  map[types.NamespacedName]struct{}{},
		dirtyHosts:   map[string]struct{}{},
		changed:      true,
	}
}

func keyOf(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}

// SetRoute adds or replaces an HTTPRoute; DeleteRoute removes one.
func (x *Incremental) SetRoute(r *gatewayv1.HTTPRoute) {
	k := keyOf(r.Namespace, r.Name)
	x.routes[k] = r
	x.dirtyRoutes[k] = struct{}{}
}

func (x *Incremental) DeleteRoute(k types.NamespacedName) {
	if _, ok := x.routes[k]; ok {
		delete(x.routes, k)
		x.dirtyRoutes[k] = struct{}{}
	}
}

// SetImport adds or replaces an InferencePoolImport; DeleteImport removes
// one.
func (x *Incremental) SetImport(imp *v1alpha1.InferencePoolImport) {
	k := keyOf(imp.Namespace, imp.Name)
	x.b.imports[k] = imp
	x.name(k)
}

func (x *Incremental) DeleteImport(k types.NamespacedName) {
	if _, ok := x.b.imports[k]; ok {
		delete(x.b.imports, k)
		x.name(k)
	}
}

// SetPool adds or replaces a local InferencePool; DeletePool removes one.
func (x *Incremental) SetPool(p *poolv1.InferencePool) {
	k := keyOf(p.Namespace, p.Name)
	x.b.pools[k] = p
	x.setPoolServices(k, poolServices(p))
	x.name(k)
}

func (x *Incremental) DeletePool(k types.NamespacedName) {
	if _, ok := x.b.pools[k]; ok {
		delete(x.b.pools, k)
		x.setPoolServices(k, nil)
		x.name(k)
	}
}

// SetService adds or replaces a Service; DeleteService removes one. Only
// the pools whose EPP it may be are affected.
func (x *Incremental) SetService(s *corev1.Service) {
	k := keyOf(s.Namespace, s.Name)
	x.b.svcs[k] = s
	x.service(k)
}

func (x *Incremental) DeleteService(k types.NamespacedName) {
	if _, ok := x.b.svcs[k]; ok {
		delete(x.b.svcs, k)
		x.service(k)
	}
}

// SetBackendTLSPolicy adds or replaces a BackendTLSPolicy;
// DeleteBackendTLSPolicy removes one. The pools whose EPP Service it
// targets, before or after, are affected.
func (x *Incremental) SetBackendTLSPolicy(p *gatewayv1.BackendTLSPolicy) {
	k := keyOf(p.Namespace, p.Name)
	x.backendTLSPolicyTargets(x.b.btls[k])
	x.b.btls[k] = p
	x.backendTLSPolicyTargets(p)
}

func (x *Incremental) DeleteBackendTLSPolicy(k types.NamespacedName) {
	if p, ok := x.b.btls[k]; ok {
		delete(x.b.btls, k)
		x.backendTLSPolicyTargets(p)
	}
}

func (x *Incremental) backendTLSPolicyTargets(p *gatewayv1.BackendTLSPolicy) {
	if p == nil {
		return
	}
	for _, ref := range p.Spec.TargetRefs {
		if ref.Group == "" && ref.Kind == "Service" {
			x.service(keyOf(p.Namespace, string(ref.Name)))
		}
	}
}

// SetModel adds or replaces an InferenceModel; DeleteModel removes one.
func (x *Incremental) SetModel(m *v1alpha2.InferenceModel) {
	k := keyOf(m.Namespace, m.Name)
	x.removeModel(k)
	x.models[k] = m
	pk := keyOf(m.Namespace, m.Spec.PoolRef.Name)
	if x.modelsOf[pk] == nil {
		x.modelsOf[pk] = map[types.NamespacedName]*v1alpha2.InferenceModel{}
	}
	x.modelsOf[pk][k] = m
	x.dirtyModels[pk] = struct{}{}
}

func (x *Incremental) DeleteModel(k types.NamespacedName) { x.removeModel(k) }

func (x *Incremental) removeModel(k types.NamespacedName) {
	old, ok := x.models[k]
	if !ok {
		return
	}
	delete(x.models, k)
	pk := keyOf(old.Namespace, old.Spec.PoolRef.Name)
	delete(x.modelsOf[pk], k)
	if len(x.modelsOf[pk]) == 0 {
		delete(x.modelsOf, pk)
	}
	x.dirtyModels[pk] = struct{}{}
}

// SetGateway adds or replaces a Gateway; DeleteGateway removes one. Only
// the served Gateways matter, and of them only their listeners: a status
// update changes nothing.
func (x *Incremental) SetGateway(g *gatewayv1.Gateway) {
	k := keyOf(g.Namespace, g.Name)
	if !slices.Contains(x.b.in.ServedGateways, k) {
		return
	}
	if old := x.b.gateways[k]; old != nil && equality.Semantic.DeepEqual(old.Spec.Listeners, g.Spec.Listeners) {
		x.b.gateways[k] = g
		return
	}
	x.b.gateways[k] = g
	x.dirty(x.byGateway[k])
}

func (x *Incremental) DeleteGateway(k types.NamespacedName) {
	if _, ok := x.b.gateways[k]; ok {
		delete(x.b.gateways, k)
		x.dirty(x.byGateway[k])
	}
}

// SetNamespace adds or replaces a Namespace; DeleteNamespace removes one.
// Only its labels matter, to the routes of the namespace that name a
// served Gateway.
func (x *Incremental) SetNamespace(n *corev1.Namespace) {
	old, ok := x.b.nsLabels[n.Name]
	x.b.nsLabels[n.Name] = n.Labels
	if !ok || !maps.Equal(old, n.Labels) {
		x.dirty(x.inNamespace[n.Name])
	}
}

func (x *Incremental) DeleteNamespace(name string) {
	if _, ok := x.b.nsLabels[name]; ok {
		delete(x.b.nsLabels, name)
		x.dirty(x.inNamespace[name])
	}
}

// SetReferenceGrant adds or replaces a ReferenceGrant; DeleteReferenceGrant
// removes one. The routes with backendRefs to its namespace from another
// are affected.
func (x *Incremental) SetReferenceGrant(g *gatewayv1beta1.ReferenceGrant) {
	if old := x.b.grants[g.Namespace][g.Name]; old != nil && equality.Semantic.DeepEqual(old.Spec, g.Spec) {
		x.b.setGrant(g)
		return
	}
	x.b.setGrant(g)
	x.dirty(x.byTarget[g.Namespace])
}

func (x *Incremental) DeleteReferenceGrant(k types.NamespacedName) {
	if _, ok := x.b.grants[k.Namespace][k.Name]; ok {
		delete(x.b.grants[k.Namespace], k.Name)
		if len(x.b.grants[k.Namespace]) == 0 {
			delete(x.b.grants, k.Namespace)
		}
		x.dirty(x.byTarget[k.Namespace])
	}
}

// dirty marks routes for recompilation.
func (x *Incremental) dirty(routes map[types.NamespacedName]struct{}) {
	for rk := range routes {
		x.dirtyRoutes[rk] = struct{}{}
	}
}

// index adds (or, with add false, removes) a route to a set of a
// dependency index.
func index[K comparable](m map[K]map[types.NamespacedName]struct{}, k K, rk types.NamespacedName, add bool) {
	if add {
		if m[k] == nil {
			m[k] = map[types.NamespacedName]struct{}{}
		}
		m[k][rk] = struct{}{}
		return
	}
	delete(m[k], rk)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

// ObjectiveKey names an InferenceObjective: the two groups may hold one
// namespace/name each.
type ObjectiveKey struct {
	Group string
	types.NamespacedName
}

// KeyOfObjective is the key of an InferenceObjective of a group
// (apiVersion as requestmodel.ObjectiveFromLLMD sets it: llm-d.ai; anything else is
// inference.networking.x-k8s.io).
func KeyOfObjective(apiVersion string, k types.NamespacedName) ObjectiveKey {
	if apiVersion == llmdv1alpha2.SchemeGroupVersion.String() {
		return ObjectiveKey{Group: llmdv1alpha2.SchemeGroupVersion.Group, NamespacedName: k}
	}
	return ObjectiveKey{Group: v1alpha2.SchemeGroupVersion.Group, NamespacedName: k}
}

// SetObjective adds or replaces an InferenceObjective (of either group);
// DeleteObjective removes one.
func (x *Incremental) SetObjective(o *v1alpha2.InferenceObjective) {
	k := KeyOfObjective(o.APIVersion, keyOf(o.Namespace, o.Name))
	x.removeObjective(k)
	pk, ok := objectivePool(o)
	if !ok {
		return
	}
	x.objectives[k] = o
	if x.objectivesOf[pk] == nil {
		x.objectivesOf[pk] = map[ObjectiveKey]*v1alpha2.InferenceObjective{}
	}
	x.objectivesOf[pk][k] = o
	x.dirtyModels[pk] = struct{}{}
}

func (x *Incremental) DeleteObjective(k ObjectiveKey) { x.removeObjective(k) }

func (x *Incremental) removeObjective(k ObjectiveKey) {
	old, ok := x.objectives[k]
	if !ok {
		return
	}
	delete(x.objectives, k)
	pk, _ := objectivePool(old)
	delete(x.objectivesOf[pk], k)
	if len(x.objectivesOf[pk]) == 0 {
		delete(x.objectivesOf, pk)
	}
	x.dirtyModels[pk] = struct{}{}
}

// name marks everything resolved for a namespace/name (local pool, import)
// as stale.
func (x *Incremental) name(k types.NamespacedName) {
	delete(x.b.locals, k)
	delete(x.b.remotes, k)
	delete(x.errRefs, objectRef{key: k})
	delete(x.errRefs, objectRef{remote: true, key: k})
	x.dirtyNames[k] = struct{}{}
}

// using counts an entry's uses of objects in (delta 1) or out (-1), and
// notes the objects with problems.
func (x *Incremental) using(used map[objectRef]struct{}, delta int) {
	for ref := range used {
		x.uses[ref] += delta
		if x.uses[ref] <= 0 {
			delete(x.uses, ref)
		}
		if delta > 0 && len(x.errsOf(ref)) > 0 {
			x.errRefs[ref] = struct{}{}
		}
	}
}

func (x *Incremental) errsOf(ref objectRef) []error {
	if ref.remote {
		return x.b.remotes[ref.key].errs
	}
	return x.b.locals[ref.key].errs
}

// carryOver gives the weighted pickers of a recompiled route or shim the
// state of the ones they replace, when they pick among the same
// candidates with the same weights (see Router.Publish).
func carryOver(old map[string]*smoothWRR, w **smoothWRR) {
	if *w == nil {
		return
	}
	if p, ok := old[(*w).key]; ok {
		*w = p
	}
}

func wrrsOf(rules []*Rule, backends []*Backend) map[string]*smoothWRR {
	m := map[string]*smoothWRR{}
	add := func(w *smoothWRR) {
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

func (x *Incremental) service(k types.NamespacedName) {
	for pk := range x.bySvc[k] {
		x.name(pk)
	}
}

// poolServices are the Services a pool's resolution reads: its
// endpointPickerRef's and the one LocalEndpointPickerAnnotation names.
func poolServices(p *poolv1.InferencePool) []types.NamespacedName {
	out := []types.NamespacedName{keyOf(p.Namespace, p.Spec.EndpointPickerRef.Name)}
	if v, ok := p.Annotations[LocalEndpointPickerAnnotation]; ok {
		if ref, err := parseEndpointPicker(v); err == nil {
			out = append(out, keyOf(p.Namespace, ref.Name))
		}
	}
	return out
}

func (x *Incremental) setPoolServices(pk types.NamespacedName, svcs []types.NamespacedName) {
	for _, s := range x.poolSvcs[pk] {
		delete(x.bySvc[s], pk)
		if len(x.bySvc[s]) == 0 {
			delete(x.bySvc, s)
		}
	}
	if len(svcs) == 0 {
		delete(x.poolSvcs, pk)
		return
	}
	x.poolSvcs[pk] = svcs
	for _, s := range svcs {
		if x.bySvc[s] == nil {
			x.bySvc[s] = map[types.NamespacedName]struct{}{}
		}
		x.bySvc[s][pk] = struct{}{}
	}
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
	e := &routeEntry{key: rk, route: r, used: map[objectRef]struct{}{}}
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
	if !attached && len(e.gateways) == 0 {
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
		x.hostRoutes[h][rk] = struct{}{}
		x.dirtyHosts[h] = struct{}{}
	}
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
	if x.order == nil {
		x.order = make([]*routeEntry, 0, len(x.entries))
		for _, e := range x.entries {
			x.order = append(x.order, e)
		}
		slices.SortFunc(x.order, func(a, b *routeEntry) int {
			if c := a.route.CreationTimestamp.Time.Compare(b.route.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.key.String(), b.key.String())
		})
	}

	t := &Table{shimMode: x.shimMode(), local: x.b.local, carried: true}
	for h, ms := range x.hostGroups {
		switch {
		case h == "":
			t.index.any = ms
		case strings.HasPrefix(h, "*."):
			t.index.wildcards = append(t.index.wildcards, wildcardGroup{suffix: h[1:], matchers: ms})
		default:
			if t.index.exact == nil {
				t.index.exact = make(map[string][]*matcher, len(x.hostGroups))
			}
			t.index.exact[h] = ms
		}
	}
	slices.SortFunc(t.index.wildcards, func(a, b wildcardGroup) int {
		if c := cmp.Compare(len(b.suffix), len(a.suffix)); c != 0 {
			return c
		}
		return strings.Compare(a.suffix, b.suffix)
	})

	for _, e := range x.order {
		t.rules = append(t.rules, e.rules...)
		t.Errors = append(t.Errors, e.errs...)
	}
	if t.shimMode {
		keys := make([]types.NamespacedName, 0, len(x.shims))
		for k := range x.shims {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareNames)
		for _, k := range keys {
			e := x.shims[k]
			t.addShim(e.be)
			t.Errors = append(t.Errors, e.errs...)
		}
		b := *x.b
		b.errs = nil
		b.reportAmbiguousShims(t)
		t.Errors = append(t.Errors, b.errs...)
	}
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
	modelKeys := make([]types.NamespacedName, 0, len(x.modelErrs))
	for k := range x.modelErrs {
		modelKeys = append(modelKeys, k)
	}
	slices.SortFunc(modelKeys, compareNames)
	for _, k := range modelKeys {
		t.Errors = append(t.Errors, x.modelErrs[k]...)
	}
	return t
}

func compareNames(a, b types.NamespacedName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}
