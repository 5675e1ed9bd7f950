package sidecar

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// Inputs are everything a routing table is built from: the informers'
// contents and the sidecar's settings. Build does not modify them.
type Inputs struct {
	Routes   []*gatewayv1.HTTPRoute
	Imports  []*v1alpha1.InferencePoolImport
	Pools    []*poolv1.InferencePool
	Services []*corev1.Service
	// Models and Objectives give requests their criticality (MetricsBased
	// policy): the InferenceObjective a request names, else the
	// InferenceModel of its model (requestmodel.Models.Resolve). Objectives of the
	// llm-d.ai group are converted with requestmodel.ObjectiveFromLLMD.
	Models     []*v1alpha2.InferenceModel
	Objectives []*v1alpha2.InferenceObjective
	// BackendTLSPolicies of the local cluster say how local EPPs' TLS is
	// verified (and make their ext-proc port TLS).
	BackendTLSPolicies []*gatewayv1.BackendTLSPolicy

	// LocalCluster names this cluster; DefaultLocalCluster when empty.
	LocalCluster string
	// DefaultPolicy applies where no annotation chooses one;
	// PolicyHealthBased when empty.
	DefaultPolicy Policy
	// DefaultTransport is the mode of each EPP port that neither its pool
	// (annotation, Secret, BackendTLSPolicy) nor its import decides;
	// plaintext where it is empty too.
	DefaultTransport imports.TransportModes
	// ServedGateways, when not empty, are the Gateways the sidecar serves:
	// the table holds only the HTTPRoutes attached to one of them, as their
	// listeners allow (attach.go). Empty: every HTTPRoute, whatever its
	// parentRefs.
	ServedGateways []types.NamespacedName
	// Gateways are the cluster's Gateways (only the served ones are read),
	// Namespaces its namespaces (whose labels allowedRoutes selectors
	// match), ReferenceGrants what allows cross-namespace backendRefs.
	Gateways        []*gatewayv1.Gateway
	Namespaces      []*corev1.Namespace
	ReferenceGrants []*gatewayv1beta1.ReferenceGrant
	// EndpointPickerServices are the sidecar's own Services. When not
	// empty the sidecar is an EPP shim: a local InferencePool whose
	// endpointPickerRef names one of them is "this pool plus the import of
	// the same namespace/name" (see doc.go).
	EndpointPickerServices []types.NamespacedName
}

// Reasons of BuildErrors. Those of backendRefs are Gateway API's
// ResolvedRefs reasons.
const (
	ReasonInvalidKind            = "InvalidKind"
	ReasonBackendNotFound        = "BackendNotFound"
	ReasonRefNotPermitted        = "RefNotPermitted"
	ReasonUnsupportedValue       = "UnsupportedValue"
	ReasonInvalidAnnotation      = "InvalidAnnotation"
	ReasonNoReadyClusters        = "NoReadyClusters"
	ReasonInvalidImportedCluster = "InvalidImportedCluster"
	ReasonInvalidEndpointPicker  = "InvalidEndpointPicker"
	ReasonUnsupportedFilter      = "UnsupportedFilter"
	ReasonConflictingModel       = "ConflictingInferenceModel"
	ReasonLocalClusterInImport   = "LocalClusterInImport"
	ReasonNoBackendRefs          = "NoBackendRefs"
	ReasonAllWeightsZero         = "AllWeightsZero"
	ReasonNoShimClusters         = "NoClusters"
	ReasonAmbiguousShimPool      = "AmbiguousEndpointPickerService"
)

// BuildError is a problem Build found in an object. The object is still
// used as far as it can be: a broken backendRef answers 500 for its share of
// the traffic, a broken cluster of an import is skipped.
type BuildError struct {
	// Kind, Namespace and Name identify the object.
	Kind      string
	Namespace string
	Name      string
	// Reason is a CamelCase reason.
	Reason string
	// Message says what is wrong, for a person.
	Message string
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("%s %s/%s: %s: %s", e.Kind, e.Namespace, e.Name, e.Reason, e.Message)
}

// newBuilder returns a builder with in's settings and empty indexes.
func newBuilder(in Inputs) *builder {
	return &builder{
		in:      in,
		local:   cmp.Or(in.LocalCluster, DefaultLocalCluster),
		policy:  cmp.Or(in.DefaultPolicy, PolicyHealthBased),
		pools:   map[types.NamespacedName]*poolv1.InferencePool{},
		imports: map[types.NamespacedName]*v1alpha1.InferencePoolImport{},
		svcs:    map[types.NamespacedName]*corev1.Service{},
		btls:    map[types.NamespacedName]*gatewayv1.BackendTLSPolicy{},
		locals:  map[types.NamespacedName]localResult{},
		remotes: map[types.NamespacedName]remoteResult{},
		models:  map[types.NamespacedName]*requestmodel.Models{},

		gateways: map[types.NamespacedName]*gatewayv1.Gateway{},
		nsLabels: map[string]map[string]string{},
		grants:   map[string]map[string]*gatewayv1beta1.ReferenceGrant{},
	}
}

