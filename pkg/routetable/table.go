package routetable

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Annotations of an HTTPRoute that tune how the sidecar routes its
// inference backendRefs. The policy annotation may also sit on the
// InferencePool or InferencePoolImport a backendRef names (as a label too,
// since imports carry the labels of their oldest exporting pool): the
// route's wins.
const (
	// PolicyAnnotation chooses how a cluster of an InferencePoolImport is
	// picked: a named cluster policy or an inline configuration of the
	// scoring pipeline, as routingpolicy.Parse reads it.
	PolicyAnnotation = v1alpha1.ClusterPolicyAnnotation
	// ClusterWeightsAnnotation gives clusters weights for the Weighted and
	// HealthBased policies: "cluster-a=3,cluster-c=1". An unlisted cluster
	// weighs 1; weight 0 takes a cluster out of rotation.
	ClusterWeightsAnnotation = "mci.x-k8s.io/cluster-weights"
	// FailureModeAnnotation sets the failure mode (FailOpen or FailClose)
	// of the route's InferencePoolImport backendRefs, which have no
	// endpointPickerRef of their own to carry one.
	FailureModeAnnotation = "mci.x-k8s.io/failure-mode"
	// LocalEndpointPickerAnnotation, on an InferencePool whose EPP is the
	// sidecar (shim mode), names the pool's real local EPP: "service" or
	// "service:port", a Service of the pool's namespace found as an
	// endpointPickerRef's is. Without it the pool's local model servers are
	// reached only through FailOpen.
	LocalEndpointPickerAnnotation = "mci.x-k8s.io/local-endpoint-picker"
)

// What tells a shim-mode sidecar which InferencePool a request is for, when
// its Services serve several: the gateway's filter metadata
// ShimMetadataNamespace with the key ShimPoolKey, "namespace/name" (Envoy
// forwards route or cluster metadata of that namespace with the ext_proc
// filter's metadata_options).
const (
	ShimMetadataNamespace = "mci.x-k8s.io"
	ShimPoolKey           = "inference-pool"
)

// The backendRef kinds the sidecar routes to.
const (
	InferencePoolGroup       = "inference.networking.k8s.io"
	InferencePoolKind        = "InferencePool"
	InferencePoolImportGroup = "inference.networking.x-k8s.io"
	InferencePoolImportKind  = "InferencePoolImport"
)

// DefaultLocalCluster names the local cluster when no name is configured.
const DefaultLocalCluster = "local"

// BackendKind is the kind of a backendRef the sidecar routes to.
type BackendKind string

const (
	BackendInferencePool       BackendKind = InferencePoolKind
	BackendInferencePoolImport BackendKind = InferencePoolImportKind
)

// Cluster is one place a backend's requests can go: a cluster's EPP
// (EndpointMode) or a parent gateway (ParentMode).
type Cluster struct {
	// Name of the cluster.
	Name string
	// Pool is the pool's namespace/name.
	Pool string
	// Mode says whether the request goes through EPP or to Parent.
	Mode v1alpha1.RoutingMode
	// EPP is the ext_proc address ("host:port") of the cluster's EPP.
	EPP string
	// Health is the address of the EPP's gRPC health service; "" when
	// unknown, and then the cluster's health is unknown.
	Health string
	// Metrics is the URL of the EPP's Prometheus metrics; "" when unknown.
	Metrics string
	// EPPTransport, HealthTransport and MetricsTransport say how EPP,
	// Health and Metrics are reached: plaintext or TLS, verified with the
	// Secret of the local cluster that an import's secretRefs (a local
	// pool's endpoint-picker-secret annotation) name, or as a
	// BackendTLSPolicy says, or not verified.
	EPPTransport, HealthTransport, MetricsTransport eppaddr.PortTransport
	// MetricsToken is the Secret of the local cluster whose token is sent
	// with scrapes of Metrics (an import's metrics.tokenSecretRef, a local
	// pool's endpoint-picker-metrics-token-secret annotation); it changes
	// no transport.
	MetricsToken types.NamespacedName
	// Parent is the address ("host:port") of the parent gateway (ParentMode).
	Parent string
	// Published is what the exporter published of the pool that a remote
	// EPP's destination must match (EndpointMode): the port of its model
	// servers (an import's targetPortNumber) and their addresses (its
	// endpointAddresses), parsed once here rather than per request. Zero
	// for a local pool and in ParentMode.
	Published eppanswer.Published
	// Weight is the cluster's weight for the Weighted and HealthBased
	// policies and the weight scorer: the route's weight of the cluster
	// (ClusterWeightsAnnotation, 1 when it gives none) times the weight
	// its exporter states (the import's exportSettings, 1 when none).
	Weight int64
	// Region is the cluster's region: its exporter's statement (the
	// import's exportSettings), or the sidecar's own for the local
	// cluster; "" when unknown. ClusterRegionsAnnotation filters by it.
	Region string
	// Tags are what the cluster's exporter states (the import's
	// exportSettings); none for the local cluster. ClusterTagsAnnotation
	// filters by them.
	Tags map[string]string
	// Local is true for the local InferencePool.
	Local bool
	// Unverified is true for another cluster's EPP whose ext_proc is
	// reached without verified TLS, as the operator allowed for its import
	// (RemoteEndpointPickers).
	Unverified bool
	// ExternalName is true for a local pool whose EPP Service is an
	// ExternalName: its address is a name the Service's author chose, which
	// may point anywhere, so the EPP is not taken for one of the cluster's
	// own (the sidecar's own metrics token is not sent there unless an
	// operator names it).
	ExternalName bool
	// Stale is true for an exporting cluster that the local mci-apiserver
	// cannot reach (Ready False, reason ClusterUnreachable): its entry is
	// the last known one. Its EPP may well answer (a control-plane
	// partition is not a data-plane one), so it stays a candidate, after
	// every cluster that is not stale (clusterscore.Candidate.Stale).
	Stale bool
	// Draining is true for an exporting cluster whose export drains
	// (condition Draining True): no new requests, only those the cluster
	// holds (clusterscore.Candidate.Draining).
	Draining bool
}

