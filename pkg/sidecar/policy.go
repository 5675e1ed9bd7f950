package sidecar

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Health is what the health prober last learned about a cluster's EPP:
// the pipeline's own type, so that a cluster's health goes to it as is. An
// unknown one (not probed yet, or no health port) stays eligible, after
// the clusters known to be serving.
type Health = clusterscore.Health

const (
	HealthUnknown    = clusterscore.HealthUnknown
	HealthServing    = clusterscore.HealthServing
	HealthNotServing = clusterscore.HealthNotServing
)

// PoolMetrics are the pool-level gauges a cluster's EPP exposes, read under
// either naming scheme (metrics.ParsePool).
type PoolMetrics = metrics.PoolMetrics

// State is what the policies know about clusters at request time: the
// health prober's and the metrics scraper's latest findings.
type State interface {
	// Read sets the Health of cands[k], the candidate of clusters[at[k]]
	// (of clusters[k] when at is nil: every one), and its Pool when pools
	// is true. clusters are a backend's, read at once, so that what is
	// kept under a lock is locked once a pick rather than once a cluster
	// (1,000 times at 1,000 clusters), and a sample of them (at) by
	// their places in the backend's.
	Read(clusters []*routetable.Cluster, at []int, cands []clusterscore.Candidate, pools bool)
}

// PickRequest is what a policy knows about the request.
type PickRequest struct {
	// Criticality of the request, from the InferenceModel or
	// InferenceObjective it names; read only for a policy whose Needs say
	// so (Standard otherwise).
	Criticality scheduling.Criticality
	// Now is the reference time for metrics staleness.
	Now time.Time
	// Header returns a request header's first value by lower-case name, ""
	// when absent; Body is the request body as the gateway sent it (it
	// must not be modified). Both are what the sidecar already holds, for
	// policies that read sessions or prompts; nil in tests that need them
	// not.
	Header func(name string) string
	Body   []byte
	// Prompt is Body's prompt as the walk that read its model found it,
	// so that the body is not read again; nil when Body is not a JSON
	// object or was not walked, and then the prompt is read from Body.
	Prompt *promptprefix.Prompt
	// Model is the model Body names, as that walk read it ("" when none):
	// the scope of the EPPs' prefix summaries.
	Model string
	// Cluster is the local cluster's name, as the sidecar names it to
	// other clusters' EPPs (clusterscore.Request.Cluster).
	Cluster string
}

// Needs are what a policy reads besides the backend and health, so that
// the server and the sidecar gather only what some policy in use reads:
// its pipeline's (clusterscore.Needs), where Session counts only when the
// sidecar is told where a request's session key is.
type Needs = clusterscore.Needs

// ErrShed means a sheddable request was shed: every cluster it could go to
// is measured and saturated (none is unmeasured). Answered with 429.
var ErrShed = clusterscore.ErrShed

// ClusterPolicy chooses the clusters of a backend for one request: the
// backend's policy as Router.Publish compiled it (pkg/clusterscore), which
// the server and the sidecar know only through Needs, Order and FailOpen.
// It is made for each request from what is compiled already, and cannot
// fail.
type ClusterPolicy struct {
	pipeline *clusterscore.Pipeline
	session  clusterscore.SessionSpec
}

// policyOf is the policy of b, a backend of a published table, for a
// sidecar that reads sessions as session says.
func policyOf(b *routetable.Backend, session clusterscore.SessionSpec) ClusterPolicy {
	return ClusterPolicy{pipeline: b.Scoring(), session: session}
}

// Needs says what Order reads besides the backend and health.
func (p *ClusterPolicy) Needs() Needs {
	n := p.pipeline.Needs()
	n.Session = n.Session && p.session != (clusterscore.SessionSpec{})
	return n
}

// Name is the policy's name, or its inline configuration.
func (p *ClusterPolicy) Name() string { return p.pipeline.Config().Name }

// Order orders the clusters for one request: the request goes to the
// first, and to the next ones in order when a cluster's EPP fails before
// answering. An empty order means no cluster can take the request; ErrShed
// sheds it.
func (p *ClusterPolicy) Order(b *routetable.Backend, req PickRequest, st State) ([]*routetable.Cluster, error) {
	o, err := p.pick(b, req, st, nil)
	return o.order, err
}

// FailOpen is the failover set of a FailOpen backend: the clusters that
// may be tried, in this order, once Order's have failed (those of Order
// are skipped), because the health or load they were left out for may be
// stale. Weight 0 is never tried (where the configuration filters by
// weight); the local pool of LocalFirst comes last.
func (p *ClusterPolicy) FailOpen(b *routetable.Backend) []*routetable.Cluster {
	cfg := p.pipeline.Config()
	byWeight := cfg.Has(routingpolicy.FilterWeight)
	out := slices.DeleteFunc(slices.Clone(b.Clusters), func(c *routetable.Cluster) bool { return byWeight && c.Weight <= 0 })
	if cfg.Has(routingpolicy.FilterLocalFirst) && b.Local != nil && !b.Shim && b.Local.Weight != 0 {
		out = append(out, b.Local)
	}
	return out
}