// Build computes a routing table. It is a pure function of its inputs and
// never fails as a whole: what cannot be used is reported in the returned
// errors (also kept in Table.Errors), in a stable order.
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
	be.Policy = cmp.Or(b.policyOf(InferencePoolKind, p, ""), b.policy)
	be.wrr = newClusterWRR("shim "+key.String(), be.Clusters)
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

type builder struct {
	in     Inputs
	local  string
	policy Policy

	pools   map[types.NamespacedName]*poolv1.InferencePool
	imports map[types.NamespacedName]*v1alpha1.InferencePoolImport
	svcs    map[types.NamespacedName]*corev1.Service
	btls    map[types.NamespacedName]*gatewayv1.BackendTLSPolicy

	// Resolved once, however many backendRefs name them, so that each
	// problem is reported once.
	locals  map[types.NamespacedName]localResult
	remotes map[types.NamespacedName]remoteResult
	models  map[types.NamespacedName]*requestmodel.Models

	// The served Gateways, the labels of namespaces, and the
	// ReferenceGrants by namespace and name.
	gateways map[types.NamespacedName]*gatewayv1.Gateway
	nsLabels map[string]map[string]string
	grants   map[string]map[string]*gatewayv1beta1.ReferenceGrant

	errs []error

	// incremental, when true, keeps the problems of local pools and imports
	// in their cached results instead of reporting them where they are
	// first resolved; used, when set, records which were resolved. The
	// Incremental builder needs both to know what a route depends on.
	incremental bool
	used        map[objectRef]struct{}
}

// objectRef names a resolved local pool (remote false) or import.
type objectRef struct {
	remote bool
	key    types.NamespacedName
}

// resolved records a resolution: its problems are reported by Build at the
// first one, and kept aside by Incremental.
func (b *builder) resolved(ref objectRef, mark int) []error {
	errs := slices.Clone(b.errs[mark:])
	if b.incremental {
		b.errs = b.errs[:mark]
	}
	return errs
}

func (b *builder) use(ref objectRef) {
	if b.used != nil {
		b.used[ref] = struct{}{}
	}
}

type remoteResult struct {
	clusters []*Cluster
	errs     []error
}

type localResult struct {
	pool    *poolv1.InferencePool
	cluster *Cluster
	// shim is true for a pool whose EPP is the sidecar; cluster is then the
	// pool's real local EPP, if it has one, and weights come from its
	// ClusterWeightsAnnotation.
	shim    bool
	weights map[string]int64
	errs    []error
}