// Backend is one backendRef of a rule, resolved.
type Backend struct {
	Kind      BackendKind
	Namespace string
	Name      string
	// Weight is the backendRef's weight (default 1).
	Weight int64
	// Invalid, when not empty, says why the backendRef cannot be used:
	// requests picked for it get 500, as Gateway API asks.
	Invalid string
	// Clusters are the clusters requests may go to: for an import, its
	// exporting clusters whose Ready condition is not False, or False for
	// ClusterUnreachable (Cluster.Stale); for a pool, the
	// local pool. Empty means no cluster is available: 503 or FailOpen.
	Clusters []*Cluster
	// Local is, for an import, the local InferencePool of the same
	// namespace/name, for the LocalFirst policy; nil without one.
	Local *Cluster
	// FailureMode says what happens when no cluster answers.
	FailureMode poolv1.EndpointPickerFailureMode
	// ClusterFilter, when not nil, is the route's hard filter on clusters
	// (its regions and tags): Clusters and Local hold only the clusters
	// it allows, and the request never goes on without a destination
	// (FailOpen stops at the clusters left).
	ClusterFilter *ClusterFilter
	// Shim is true for an InferencePool whose EPP is the sidecar itself:
	// its Clusters are the pool's real local EPP (also Local), if it has
	// one, then the clusters of the import of the same namespace/name.
	Shim bool
	// ShimPort is the port a shim pool's endpointPickerRef names: the
	// sidecar listens on it, and a connection arriving there is for this
	// pool (ShimFor). 0 when the ref names none: the sidecar's main
	// ext_proc port.
	ShimPort int32
	// Policy picks among Clusters: the configuration the annotations
	// chose, parsed and valid.
	Policy routingpolicy.Config
	// scoring is Policy compiled, which Router.Publish sets before the
	// table serves a request.
	scoring *clusterscore.Pipeline
	// filters are the HTTPRoute filters of the backendRef's rule, then of
	// the backendRef: what a request routed to it goes through. nil when
	// there are none.
	filters *Filters

	models *requestmodel.Models
	// wrr picks among Clusters by their weights.
	wrr *rotation
	// candidates are the policy's candidates as far as the table decides
	// them (candidatesOf), made once when the table is published rather
	// than on every request; nil until then.
	candidates *candidates
}

// candidates are what a backend's policy chooses among, in its order: the
// clusters (Clusters, then a LocalFirst pool outside the rotation), and
// each one's candidate with what the table alone says of it (name,
// weight, local, stale, prompt index id, rank by weight and name), the
// request's health and load left for the caller to fill in.
type candidates struct {
	clusters []*Cluster
	cands    []clusterscore.Candidate
	// sampler samples cands for a pick over many, made by the first
	// pick that needs it rather than with every table (an export change
	// at 1,000 clusters rebuilt it for nothing: a third more of the
	// update); nil for a few.
	sampler func() *clusterscore.Sampler
	// name is the backend's String.
	name string
}