// picked is an order and what the pipeline learned of the request, for
// Memory.Served and the observations.
type picked struct {
	order []*routetable.Cluster
	req   clusterscore.Request
	// promptErr says why the body's prompt could not be read (nil: read,
	// or not needed).
	promptErr error
}

// candidateSpace holds the candidates' space of picks.
var candidateSpace = sync.Pool{New: func() any { return new([]clusterscore.Candidate) }}

// orderSpace holds the order's indices of picks over more than a handful
// of clusters.
var orderSpace = sync.Pool{New: func() any { return new([]int) }}

// promptBlocks hashes the request's prompt once, under the scope of the
// model it names, as the EPPs' prefix summaries hold it (byModel), and
// moves those blocks to the backend's scope for this sidecar's own memory
// (own): each backend keeps its prefixes apart, and each model its own.
func promptBlocks(req PickRequest, scope string) (byModel, own []uint64, err error) {
	modelScope := promptprefix.ScopeOfModel(req.Model)
	if req.Prompt != nil {
		byModel, err = req.Prompt.Blocks(nil, modelScope)
	} else {
		byModel, err = promptprefix.Blocks(nil, modelScope, req.Body)
	}
	if len(byModel) == 0 {
		return nil, nil, err
	}
	return byModel, promptprefix.Rescoped(make([]uint64, 0, len(byModel)), byModel, scope), err
}

// pick orders b's clusters for req, explained in ex when set: a sample
// of them when they are many and the policy samples (clusterscore's
// Sample), else all of them.
func (p *ClusterPolicy) pick(b *routetable.Backend, req PickRequest, st State, ex *clusterscore.Explanation) (picked, error) {
	d := p.request(b, req)
	// The table made the candidates when it was published; only what a
	// request learns of them (health, load) is filled in here.
	clusters, static := b.Candidates()
	if s := b.Sampler(); s != nil && p.pipeline.Samples() {
		var atBuf [32]int
		at := p.pipeline.Sample(&d.req, s, atBuf[:0])
		err := p.pickAmong(clusters, static, at, st, &d, nil, ex)
		if len(d.order) > 0 {
			return d, err
		}
		// The filters kept none of the sample, or its best is
		// saturated or stale: only every candidate tells.
		d.req.Sampled = false
	}
	err := p.pickAmong(clusters, static, nil, st, &d, b.Rotation(), ex)
	return d, err
}

// request is what the policy reads of req for a pick over b's clusters:
// the prompt's blocks, whether it opens a conversation, its session.
func (p *ClusterPolicy) request(b *routetable.Backend, req PickRequest) picked {
	d := picked{req: clusterscore.Request{Criticality: req.Criticality, Now: req.Now, Scope: b.Scope(), Cluster: req.Cluster}}
	needs := p.Needs()
	if needs.Prompt && len(req.Body) > 0 {
		d.req.ModelBlocks, d.req.Blocks, d.promptErr = promptBlocks(req, d.req.Scope)
		if errors.Is(d.promptErr, promptprefix.ErrNoPrompt) {
			// A request without a prompt has no prefix: nothing wrong.
			d.promptErr = nil
		}
	}
	if needs.Opens && req.Prompt != nil {
		d.req.Opens = req.Prompt.Opens()
	}
	if needs.Session && req.Header != nil {
		d.req.Session = p.session.Key(req.Header)
	}
	return d
}

// pickAmong orders the candidates static of clusters at the places at
// (every one when nil) into d.order, turning rot (nil for a sample).
func (p *ClusterPolicy) pickAmong(clusters []*routetable.Cluster, static []clusterscore.Candidate, at []int, st State, d *picked, rot *clusterscore.Rotation, ex *clusterscore.Explanation) error {
	// Space reused from pick to pick (each overwrites what the last
	// left) rather than a slice of candidates allocated and collected for
	// each request; a handful of them could stay on the stack, but
	// State.Read, an interface's method, would send them to the heap.
	space := candidateSpace.Get().(*[]clusterscore.Candidate)
	defer candidateSpace.Put(space)
	if at == nil {
		*space = append((*space)[:0], static...)
	} else {
		*space = (*space)[:0]
		for _, i := range at {
			*space = append(*space, static[i])
		}
	}
	cands := *space
	st.Read(clusters, at, cands, p.pipeline.ReadsPool())
	var ibuf [8]int
	idx := ibuf[:0]
	var pooled *[]int
	if len(cands) > len(ibuf) {
		// Reused as the candidates' space is: the order is copied out.
		// Grown before the pick, which appends no more than the
		// candidates, so that only the pooled slice is stored back and
		// ibuf stays on the stack.
		pooled = orderSpace.Get().(*[]int)
		*pooled = slices.Grow((*pooled)[:0], len(cands))
		idx = *pooled
	}
	idx, err := p.pipeline.Pick(&d.req, cands, rot, idx, ex)
	d.order = make([]*routetable.Cluster, len(idx))
	for k, i := range idx {
		d.order[k] = clusters[placeOf(at, i)]
	}
	if pooled != nil {
		orderSpace.Put(pooled)
	}
	return err
}
