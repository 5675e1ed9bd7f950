package sidecar

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Health is what the health prober last learned about a cluster's EPP.
type Health int8

const (
	// HealthUnknown: not probed yet, or the cluster has no health port.
	// Such a cluster stays eligible, after the ones known to be serving.
	HealthUnknown Health = iota
	// HealthServing: the EPP answered SERVING.
	HealthServing
	// HealthNotServing: the EPP answered anything else, did not answer, or
	// an ext_proc stream to it just failed.
	HealthNotServing
)

func (h Health) String() string {
	switch h {
	case HealthServing:
		return "Serving"
	case HealthNotServing:
		return "NotServing"
	default:
		return "Unknown"
	}
}

// PoolMetrics are the pool-level gauges a cluster's EPP exposes, read under
// either naming scheme (metrics.ParsePool).
type PoolMetrics = metrics.PoolMetrics

// State is what the policies know about clusters at request time: the
// health prober's and the metrics scraper's latest findings.
type State interface {
	Health(c *Cluster) Health
	PoolMetrics(c *Cluster) *PoolMetrics
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
}

// ErrShed means a sheddable request was shed: every cluster it could go to
// is measured and saturated (none is unmeasured). Answered with 429.
var ErrShed = errors.New("sheddable request shed: every cluster is saturated")

// ClusterPolicy chooses the clusters of a backend for one request. The
// server and the sidecar know policies only through it: a new policy is a
// type here and an entry of NewPolicies (and of Policies, its name).
type ClusterPolicy interface {
	// Needs says what Order reads besides the backend and health.
	Needs() Needs
	// Order orders the clusters for one request: the request goes to the
	// first, and to the next ones in order when a cluster's EPP fails
	// before answering. An empty order means no cluster can take the
	// request; ErrShed sheds it.
	Order(b *Backend, req PickRequest, st State) ([]*Cluster, error)
	// FailOpen is the failover set of a FailOpen backend: the clusters
	// that may be tried, in this order, once Order's have failed (those of
	// Order are skipped), because the health or load they were left out
	// for may be stale.
	FailOpen(b *Backend) []*Cluster
}

// NewPolicies returns the policies by name: the one registry of policies.
// cfg configures MetricsBased's filter chain.
func NewPolicies(cfg scheduling.Config) map[Policy]ClusterPolicy {
	return map[Policy]ClusterPolicy{
		PolicyWeighted:     Weighted{},
		PolicyHealthBased:  HealthBased{},
		PolicyMetricsBased: NewMetricsBased(cfg),
		PolicyLocalFirst:   LocalFirst{},
	}
}

// weightedFailOpen is the FailOpen set of the weighted policies: every
// cluster but those of weight 0, which are never tried.
func weightedFailOpen(b *Backend) []*Cluster {
	return slices.DeleteFunc(slices.Clone(b.Clusters), func(c *Cluster) bool { return c.Weight == 0 })
}

// Weighted picks a cluster by weight (smooth weighted round-robin, so the
// split is exact over time), whatever its health; the failover order is
// the other clusters by decreasing weight. Weight 0 is never tried.
type Weighted struct{}

func (Weighted) Needs() Needs                   { return Needs{} }
func (Weighted) FailOpen(b *Backend) []*Cluster { return weightedFailOpen(b) }

func (Weighted) Order(b *Backend, _ PickRequest, _ State) ([]*Cluster, error) {
	first := b.wrr.next(nil)
	if first < 0 {
		return nil, nil
	}
	out := make([]*Cluster, 0, len(b.Clusters))
	out = append(out, b.Clusters[first])
	return appendByWeight(out, b.Clusters, func(i int) bool { return i != first && b.Clusters[i].Weight > 0 }), nil
}