// candidatesOf are b's candidates: its clusters, each of its weight (the
// local one of a shim pool marked local), then its local pool, outside
// the rotation (weight 0), unless it is a shim pool's, which is among the
// clusters already.
func candidatesOf(b *Backend) *candidates {
	c := &candidates{clusters: b.Clusters, name: b.name()}
	if b.Local != nil && !b.Shim {
		c.clusters = append(slices.Clip(b.Clusters), b.Local)
	}
	c.cands = make([]clusterscore.Candidate, len(c.clusters))
	for i, cl := range c.clusters {
		c.cands[i] = clusterscore.Candidate{Name: cl.Name, Weight: cl.Weight, Local: b.Shim && cl == b.Local, Stale: cl.Stale, Draining: cl.Draining, ID: promptprefix.ClusterID(cl.Name)}
	}
	if len(c.clusters) > len(b.Clusters) {
		c.cands[len(b.Clusters)].Weight, c.cands[len(b.Clusters)].Local = 0, true
	}
	clusterscore.RankCandidates(c.cands)
	if len(c.cands) > clusterscore.SampleAbove {
		c.sampler = sync.OnceValue(func() *clusterscore.Sampler { return clusterscore.NewSampler(c.cands) })
	}
	return c
}

// Candidates are what the backend's policy chooses among: the clusters,
// and in the same order their candidates as far as the table decides
// them (clusterscore.Candidate's Name, Weight, Local, Stale, ID and Rank;
// the caller sets the rest for each request). Both are shared and must not be
// modified: copy the candidates to fill them in. Made when the table was
// published; on a backend of a table not published, made on each call.
func (b *Backend) Candidates() ([]*Cluster, []clusterscore.Candidate) {
	c := b.candidates
	if c == nil {
		c = candidatesOf(b)
	}
	return c.clusters, c.cands
}

// Sampler samples the backend's candidates for a pick over many
// (clusterscore.SampleAbove); nil for a few.
func (b *Backend) Sampler() *clusterscore.Sampler {
	c := b.candidates
	if c == nil {
		c = candidatesOf(b)
	}
	if c.sampler == nil {
		return nil
	}
	return c.sampler()
}

// Filters are the HTTPRoute filters of the backendRef's rule, then of the
// backendRef: what a request routed to it goes through; nil when there are
// none.
func (b *Backend) Filters() *Filters { return b.filters }

// Scope is the scope of the backend's sessions and observations: a pool
// and its import share it.
func (b *Backend) Scope() string { return b.Namespace + "/" + b.Name }

// Rotation is the weighted round-robin state of the backend's clusters;
// nil when it has none.
func (b *Backend) Rotation() *clusterscore.Rotation {
	if b.wrr == nil {
		return nil
	}
	return b.wrr.Rotation
}

// Scoring is the backend's policy compiled: set on every backend of a
// table Router has published, nil on one it has not.
func (b *Backend) Scoring() *clusterscore.Pipeline { return b.scoring }

// String names the backend for logs, errors and metric labels: made once
// when the table is published, as requests name it in their observations.
func (b *Backend) String() string {
	if c := b.candidates; c != nil {
		return c.name
	}
	return b.name()
}

func (b *Backend) name() string {
	return string(b.Kind) + " " + b.Namespace + "/" + b.Name
}

// Criticality is the criticality of a request for a model that names an
// objective (header x-gateway-inference-objective; "" for none), from the
// InferenceObjectives and InferenceModels of the backend's namespace whose
// poolRef names the backend: the objective's priority (below 0 is
// sheddable), else the model's InferenceModel, else Standard (requestmodel.Models
// decides, as the EPP does). An objective the pool does not have counts as
// none.
func (b *Backend) Criticality(model, objective string) scheduling.Criticality {
	if b.models == nil {
		return scheduling.Standard
	}
	return b.models.Criticality(model, objective)
}

// Rule is one HTTPRoute rule with its backends.
type Rule struct {
	// Route is the HTTPRoute.
	Route types.NamespacedName
	// Index is the rule's index in the route.
	Index int
	// Backends are the rule's backendRefs, in order.
	Backends []*Backend
	// Invalid, when not empty, says why the rule cannot be served (a
	// filter the sidecar cannot apply): its requests get 500.
	Invalid string
	// redirect, when set, answers every request of the rule with a
	// redirect (its RequestRedirect filter).
	redirect *Filters

	// wrr picks among Backends by weight.
	wrr *rotation
}

// Redirect is the rule's RequestRedirect filter, which answers every
// request of the rule; nil when it has none.
func (r *Rule) Redirect() *Filters { return r.redirect }

