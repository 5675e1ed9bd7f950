package routetable

import (
	"cmp"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routingpolicy"
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
	// LocalRegion is this cluster's region, for ClusterRegionsAnnotation;
	// "" when unknown, and then local pools are outside every
	// restriction.
	LocalRegion string
	// DefaultPolicy applies where no annotation chooses one; HealthBased
	// when it has no Name.
	DefaultPolicy routingpolicy.Config
	// DefaultTransport is the mode of each EPP port that neither its pool
	// (annotation, Secret, BackendTLSPolicy) nor its import decides;
	// plaintext where it is empty too.
	DefaultTransport eppaddr.TransportModes
	// RemoteEndpointPickers says whether other clusters' EPPs must be
	// reached over verified TLS, and which imports may do without.
	RemoteEndpointPickers RemoteEndpointPickers
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
	ReasonNoClustersInRegions    = "NoClustersInRegions"
	ReasonNoClustersWithTags     = "NoClustersWithTags"
	ReasonClusterUnreachable     = "ClusterUnreachable"
	ReasonInvalidImportedCluster = "InvalidImportedCluster"
	ReasonInvalidEndpointPicker  = "InvalidEndpointPicker"
	ReasonUnsupportedFilter      = "UnsupportedFilter"
	ReasonConflictingModel       = "ConflictingInferenceModel"
	ReasonLocalClusterInImport   = "LocalClusterInImport"
	ReasonNoBackendRefs          = "NoBackendRefs"
	ReasonAllWeightsZero         = "AllWeightsZero"
	ReasonNoShimClusters         = "NoClusters"
	ReasonAmbiguousShimPool      = "AmbiguousEndpointPickerService"
	ReasonShimPortMismatch       = "EndpointPickerPortMismatch"
	// ReasonUnverifiedEndpointPicker: a remote EPP whose ext_proc would be
	// reached without verified TLS, which no operator allowed.
	ReasonUnverifiedEndpointPicker = "UnverifiedEndpointPicker"
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
	// Cluster, when set, is the import's cluster the problem is of.
	Cluster string
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("%s %s/%s: %s: %s", e.Kind, e.Namespace, e.Name, e.Reason, e.Message)
}

// newBuilder returns a builder with in's settings and empty indexes.
func newBuilder(in Inputs) *builder {
	return &builder{
		in:        in,
		local:     cmp.Or(in.LocalCluster, DefaultLocalCluster),
		policy:    defaultPolicy(in.DefaultPolicy),
		pools:     map[types.NamespacedName]*poolv1.InferencePool{},
		imports:   map[types.NamespacedName]*v1alpha1.InferencePoolImport{},
		svcs:      map[types.NamespacedName]*corev1.Service{},
		btls:      map[types.NamespacedName]*gatewayv1.BackendTLSPolicy{},
		locals:    map[types.NamespacedName]localResult{},
		remotes:   map[types.NamespacedName]remoteResult{},
		entryMemo: map[types.NamespacedName]*entryMemo{},
		models:    map[types.NamespacedName]*requestmodel.Models{},

		gateways: map[types.NamespacedName]*gatewayv1.Gateway{},
		nsLabels: map[string]map[string]string{},
		grants:   map[string]map[string]*gatewayv1beta1.ReferenceGrant{},
	}
}

// defaultPolicy is p, or HealthBased when p is none.
func defaultPolicy(p routingpolicy.Config) routingpolicy.Config {
	if p.Name == "" {
		return routingpolicy.Named()[routingpolicy.HealthBased]
	}
	return p
}

type builder struct {
	in     Inputs
	local  string
	policy routingpolicy.Config

	pools   map[types.NamespacedName]*poolv1.InferencePool
	imports map[types.NamespacedName]*v1alpha1.InferencePoolImport
	svcs    map[types.NamespacedName]*corev1.Service
	btls    map[types.NamespacedName]*gatewayv1.BackendTLSPolicy

	// Resolved once, however many backendRefs name them, so that each
	// problem is reported once.
	locals  map[types.NamespacedName]localResult
	remotes map[types.NamespacedName]remoteResult
	models  map[types.NamespacedName]*requestmodel.Models
	// entryMemo is, by import, the resolution of each of its cluster
	// entries, kept by the Incremental builder (see resolveRemote) across
	// the import's changes.
	entryMemo map[types.NamespacedName]*entryMemo

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
	a, named := b.attach(r)
	if named && !a.Accepted {
		b.report("HTTPRoute", r.Namespace, r.Name, a.Reason, "not attached to the sidecar's Gateway, so not served: %s", strings.Join(a.Why, "; "))
	}
	return a.Hostnames, a.Accepted
}