// appendByWeight appends the clusters keep selects, heaviest first, then by
// name.
func appendByWeight(out, clusters []*Cluster, keep func(int) bool) []*Cluster {
	start := len(out)
	for i, c := range clusters {
		if keep(i) {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out[start:], func(a, b *Cluster) int {
		if c := cmp.Compare(b.Weight, a.Weight); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// HealthBased is Weighted over the clusters whose EPP is serving; clusters
// of unknown health (not probed yet, or without a health port) come next,
// and clusters known not to be serving are skipped.
type HealthBased struct{}

func (HealthBased) Needs() Needs                   { return Needs{} }
func (HealthBased) FailOpen(b *Backend) []*Cluster { return weightedFailOpen(b) }

func (HealthBased) Order(b *Backend, _ PickRequest, st State) ([]*Cluster, error) {
	health := make([]Health, len(b.Clusters))
	for i, c := range b.Clusters {
		health[i] = st.Health(c)
	}
	is := func(h Health) func(int) bool { return func(i int) bool { return health[i] == h } }
	first := b.wrr.next(is(HealthServing))
	if first < 0 {
		first = b.wrr.next(is(HealthUnknown))
	}
	if first < 0 {
		return nil, nil
	}
	out := make([]*Cluster, 0, len(b.Clusters))
	out = append(out, b.Clusters[first])
	for _, h := range []Health{HealthServing, HealthUnknown} {
		out = appendByWeight(out, b.Clusters, func(i int) bool {
			return i != first && health[i] == h && b.Clusters[i].Weight > 0
		})
	}
	return out, nil
}

// LocalFirst is active-passive: an import's requests go to the local
// InferencePool of the same namespace/name while its EPP is not known to be
// failing, and to the remote clusters (HealthBased) otherwise, or after it
// when it fails. Without a local pool it is HealthBased.
type LocalFirst struct{}

func (LocalFirst) Needs() Needs { return Needs{} }

// FailOpen adds the local pool, when it is not one of the clusters (a shim
// pool's is).
func (LocalFirst) FailOpen(b *Backend) []*Cluster {
	out := weightedFailOpen(b)
	if b.Local != nil && !b.Shim && b.Local.Weight != 0 {
		out = append(out, b.Local)
	}
	return out
}

func (LocalFirst) Order(b *Backend, req PickRequest, st State) ([]*Cluster, error) {
	remote, err := HealthBased{}.Order(b, req, st)
	if b.Shim {
		// A shim pool's local EPP is one of its clusters as well.
		remote = slices.DeleteFunc(remote, func(c *Cluster) bool { return c == b.Local })
	}
	if b.Local == nil || st.Health(b.Local) == HealthNotServing {
		return remote, err
	}
	return append([]*Cluster{b.Local}, remote...), nil
}

// MetricsBased ranks the clusters with the filter chain of pkg/scheduling,
// a cluster standing for one candidate: its pool's average queue for the
// queue, its pool's average KV cache utilization for the KV cache.
//
// Clusters whose EPP is known not to be serving, and those whose fresh
// metrics say the pool has no ready pod, are skipped. The others fall in
// three groups, tried in this order:
//
//  1. Measured clusters with capacity (fresh metrics, average queue <=
//     SheddableQueueThreshold and KV cache <= SheddableKVCacheThreshold, 5
//     and 80% by default), ranked by the filter chain.
//  2. Unmeasured clusters: no fresh metrics, whatever the reason (not
//     scraped yet, stale, the EPP refuses the sidecar's token, unreachable,
//     unparseable; see PoolScraper.State). Unknown load is not zero load,
//     so they never win against a cluster known to have capacity; nor is
//     it saturation, so they come before the clusters known to be
//     saturated. Among themselves they are ordered as HealthBased orders
//     them (weighted round-robin over the serving ones, then those of
//     unknown health), so that they share the traffic that reaches them.
//  3. Measured saturated clusters, ranked by the filter chain: a critical
//     or standard request is never refused while a cluster remains. A
//     sheddable request never goes to them: it is shed (ErrShed) only when
//     every remaining cluster is measured and saturated.
//
// With no cluster measured, the order is therefore HealthBased's.
type MetricsBased struct {
	cfg        scheduling.Config
	schedulers sync.Pool
}

// NewMetricsBased returns the policy with the filter chain's thresholds.
func NewMetricsBased(cfg scheduling.Config) *MetricsBased {
	p := &MetricsBased{cfg: cfg}
	p.schedulers.New = func() any { return scheduling.New(cfg, nil) }
	return p
}

func (*MetricsBased) Needs() Needs { return Needs{Criticality: true, PoolMetrics: true} }

// FailOpen is every cluster: weights do not rank clusters here.
func (*MetricsBased) FailOpen(b *Backend) []*Cluster { return slices.Clone(b.Clusters) }

func (p *MetricsBased) fresh(m *PoolMetrics, now time.Time) bool {
	return m != nil && !math.IsNaN(m.AverageKVCache) && !math.IsNaN(m.AverageQueue) &&
		(p.cfg.MetricsStaleness <= 0 || !m.UpdatedAt.Before(now.Add(-p.cfg.MetricsStaleness)))
}

// hasCapacity is the filter chain's "has capacity" for a pool.
func (p *MetricsBased) hasCapacity(m *scheduling.Metrics) bool {
	return m.WaitingQueue <= p.cfg.SheddableQueueThreshold && m.KVCacheUsage <= p.cfg.SheddableKVCacheThreshold
}

func (p *MetricsBased) Order(b *Backend, req PickRequest, st State) ([]*Cluster, error) {
	var (
		spare, saturated         []*Cluster
		spareLoad, saturatedLoad []*scheduling.Metrics
		unmeasured               = make([]bool, len(b.Clusters))
		health                   = make([]Health, len(b.Clusters))
		anyUnmeasured            bool
	)
	for i, c := range b.Clusters {
		health[i] = st.Health(c)
		if health[i] == HealthNotServing {
			continue
		}
		m := st.PoolMetrics(c)
		if !p.fresh(m, req.Now) {
			unmeasured[i], anyUnmeasured = true, true
			continue
		}
		if m.ReadyPods == 0 {
			continue
		}
		load := &scheduling.Metrics{
			WaitingQueue: int(math.Round(min(max(m.AverageQueue, 0), 1<<30))),
			KVCacheUsage: min(max(m.AverageKVCache, 0), 1),
			UpdatedAt:    m.UpdatedAt,
		}
		if p.hasCapacity(load) {
			spare, spareLoad = append(spare, c), append(spareLoad, load)
		} else {
			saturated, saturatedLoad = append(saturated, c), append(saturatedLoad, load)
		}
	}

	out := make([]*Cluster, 0, len(b.Clusters))
	out = p.rank(out, spare, spareLoad, req)
	if anyUnmeasured {
		out = appendUnmeasured(out, b, unmeasured, health, len(out) == 0)
	}
	if req.Criticality == scheduling.Sheddable {
		if len(out) == 0 && len(saturated) > 0 {
			return nil, ErrShed
		}
		return out, nil
	}
	return p.rank(out, saturated, saturatedLoad, req), nil
}

// rank appends clusters in the order the filter chain picks them, each
// pick among those left.
func (p *MetricsBased) rank(out, clusters []*Cluster, load []*scheduling.Metrics, req PickRequest) []*Cluster {
	if len(clusters) == 0 {
		return out
	}
	// A sheddable request only ever reaches clusters with capacity here,
	// so the chain does not drop it.
	r := scheduling.Request{Criticality: req.Criticality}
	s := p.schedulers.Get().(*scheduling.Scheduler)
	defer p.schedulers.Put(s)
	clusters, load = slices.Clone(clusters), slices.Clone(load)
	for len(clusters) > 0 {
		i, err := s.Schedule(r, load, req.Now)
		if err != nil {
			// Not expected (see above); the rest keep the order they came in.
			return append(out, clusters...)
		}
		out = append(out, clusters[i])
		clusters = slices.Delete(clusters, i, i+1)
		load = slices.Delete(load, i, i+1)
	}
	return out
}

// appendUnmeasured appends the unmeasured clusters as HealthBased orders
// them: serving ones first, then those of unknown health. When they lead
// the order (first), the first of them is the weighted round-robin's pick,
// so that they share the traffic by weight; otherwise they are fallbacks,
// heaviest first, and the round-robin is left alone.
func appendUnmeasured(out []*Cluster, b *Backend, unmeasured []bool, health []Health, first bool) []*Cluster {
	is := func(h Health) func(int) bool {
		return func(i int) bool { return unmeasured[i] && health[i] == h }
	}
	lead := -1
	if first {
		if lead = b.wrr.next(is(HealthServing)); lead < 0 {
			lead = b.wrr.next(is(HealthUnknown))
		}
		if lead >= 0 {
			out = append(out, b.Clusters[lead])
		}
	}
	for _, h := range []Health{HealthServing, HealthUnknown} {
		keep := is(h)
		out = appendByWeight(out, b.Clusters, func(i int) bool { return i != lead && keep(i) && b.Clusters[i].Weight > 0 })
	}
	return out
}