// PickBackend picks a backend by weight; nil when every weight is 0 (or
// there are no backendRefs), which Gateway API answers with 500.
func (r *Rule) PickBackend() *Backend {
	if i := r.wrr.Next(); i >= 0 {
		return r.Backends[i]
	}
	return nil
}

// Table is an immutable routing table. Requests read it concurrently while a
// new one is built; Router swaps tables atomically.
type Table struct {
	// Generation counts published tables; Router sets it.
	Generation uint64
	// Errors are the problems Build reported.
	Errors []error

	index hostIndex
	rules []*Rule

	// shimMode is true when the sidecar is an EPP shim; shims are its shim
	// pools, as requests reach them without an HTTPRoute, by pool and in
	// order of namespace/name.
	shimMode bool
	shims    map[types.NamespacedName]*Backend
	shimList []*Backend
	// local names the local cluster.
	local string
	// carried is true when the builder already gave the weighted pickers
	// the state of the previous table's (Incremental does).
	carried bool
}

func (t *Table) addShim(be *Backend) {
	if t.shims == nil {
		t.shims = map[types.NamespacedName]*Backend{}
	}
	t.shims[types.NamespacedName{Namespace: be.Namespace, Name: be.Name}] = be
	t.shimList = append(t.shimList, be)
}

// ShimMode reports whether the sidecar serves as the EPP of shim pools.
func (t *Table) ShimMode() bool { return t.shimMode }

// Shims returns the backends of the shim pools, by namespace/name. Do not
// modify them.
func (t *Table) Shims() []*Backend { return t.shimList }

// Shim returns the backend of a shim pool; nil when pool is not one.
func (t *Table) Shim(pool types.NamespacedName) *Backend { return t.shims[pool] }

// ShimPorts returns the ports the shim pools' endpointPickerRefs name, in
// order, each once: where the sidecar listens besides its main ext_proc
// port.
func (t *Table) ShimPorts() []int32 {
	var out []int32
	for _, be := range t.shimList {
		if be.ShimPort != 0 && !slices.Contains(out, be.ShimPort) {
			out = append(out, be.ShimPort)
		}
	}
	slices.Sort(out)
	return out
}

// LocalCluster names the cluster the table was built in.
func (t *Table) LocalCluster() string { return t.local }

// Backends yields every backend of the table: those of the rules, then
// the shim pools'.
func (t *Table) Backends(yield func(*Backend) bool) {
	for _, r := range t.rules {
		for _, b := range r.Backends {
			if !yield(b) {
				return
			}
		}
	}
	for _, b := range t.shimList {
		if !yield(b) {
			return
		}
	}
}

// Match returns the rule a request belongs to, nil when none matches (404),
// and, when the match is a PathPrefix, the prefix it matched: what a
// ReplacePrefixMatch rewrite replaces.
func (t *Table) Match(a *RequestAttrs) (*Rule, string) {
	m := t.index.match(a)
	switch {
	case m == nil:
		return nil, ""
	case m.pathKind == pathPrefix:
		return m.rule, m.pathValue
	default:
		return m.rule, ""
	}
}

// Rules returns the table's rules, route by route in precedence order of
// the routes (oldest first). Do not modify them.
func (t *Table) Rules() []*Rule { return t.rules }

// Clusters returns every distinct cluster of the table (by EPP, health,
// metrics and parent address, and credentials and token), for the health prober, the
// metrics scraper and the credentials of their addresses.
func (t *Table) Clusters() []*Cluster {
	type key struct {
		name, pool, epp, health, metrics, parent string
		transports                               [3]string
		metricsToken                             types.NamespacedName
	}
	seen := map[key]bool{}
	var out []*Cluster
	add := func(c *Cluster) {
		k := key{c.Name, c.Pool, c.EPP, c.Health, c.Metrics, c.Parent, [3]string{c.EPPTransport.Key(), c.HealthTransport.Key(), c.MetricsTransport.Key()}, c.MetricsToken}
		if seen[k] {
			return
		}
		seen[k] = true
		out = append(out, c)
	}
	for b := range t.Backends {
		for _, c := range b.Clusters {
			add(c)
		}
		if b.Local != nil {
			add(b.Local)
		}
	}
	return out
}

// wrrs returns every weighted picker of the table, so that Router can carry
// their state over from the previous table.
func (t *Table) wrrs(yield func(**rotation)) {
	for _, r := range t.rules {
		yield(&r.wrr)
	}
	for b := range t.Backends {
		if b.wrr != nil {
			yield(&b.wrr)
		}
	}
}
