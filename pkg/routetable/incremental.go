package routetable

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
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
//     and InferenceObjectives are resolved once and kept until they change;
//     when an import changes, only its cluster entries that changed are
//     resolved again, the others' clusters and problems are kept.
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

// NewIncremental returns a builder with in's settings that holds in's
// objects, as if each had been set (the sidecar's Watcher gives it none
// and sets objects as informers see them).
func NewIncremental(in Inputs) *Incremental {
	objects := in
	in.Routes, in.Imports, in.Pools, in.Services, in.Models, in.Objectives = nil, nil, nil, nil, nil, nil
	in.Gateways, in.Namespaces, in.ReferenceGrants = nil, nil, nil
	in.BackendTLSPolicies = nil
	b := newBuilder(in)
	b.incremental = true
	x := &Incremental{
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
	x.load(objects)
	return x
}

// load sets every object of in.
func (x *Incremental) load(in Inputs) {
	setAll(in.Services, x.SetService)
	setAll(in.BackendTLSPolicies, x.SetBackendTLSPolicy)
	setAll(in.Pools, x.SetPool)
	setAll(in.Imports, x.SetImport)
	setAll(in.Models, x.SetModel)
	setAll(in.Objectives, x.SetObjective)
	setAll(in.Gateways, x.SetGateway)
	setAll(in.Namespaces, x.SetNamespace)
	setAll(in.ReferenceGrants, x.SetReferenceGrant)
	setAll(in.Routes, x.SetRoute)
}

func setAll[T any](objs []T, set func(T)) {
	for _, o := range objs {
		set(o)
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
		delete(x.b.entryMemo, k)
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