func (b *builder) report(kind, namespace, name, reason, format string, args ...any) {
	b.errs = append(b.errs, &BuildError{Kind: kind, Namespace: namespace, Name: name, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// attached reports whether the route applies to the sidecar's Gateways
// and, when it does, the hostnames it is served for (nil: its own). A route
// that names a served Gateway whose listeners all refuse it is reported.
func (b *builder) attached(r *gatewayv1.HTTPRoute) ([]string, bool) {
	if len(b.in.ServedGateways) == 0 {
		return nil, true
	}
	a := b.attach(r)
	if a.named && !a.accepted {
		b.report("HTTPRoute", r.Namespace, r.Name, a.reason, "not attached to the sidecar's Gateway, so not served: %s", strings.Join(a.why, "; "))
	}
	return a.hostnames, a.accepted
}

func (b *builder) setGrant(g *gatewayv1beta1.ReferenceGrant) {
	if b.grants[g.Namespace] == nil {
		b.grants[g.Namespace] = map[string]*gatewayv1beta1.ReferenceGrant{}
	}
	b.grants[g.Namespace][g.Name] = g
}

// routeAnnotations are the settings a route's annotations give.
type routeAnnotations struct {
	policy      Policy
	weights     map[string]int64
	failureMode poolv1.EndpointPickerFailureMode
}

func (b *builder) annotations(r *gatewayv1.HTTPRoute) routeAnnotations {
	var ra routeAnnotations
	report := func(format string, args ...any) {
		b.report("HTTPRoute", r.Namespace, r.Name, ReasonInvalidAnnotation, format, args...)
	}
	ra.policy = b.policyOf("HTTPRoute", r, "; using the policy of the backend or the default")
	if v, ok := r.Annotations[ClusterWeightsAnnotation]; ok {
		w, err := parseClusterWeights(v)
		if err != nil {
			report("%s: %v; clusters weigh 1 each", ClusterWeightsAnnotation, err)
		}
		ra.weights = w
	}
	if v, ok := r.Annotations[FailureModeAnnotation]; ok {
		switch fm := poolv1.EndpointPickerFailureMode(v); fm {
		case poolv1.FailOpen, poolv1.FailClose:
			ra.failureMode = fm
		default:
			report("%s: unknown failure mode %q, want FailOpen or FailClose", FailureModeAnnotation, v)
		}
	}
	return ra
}

// parseClusterWeights parses "a=3,b=1" (spaces allowed).
func parseClusterWeights(s string) (map[string]int64, error) {
	w := map[string]int64{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, num, ok := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q is not cluster=weight", item)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 32)
		if err != nil || n < 0 || n > 1000000 {
			return nil, fmt.Errorf("weight of cluster %q: %q is not an integer from 0 to 1000000", name, num)
		}
		w[name] = n
	}
	return w, nil
}

// route compiles an attached route into t, for hostnames (nil: the
// route's own, or any when it has none).
func (b *builder) route(t *Table, r *gatewayv1.HTTPRoute, hostnames []string) {
	ra := b.annotations(r)
	key := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
	report := func(reason, format string, args ...any) {
		b.report("HTTPRoute", r.Namespace, r.Name, reason, format, args...)
	}
	if hostnames == nil {
		for _, h := range r.Spec.Hostnames {
			hostnames = append(hostnames, string(h))
		}
		if len(hostnames) == 0 {
			hostnames = append(hostnames, "")
		}
	}

	for ri, rule := range r.Spec.Rules {
		rl := &Rule{Route: key, Index: ri}
		filters, err := compileFilters(rule.Filters)
		switch {
		case err != nil:
			rl.Invalid = fmt.Sprintf("rule %d: %v", ri, err)
			report(ReasonUnsupportedFilter, "%s", rl.Invalid)
		case filters != nil && filters.redirect != nil:
			// A redirect answers every request of the rule, whatever its
			// backendRefs (it needs none).
			rl.redirect = filters
		}
		names := make([]string, 0, len(rule.BackendRefs))
		weights := make([]int64, 0, len(rule.BackendRefs))
		for bi, ref := range rule.BackendRefs {
			be := b.backend(r, ri, bi, ref.BackendRef, ra)
			if be.Invalid == "" && rl.Invalid == "" {
				// The rule's filters, then the backendRef's: what a
				// request picked for this backendRef goes through.
				if be.filters, err = compileFilters(rule.Filters, ref.Filters); err != nil {
					be.Invalid = fmt.Sprintf("%s: rule %d backendRef %d: %v", ReasonUnsupportedFilter, ri, bi, err)
					report(ReasonUnsupportedFilter, "rule %d backendRef %d: %v", ri, bi, err)
				}
			}
			rl.Backends = append(rl.Backends, be)
			names = append(names, be.String())
			weights = append(weights, be.Weight)
		}
		if rl.Invalid != "" || rl.redirect != nil {
			// Answered before any backendRef is picked.
		} else if len(rule.BackendRefs) == 0 {
			report(ReasonNoBackendRefs, "rule %d has no backendRefs: its requests get 500", ri)
		} else if !slices.ContainsFunc(weights, func(w int64) bool { return w > 0 }) {
			report(ReasonAllWeightsZero, "every backendRef of rule %d weighs 0: its requests get 500", ri)
		}
		rl.wrr = newSmoothWRR(wrrKey(key.String()+"#"+strconv.Itoa(ri), names, weights), weights)
		t.rules = append(t.rules, rl)

		matches := rule.Matches
		if len(matches) == 0 {
			// The API's default: a PathPrefix match on "/".
			matches = []gatewayv1.HTTPRouteMatch{{}}
		}
		for mi, m := range matches {
			mt, err := compileMatch(m)
			if err != nil {
				report(ReasonUnsupportedValue, "rule %d match %d: %v; the match is ignored", ri, mi, err)
				continue
			}
			mt.rule = rl
			mt.routeCreated = r.CreationTimestamp.Time
			mt.routeKey = key.String()
			mt.ruleIndex, mt.matchIndex = ri, mi
			for _, h := range hostnames {
				t.index.add(h, mt)
			}
		}
	}
}

// compileMatch turns an HTTPRouteMatch into a matcher, with the API's
// defaults (PathPrefix "/", Exact header and query matches).
func compileMatch(m gatewayv1.HTTPRouteMatch) (*matcher, error) {
	mt := &matcher{pathKind: pathPrefix, pathValue: "/"}
	if p := m.Path; p != nil {
		if p.Value != nil {
			mt.pathValue = *p.Value
		}
		typ := gatewayv1.PathMatchPathPrefix
		if p.Type != nil {
			typ = *p.Type
		}
		switch typ {
		case gatewayv1.PathMatchExact:
			mt.pathKind = pathExact
		case gatewayv1.PathMatchPathPrefix:
			mt.pathKind = pathPrefix
		case gatewayv1.PathMatchRegularExpression:
			re, err := regexp.Compile(`^(?:` + mt.pathValue + `)$`)
			if err != nil {
				return nil, fmt.Errorf("path regular expression %q: %w", mt.pathValue, err)
			}
			mt.pathKind, mt.pathRE = pathRegex, re
		default:
			return nil, fmt.Errorf("unknown path match type %q", typ)
		}
		if mt.pathKind != pathRegex && !strings.HasPrefix(mt.pathValue, "/") {
			return nil, fmt.Errorf("path %q does not start with /", mt.pathValue)
		}
	}
	if m.Method != nil {
		mt.method = string(*m.Method)
	}
	seen := map[string]bool{}
	for _, h := range m.Headers {
		name := strings.ToLower(string(h.Name))
		if seen[name] {
			// Gateway API: only the first entry of a name counts.
			continue
		}
		seen[name] = true
		vm, err := valueMatch(name, h.Value, h.Type == nil || *h.Type == gatewayv1.HeaderMatchExact,
			h.Type != nil && *h.Type == gatewayv1.HeaderMatchRegularExpression)
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", h.Name, err)
		}
		mt.headers = append(mt.headers, vm)
	}
	seen = map[string]bool{}
	for _, q := range m.QueryParams {
		name := string(q.Name)
		if seen[name] {
			continue
		}
		seen[name] = true
		vm, err := valueMatch(name, q.Value, q.Type == nil || *q.Type == gatewayv1.QueryParamMatchExact,
			q.Type != nil && *q.Type == gatewayv1.QueryParamMatchRegularExpression)
		if err != nil {
			return nil, fmt.Errorf("query parameter %s: %w", q.Name, err)
		}
		mt.query = append(mt.query, vm)
	}
	return mt, nil
}

func valueMatch(name, value string, exact, regex bool) (valueMatcher, error) {
	switch {
	case exact:
		return valueMatcher{name: name, value: value}, nil
	case regex:
		re, err := regexp.Compile(`^(?:` + value + `)$`)
		if err != nil {
			return valueMatcher{}, fmt.Errorf("regular expression %q: %w", value, err)
		}
		return valueMatcher{name: name, re: re}, nil
	default:
		return valueMatcher{}, fmt.Errorf("unknown match type")
	}
}

// backend resolves one backendRef of rule ri.
func (b *builder) backend(r *gatewayv1.HTTPRoute, ri, bi int, ref gatewayv1.BackendRef, ra routeAnnotations) *Backend {
	group, kind := "", "Service"
	if ref.Group != nil {
		group = string(*ref.Group)
	}
	if ref.Kind != nil {
		kind = string(*ref.Kind)
	}
	ns := r.Namespace
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = string(*ref.Namespace)
	}
	be := &Backend{Namespace: ns, Name: string(ref.Name), Weight: 1, FailureMode: poolv1.FailClose}
	if ref.Weight != nil {
		be.Weight = max(int64(*ref.Weight), 0)
	}
	invalid := func(reason, format string, args ...any) *Backend {
		msg := fmt.Sprintf("rule %d backendRef %d: ", ri, bi) + fmt.Sprintf(format, args...)
		be.Invalid = reason + ": " + msg
		b.report("HTTPRoute", r.Namespace, r.Name, reason, "%s", msg)
		return be
	}
	switch {
	case group == InferencePoolGroup && kind == InferencePoolKind:
		be.Kind = BackendInferencePool
	case group == InferencePoolImportGroup && kind == InferencePoolImportKind:
		be.Kind = BackendInferencePoolImport
	default:
		be.Kind = BackendKind(kind)
		return invalid(ReasonInvalidKind, "kind %q of group %q is not routed by mci-sidecar; want %s.%s or %s.%s",
			kind, group, InferencePoolKind, InferencePoolGroup, InferencePoolImportKind, InferencePoolImportGroup)
	}
	key := types.NamespacedName{Namespace: ns, Name: string(ref.Name)}
	if ns != r.Namespace && !b.referenceGranted(r.Namespace, group, kind, key) {
		return invalid(ReasonRefNotPermitted, "%s %s is in another namespace than the route, and no ReferenceGrant of namespace %s allows HTTPRoutes of namespace %s to refer to it", kind, key, ns, r.Namespace)
	}
	be.models = b.models[key]

	var obj metav1.Object
	switch be.Kind {
	case BackendInferencePool:
		lr := b.localPool(key)
		if lr.pool == nil {
			return invalid(ReasonBackendNotFound, "InferencePool %s does not exist", key)
		}
		obj = lr.pool
		be.FailureMode = failureMode(lr.pool)
		switch {
		case lr.shim:
			// The pool's EPP is this sidecar: relaying to it would loop.
			be.Shim = true
			b.shimClusters(be, key, lr, ra.weights)
		case lr.cluster != nil:
			c := *lr.cluster
			be.Clusters = []*Cluster{&c}
		}
	case BackendInferencePoolImport:
		imp := b.imports[key]
		if imp == nil {
			return invalid(ReasonBackendNotFound, "InferencePoolImport %s does not exist (no other cluster of the ClusterSet exports the pool)", key)
		}
		obj = imp
		for _, c := range b.remoteClusters(imp) {
			c := *c
			c.Weight = 1
			if w, ok := ra.weights[c.Name]; ok {
				c.Weight = w
			}
			be.Clusters = append(be.Clusters, &c)
		}
		lr := b.localPool(key)
		if lr.cluster != nil {
			c := *lr.cluster
			be.Local = &c
		}
		switch {
		case ra.failureMode != "":
			be.FailureMode = ra.failureMode
		case lr.pool != nil:
			be.FailureMode = failureMode(lr.pool)
		}
	}

	// The route's policy, else its backend's, else the default.
	be.Policy = cmp.Or(ra.policy, b.policyOf(string(be.Kind), obj, ""), b.policy)

	be.wrr = newClusterWRR(r.Namespace+"/"+r.Name+"#"+strconv.Itoa(ri)+"/"+strconv.Itoa(bi), be.Clusters)
	return be
}

// newClusterWRR returns the weighted picker of a backend's clusters.
func newClusterWRR(owner string, clusters []*Cluster) *smoothWRR {
	names := make([]string, len(clusters))
	weights := make([]int64, len(clusters))
	for i, c := range clusters {
		names[i], weights[i] = c.Name, c.Weight
	}
	return newSmoothWRR(wrrKey(owner, names, weights), weights)
}

// policyOf is the policy PolicyAnnotation names on obj (nil: none), ""
// when it names none: the one place the annotation is read. A route's
// annotation is read;
// a pool's or an import's annotation, else its label (an import carries its
// exporter's labels), where an empty value is none. An invalid value is
// reported against obj, with onInvalid appended, and is none.
func (b *builder) policyOf(kind string, obj metav1.Object, onInvalid string) Policy {
	var v string
	var ok bool
	if r, route := obj.(*gatewayv1.HTTPRoute); route {
		v, ok = r.Annotations[PolicyAnnotation]
	} else {
		v = objectSetting(obj, PolicyAnnotation)
		ok = v != ""
	}
	if !ok {
		return ""
	}
	p, err := ParsePolicy(v)
	if err != nil {
		b.report(kind, obj.GetNamespace(), obj.GetName(), ReasonInvalidAnnotation, "%s: %v%s", PolicyAnnotation, err, onInvalid)
		return ""
	}
	return p
}

// objectSetting reads a setting from an object's annotations, else from its
// labels (imports carry their exporter's labels, not its annotations).
func objectSetting(obj metav1.Object, key string) string {
	if obj == nil {
		return ""
	}
	if v, ok := obj.GetAnnotations()[key]; ok {
		return v
	}
	return obj.GetLabels()[key]
}

func failureMode(p *poolv1.InferencePool) poolv1.EndpointPickerFailureMode {
	if p.Spec.EndpointPickerRef.FailureMode == poolv1.FailOpen {
		return poolv1.FailOpen
	}
	return poolv1.FailClose
}

// localPool resolves a local InferencePool and its EPP, once.
func (b *builder) localPool(key types.NamespacedName) localResult {
	ref := objectRef{key: key}
	b.use(ref)
	if lr, ok := b.locals[key]; ok {
		return lr
	}
	mark := len(b.errs)
	lr := b.resolveLocal(key)
	lr.errs = b.resolved(ref, mark)
	b.locals[key] = lr
	return lr
}

func (b *builder) resolveLocal(key types.NamespacedName) localResult {
	lr := localResult{pool: b.pools[key]}
	if lr.pool == nil {
		return lr
	}
	secret, secretErr := imports.EndpointPickerSecret(lr.pool.Annotations)
	if secretErr != nil {
		// Never plaintext to an EPP that its pool says serves TLS.
		b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%v; the pool's local EPP is not routed to", secretErr)
	}
	modes, transportErr := imports.EndpointPickerTransport(lr.pool.Annotations)
	if transportErr != nil {
		b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%v; the pool's local EPP is not routed to", transportErr)
		secretErr = transportErr
	}
	switch {
	case isShim(lr.pool, b.in.EndpointPickerServices):
		lr.shim = true
		if v, ok := lr.pool.Annotations[ClusterWeightsAnnotation]; ok {
			w, err := parseClusterWeights(v)
			if err != nil {
				b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%s: %v; clusters weigh 1 each", ClusterWeightsAnnotation, err)
			}
			lr.weights = w
		}
		v, ok := lr.pool.Annotations[LocalEndpointPickerAnnotation]
		if !ok {
			break
		}
		ref, err := parseEndpointPicker(v)
		if err == nil && secretErr == nil {
			lr.cluster, err = b.localCluster(lr.pool, ref, secret, modes)
		}
		if err != nil {
			b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%s: %v; the pool's local model servers are not routed to", LocalEndpointPickerAnnotation, err)
		}
	case secretErr == nil:
		c, err := b.localCluster(lr.pool, lr.pool.Spec.EndpointPickerRef, secret, modes)
		if err != nil {
			b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidEndpointPicker, "%v; the pool has no cluster to route to", err)
		}
		lr.cluster = c
	}
	return lr
}