func (b *builder) setGrant(g *gatewayv1beta1.ReferenceGrant) {
	if b.grants[g.Namespace] == nil {
		b.grants[g.Namespace] = map[string]*gatewayv1beta1.ReferenceGrant{}
	}
	b.grants[g.Namespace][g.Name] = g
}

// routeAnnotations are the settings a route's annotations give.
type routeAnnotations struct {
	policy      routingpolicy.Config
	weights     map[string]int64
	failureMode poolv1.EndpointPickerFailureMode
	filter      *ClusterFilter
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
	ra.filter = routeClusterFilter(r.Annotations, report)
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

// listItems yields the items of an annotation's comma-separated list,
// spaces trimmed, empty ones skipped.
func listItems(s string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for item := range strings.SplitSeq(s, ",") {
			if item = strings.TrimSpace(item); item != "" && !yield(item) {
				return
			}
		}
	}
}

// parseClusterWeights parses "a=3,b=1" (spaces allowed); a cluster named
// twice is an error, not the last weight silently.
func parseClusterWeights(s string) (map[string]int64, error) {
	w := map[string]int64{}
	for item := range listItems(s) {
		name, num, ok := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q is not cluster=weight", item)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 32)
		if err != nil || n < 0 || n > 1000000 {
			return nil, fmt.Errorf("weight of cluster %q: %q is not an integer from 0 to 1000000", name, num)
		}
		if _, dup := w[name]; dup {
			return nil, fmt.Errorf("cluster %q is given twice", name)
		}
		w[name] = n
	}
	return w, nil
}

// route compiles an attached route into t, for hostnames (nil: the
// route's own, or any when it has none).
func (b *builder) route(t *Table, r *gatewayv1.HTTPRoute, hostnames []string) {
	ra := b.annotations(r)
	if hostnames == nil {
		for _, h := range r.Spec.Hostnames {
			hostnames = append(hostnames, string(h))
		}
		if len(hostnames) == 0 {
			hostnames = append(hostnames, "")
		}
	}
	for ri := range r.Spec.Rules {
		rl := b.rule(r, ri, ra)
		t.rules = append(t.rules, rl)
		b.indexMatches(t, r, rl, hostnames)
	}
}

// rule compiles rule ri of r: its filters and backendRefs.
func (b *builder) rule(r *gatewayv1.HTTPRoute, ri int, ra routeAnnotations) *Rule {
	rule := r.Spec.Rules[ri]
	key := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
	report := func(reason, format string, args ...any) {
		b.report("HTTPRoute", r.Namespace, r.Name, reason, format, args...)
	}
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
	rl.wrr = newRotation(key.String()+"#"+strconv.Itoa(ri), names, weights)
	return rl
}

// indexMatches adds the matches of rl's rule to t's index, for hostnames.
func (b *builder) indexMatches(t *Table, r *gatewayv1.HTTPRoute, rl *Rule, hostnames []string) {
	ri := rl.Index
	matches := r.Spec.Rules[ri].Matches
	if len(matches) == 0 {
		// The API's default: a PathPrefix match on "/".
		matches = []gatewayv1.HTTPRouteMatch{{}}
	}
	for mi, m := range matches {
		mt, err := compileMatch(m)
		if err != nil {
			b.report("HTTPRoute", r.Namespace, r.Name, ReasonUnsupportedValue, "rule %d match %d: %v; the match is ignored", ri, mi, err)
			continue
		}
		mt.rule = rl
		mt.routeCreated = r.CreationTimestamp.Time
		mt.routeKey = rl.Route.String()
		mt.ruleIndex, mt.matchIndex = ri, mi
		for _, h := range hostnames {
			t.index.add(h, mt)
		}
	}
}
