package sidecar

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routetable"
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
	Health(c *routetable.Cluster) Health
	PoolMetrics(c *routetable.Cluster) *PoolMetrics
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
}

// Needs are what a policy reads besides the backend and health, so that the
// server and the sidecar gather only what some policy in use reads.
type Needs struct {
	// Criticality: the request's criticality (PickRequest.Criticality),
	// which costs a parse of the body.
	Criticality bool
	// PoolMetrics: the pool gauges of the clusters' EPPs
	// (State.PoolMetrics), which costs a scrape per cluster.
	PoolMetrics bool
	// Prompt: the prompt blocks of the body (the prefix-cache scorer),
	// which costs a parse of the body.
	Prompt bool
	// Session: the request's session key (the session scorer).
	Session bool
	// Observed: the sidecar's own observations of each attempt (requests
	// in flight, time to first byte, errors).
	Observed bool
}

// ErrShed means a sheddable request was shed: every cluster it could go to
// is measured and saturated (none is unmeasured). Answered with 429.
var ErrShed = clusterscore.ErrShed

// ClusterPolicy chooses the clusters of a backend for one request: a
// compiled configuration of the cluster scoring pipeline
// (pkg/clusterscore), which the server and the sidecar know only through
// Needs, Order and FailOpen. The named policies are clusterscore's named
// configurations; any other is written inline in the annotation.
type ClusterPolicy struct {
	pipeline *clusterscore.Pipeline
	needs    Needs
	session  clusterscore.SessionSpec
}

func newClusterPolicy(p routetable.Policy, thresholds scheduling.Config, mem *clusterscore.Memory, session clusterscore.SessionSpec) (*ClusterPolicy, error) {
	cfg, err := clusterscore.Parse(string(p))
	if err != nil {
		return nil, err
	}
	pl, err := clusterscore.New(cfg, thresholds, mem)
	if err != nil {
		return nil, err
	}
	cp := &ClusterPolicy{pipeline: pl, session: session}
	cp.needs.Criticality = cfg.Has(clusterscore.FilterSaturation) || cfg.Picker == clusterscore.PickChain
	cp.needs.PoolMetrics = cfg.Has(clusterscore.FilterSaturation) || cfg.Has(clusterscore.FilterReady) || cfg.Picker == clusterscore.PickChain
	for _, sc := range cfg.Scorers {
		switch sc.Scorer {
		case clusterscore.ScorePrefixCache:
			cp.needs.Prompt = true
		case clusterscore.ScoreSession:
			cp.needs.Session = session != (clusterscore.SessionSpec{})
		case clusterscore.ScoreLatency, clusterscore.ScoreErrors, clusterscore.ScoreInFlight:
			cp.needs.Observed = true
		case clusterscore.ScoreQueue, clusterscore.ScoreKVCache:
			cp.needs.PoolMetrics = true
		}
	}
	return cp, nil
}