// parseEndpointPicker parses LocalEndpointPickerAnnotation: "service" or
// "service:port".
func parseEndpointPicker(v string) (poolv1.EndpointPickerRef, error) {
	name, port, hasPort := strings.Cut(strings.TrimSpace(v), ":")
	ref := poolv1.EndpointPickerRef{Name: name}
	if name == "" || strings.Contains(name, "/") {
		return ref, fmt.Errorf("%q is not a Service name of the pool's namespace, with an optional :port", v)
	}
	if hasPort {
		n, err := strconv.ParseInt(port, 10, 32)
		if err != nil || n < 1 || n > 65535 {
			return ref, fmt.Errorf("port %q of %q is not a port number", port, v)
		}
		ref.Port = &poolv1.Port{Number: int32(n)}
	}
	return ref, nil
}

// localCluster locates a local pool's EPP through its Service, the way
// mci-apiserver locates an exported one: the Service's LoadBalancer ingress,
// else its cluster IP, else its ExternalName; the endpointPickerRef's port,
// else the Service port named for ext-proc; health and metrics ports by name,
// else the conventional 9003 and 9090 when the Service has them. secret,
// when set, names the Secret of the pool's namespace to reach all three
// with; modes are the pool's transport annotation.
func (b *builder) localCluster(p *poolv1.InferencePool, ref poolv1.EndpointPickerRef, secret string, modes imports.TransportModes) (*Cluster, error) {
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != "" && ref.Kind != "Service") {
		return nil, fmt.Errorf("endpointPickerRef names a %s; only a core Service is supported", cmp.Or(ref.Kind, "Service"))
	}
	if ref.Name == "" {
		return nil, fmt.Errorf("endpointPickerRef has no name")
	}
	svc := b.svcs[types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}]
	if svc == nil {
		return nil, fmt.Errorf("Service %s/%s of the endpointPickerRef does not exist", p.Namespace, ref.Name)
	}
	addrs := imports.ServiceAddresses(svc)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("Service %s/%s of the endpointPickerRef has no address", p.Namespace, ref.Name)
	}
	refPort := int32(0)
	if ref.Port != nil {
		refPort = ref.Port.Number
	}
	// The rule mci-apiserver uses for the pool's import, so that the local
	// pool and its import reach the same port of the same Service.
	ports := imports.ResolveEPPPorts(svc, refPort)
	port := ports.ExtProc
	if port == 0 {
		return nil, fmt.Errorf("the ext-proc port of Service %s/%s is unknown: set endpointPickerRef.port", p.Namespace, ref.Name)
	}
	c := &Cluster{
		Name:   b.local,
		Pool:   p.Namespace + "/" + p.Name,
		Mode:   v1alpha1.RoutingModeEndpoint,
		EPP:    net.JoinHostPort(addrs[0], strconv.Itoa(int(port))),
		Weight: 1,
		Local:  true,
	}
	var secretRef types.NamespacedName
	if secret != "" {
		secretRef = types.NamespacedName{Namespace: p.Namespace, Name: secret}
	}
	var err error
	def := b.in.DefaultTransport
	validation := b.localValidation(p.Namespace, svc)
	if c.EPPTransport, err = resolveTransport(imports.PortExtProc, modes.ExtProc, secretRef, validation(port), p.Namespace, def.ExtProc); err != nil {
		return nil, err
	}
	if hp := ports.Health; hp != 0 {
		c.Health = net.JoinHostPort(addrs[0], strconv.Itoa(int(hp)))
		if c.HealthTransport, err = resolveTransport(imports.PortHealth, modes.Health, secretRef, validation(hp), p.Namespace, def.Health); err != nil {
			return nil, err
		}
	}
	if mp := ports.Metrics; mp != 0 {
		if c.MetricsTransport, err = resolveTransport(imports.PortMetrics, modes.Metrics, secretRef, validation(mp), p.Namespace, def.Metrics); err != nil {
			return nil, err
		}
		c.Metrics = metricsURL(addrs[0], mp, c.MetricsTransport.TLS)
	}
	return c, nil
}

// localValidation returns, for a port number of a local EPP Service, the
// validation of the local cluster's BackendTLSPolicy for that port (see
// imports.TLSPolicyForPort), nil without one.
func (b *builder) localValidation(namespace string, svc *corev1.Service) func(port int32) *v1alpha1.BackendTLSValidation {
	var policies []*gatewayv1.BackendTLSPolicy
	for k, p := range b.btls {
		if k.Namespace == namespace {
			policies = append(policies, p)
		}
	}
	return func(port int32) *v1alpha1.BackendTLSValidation {
		if len(policies) == 0 {
			return nil
		}
		name := ""
		for _, sp := range svc.Spec.Ports {
			if sp.Port == port {
				name = sp.Name
			}
		}
		p := imports.TLSPolicyForPort(policies, svc.Name, name)
		if p == nil {
			return nil
		}
		var out v1alpha1.BackendTLSValidation
		// The import's own conversion, so that local and imported
		// validations are alike.
		_ = v1alpha1.Convert_inference_BackendTLSValidation_To_v1alpha1_BackendTLSValidation(imports.ValidationOf(p), &out, nil)
		return &out
	}
}

// metricsURL is where an EPP's metrics are scraped: over HTTPS when its
// transport is TLS.
func metricsURL(host string, port int32, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, strconv.Itoa(int(port))) + "/metrics"
}