// Needs says what Order reads besides the backend and health.
func (p *ClusterPolicy) Needs() Needs { return p.needs }

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
	byWeight := cfg.Has(clusterscore.FilterWeight)
	out := slices.DeleteFunc(slices.Clone(b.Clusters), func(c *routetable.Cluster) bool { return byWeight && c.Weight <= 0 })
	if cfg.Has(clusterscore.FilterLocalFirst) && b.Local != nil && !b.Shim && b.Local.Weight != 0 {
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

// pick orders b's clusters for req, explained in ex when set.
func (p *ClusterPolicy) pick(b *routetable.Backend, req PickRequest, st State, ex *clusterscore.Explanation) (picked, error) {
	var buf [8]clusterscore.Candidate
	cands := buf[:0]
	candidate := func(c *routetable.Cluster, weight int64, local bool) clusterscore.Candidate {
		return clusterscore.Candidate{Name: c.Name, Weight: weight, Health: st.Health(c), Pool: st.PoolMetrics(c), Local: local, Stale: c.Stale}
	}
	for _, c := range b.Clusters {
		cands = append(cands, candidate(c, c.Weight, b.Shim && c == b.Local))
	}
	clusters := b.Clusters
	if b.Local != nil && !b.Shim {
		// Outside the rotation: weight 0, after it.
		clusters = append(slices.Clip(clusters), b.Local)
		cands = append(cands, candidate(b.Local, 0, true))
	}
	d := picked{req: clusterscore.Request{Criticality: req.Criticality, Now: req.Now, Scope: b.Scope()}}
	if p.needs.Prompt && len(req.Body) > 0 {
		d.req.Blocks, d.promptErr = promptprefix.Blocks(nil, d.req.Scope, req.Body)
		if errors.Is(d.promptErr, promptprefix.ErrNoPrompt) {
			// A request without a prompt has no prefix: nothing wrong.
			d.promptErr = nil
		}
	}
	if p.needs.Session && req.Header != nil {
		d.req.Session = p.session.Key(req.Header)
	}
	var ibuf [8]int
	idx, err := p.pipeline.Pick(&d.req, cands, b.Rotation(), ibuf[:0], ex)
	d.order = make([]*routetable.Cluster, len(idx))
	for k, i := range idx {
		d.order[k] = clusters[i]
	}
	return d, err
}

// PolicySet compiles the policies a routing table names, once each, and
// keeps them while some table names them: the one registry of policies.
// Every policy of a sidecar shares one clusterscore.Memory, whose entries
// are scoped by pool. It is safe for concurrent use.
type PolicySet struct {
	thresholds scheduling.Config
	mem        *clusterscore.Memory
	session    clusterscore.SessionSpec

	mu       sync.RWMutex
	compiled map[routetable.Policy]*ClusterPolicy
}

// NewPolicySet returns the registry. thresholds configure the saturation
// filter and the filter chain; mem is the affinity memory (nil: a new one
// of clusterscore.DefaultMemoryOptions); session says where a request's
// session key is.
func NewPolicySet(thresholds scheduling.Config, mem *clusterscore.Memory, session clusterscore.SessionSpec) *PolicySet {
	if mem == nil {
		mem = clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())
	}
	return &PolicySet{thresholds: thresholds, mem: mem, session: session, compiled: map[routetable.Policy]*ClusterPolicy{}}
}

// Memory is what the policies learn from the requests routed.
func (ps *PolicySet) Memory() *clusterscore.Memory { return ps.mem }

// Get returns the compiled policy p. A table names only policies
// ParsePolicy accepted; one that does not compile nonetheless is
// HealthBased, the default, and the error says why.
func (ps *PolicySet) Get(p routetable.Policy) (*ClusterPolicy, error) {
	ps.mu.RLock()
	cp := ps.compiled[p]
	ps.mu.RUnlock()
	if cp != nil {
		return cp, nil
	}
	cp, err := newClusterPolicy(p, ps.thresholds, ps.mem, ps.session)
	if err != nil {
		cp, _ = ps.Get(routetable.PolicyHealthBased)
		return cp, fmt.Errorf("cluster policy %q: %w; using %s", p, err, routetable.PolicyHealthBased)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if c := ps.compiled[p]; c != nil {
		return c, nil
	}
	ps.compiled[p] = cp
	return cp, nil
}

// Retain forgets the compiled policies t does not name, and the
// observations of the pools and clusters it no longer has.
func (ps *PolicySet) Retain(t *routetable.Table) {
	keep := map[routetable.Policy]bool{}
	clusters := map[[2]string]bool{}
	for b := range t.Backends {
		keep[b.Policy] = true
		for _, c := range b.Clusters {
			clusters[[2]string{b.Scope(), c.Name}] = true
		}
		if b.Local != nil {
			clusters[[2]string{b.Scope(), b.Local.Name}] = true
		}
	}
	ps.mu.Lock()
	for p := range ps.compiled {
		if !keep[p] {
			delete(ps.compiled, p)
		}
	}
	ps.mu.Unlock()
	ps.mem.Observed.Retain(func(scope, cluster string) bool { return clusters[[2]string{scope, cluster}] })
}