// remoteClusters resolves an import's clusters, once: the entries whose
// Ready condition is not False and that carry what their routing mode
// needs.
func (b *builder) remoteClusters(imp *v1alpha1.InferencePoolImport) []*Cluster {
	key := types.NamespacedName{Namespace: imp.Namespace, Name: imp.Name}
	ref := objectRef{remote: true, key: key}
	b.use(ref)
	if rr, ok := b.remotes[key]; ok {
		return rr.clusters
	}
	mark := len(b.errs)
	out := b.resolveRemote(imp)
	b.remotes[key] = remoteResult{clusters: out, errs: b.resolved(ref, mark)}
	return out
}

func (b *builder) resolveRemote(imp *v1alpha1.InferencePoolImport) []*Cluster {
	key := types.NamespacedName{Namespace: imp.Namespace, Name: imp.Name}
	report := func(reason, format string, args ...any) {
		b.report(InferencePoolImportKind, imp.Namespace, imp.Name, reason, format, args...)
	}
	var out []*Cluster
	notReady := 0
	for _, ic := range imp.Status.Clusters {
		if ic.Name == b.local {
			// An import never lists the importing cluster; one that does
			// would send requests in a circle.
			report(ReasonLocalClusterInImport, "cluster %q is the local cluster; it is skipped", ic.Name)
			continue
		}
		if meta.IsStatusConditionFalse(ic.Conditions, v1alpha1.ConditionReady) {
			notReady++
			continue
		}
		c := &Cluster{Name: ic.Name, Pool: key.String(), Mode: cmp.Or(ic.RoutingMode, v1alpha1.RoutingModeEndpoint), Weight: 1}
		switch c.Mode {
		case v1alpha1.RoutingModeEndpoint:
			svc := ic.EndpointPicker.Service
			if len(svc) == 0 || len(svc[0].Addresses) == 0 || len(svc[0].Ports) == 0 || svc[0].Ports[0].Number <= 0 {
				report(ReasonInvalidImportedCluster, "cluster %q: the endpointPicker has no service address and port; the cluster is skipped", ic.Name)
				continue
			}
			epp := ic.EndpointPicker
			secrets, err := importSecrets(imp.Namespace, epp.SecretRef, epp.Health, epp.Metrics)
			if err != nil {
				// Never plaintext to an EPP that its import says serves TLS.
				report(ReasonInvalidImportedCluster, "cluster %q: %v; the cluster is skipped", ic.Name, err)
				continue
			}
			if err := b.importTransports(c, imp.Namespace, epp, secrets); err != nil {
				report(ReasonInvalidImportedCluster, "cluster %q: %v; the cluster is skipped", ic.Name, err)
				continue
			}
			host := svc[0].Addresses[0]
			c.EPP = net.JoinHostPort(host, strconv.Itoa(int(svc[0].Ports[0].Number)))
			if h := epp.Health; h != nil && h.Port > 0 {
				c.Health = net.JoinHostPort(host, strconv.Itoa(int(h.Port)))
			}
			if m := epp.Metrics; m != nil && m.Port > 0 {
				c.Metrics = metricsURL(host, m.Port, c.MetricsTransport.TLS)
			}
		case v1alpha1.RoutingModeParent:
			c.Parent = parentAddress(ic.Parents)
			if c.Parent == "" {
				report(ReasonInvalidImportedCluster, "cluster %q: no parent gateway has an address and a port; the cluster is skipped", ic.Name)
				continue
			}
		default:
			report(ReasonInvalidImportedCluster, "cluster %q: unknown routing mode %q; the cluster is skipped", ic.Name, ic.RoutingMode)
			continue
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		report(ReasonNoReadyClusters, "none of its %d cluster(s) can take requests (%d not Ready); its requests get 503, or follow FailOpen", len(imp.Status.Clusters), notReady)
	}
	return out
}

// importTransports resolves how each port of an imported cluster's EPP is
// reached, from the import's transports, its Secrets and the sidecar's
// defaults.
func (b *builder) importTransports(c *Cluster, namespace string, epp v1alpha1.EndpointPickerImport, secrets [3]types.NamespacedName) error {
	def := b.in.DefaultTransport
	mode, validation := transportOf(epp.Transport)
	var err error
	if c.EPPTransport, err = resolveTransport(imports.PortExtProc, mode, secrets[0], validation, namespace, def.ExtProc); err != nil {
		return err
	}
	if epp.Health != nil {
		mode, validation = transportOf(epp.Health.Transport)
		if c.HealthTransport, err = resolveTransport(imports.PortHealth, mode, secrets[1], validation, namespace, def.Health); err != nil {
			return err
		}
	}
	if epp.Metrics != nil {
		mode, validation = transportOf(epp.Metrics.Transport)
		if c.MetricsTransport, err = resolveTransport(imports.PortMetrics, mode, secrets[2], validation, namespace, def.Metrics); err != nil {
			return err
		}
	}
	return nil
}

// importSecrets returns the Secrets of an import's endpointPicker, health
// and metrics secretRefs (zero for none). A reference without a namespace
// is to the import's own; one to another namespace is refused, as there is
// no ReferenceGrant for it (mci-apiserver only ever names the pool's).
func importSecrets(namespace string, epp *corev1.SecretReference, health *v1alpha1.HealthEndpoint, metrics *v1alpha1.MetricsEndpoint) ([3]types.NamespacedName, error) {
	refs := [3]*corev1.SecretReference{epp}
	if health != nil {
		refs[1] = health.SecretRef
	}
	if metrics != nil {
		refs[2] = metrics.SecretRef
	}
	var out [3]types.NamespacedName
	for i, r := range refs {
		if r == nil {
			continue
		}
		ns := cmp.Or(r.Namespace, namespace)
		if ns != namespace {
			return out, fmt.Errorf("secretRef %s/%s is in another namespace than the import's; only Secrets of namespace %s can be used", ns, r.Name, namespace)
		}
		if r.Name == "" {
			return out, errors.New("a secretRef has no name")
		}
		out[i] = types.NamespacedName{Namespace: ns, Name: r.Name}
	}
	return out, nil
}

// parentAddress is where a ParentMode request goes: the first parent
// gateway that is Programmed (or says nothing) with an address and a port,
// its first address and lowest listener port.
func parentAddress(parents []v1alpha1.ParentImport) string {
	best := ""
	for _, p := range parents {
		if len(p.Service) == 0 || len(p.Service[0].Addresses) == 0 || len(p.Service[0].Ports) == 0 {
			continue
		}
		addr := net.JoinHostPort(p.Service[0].Addresses[0], strconv.Itoa(int(p.Service[0].Ports[0].Number)))
		if !meta.IsStatusConditionFalse(p.Conditions, string(gatewayv1.GatewayConditionProgrammed)) {
			return addr
		}
		if best == "" {
			best = addr
		}
	}
	return best
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

// objectivePool is the pool an InferenceObjective names; false when its
// poolRef is of another kind or group than InferencePool.
func objectivePool(o *v1alpha2.InferenceObjective) (types.NamespacedName, bool) {
	ref := o.Spec.PoolRef
	ok := (ref.Kind == "" || ref.Kind == "InferencePool") && (ref.Group == "" || ref.Group == poolv1.SchemeGroupVersion.Group)
	return types.NamespacedName{Namespace: o.Namespace, Name: ref.Name}, ok
}

// modelsOf indexes the InferenceModels and InferenceObjectives of one pool.
func modelsOf(pool types.NamespacedName, c requestmodel.ModelConfig) (*requestmodel.Models, []error) {
	ms := requestmodel.NewModels()
	var errs []error
	for _, ignored := range ms.Set(c) {
		errs = append(errs, &BuildError{Kind: "InferenceModel", Namespace: pool.Namespace, Reason: ReasonConflictingModel, Message: ignored})
	}
	return ms, errs
}
