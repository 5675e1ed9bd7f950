package sidecar

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

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

// PoolMetrics are the pool-level gauges a cluster's EPP exposes.
type PoolMetrics struct {
	// AverageQueue is inference_pool_average_queue_size.
	AverageQueue float64
	// AverageKVCache is inference_pool_average_kv_cache_utilization (0-1).
	AverageKVCache float64
	// ReadyPods is inference_pool_ready_pods; -1 when the EPP does not
	// expose it.
	ReadyPods int
	// UpdatedAt is when they were scraped.
	UpdatedAt time.Time
}

// State is what the policies know about clusters at request time: the
// health prober's and the metrics scraper's latest findings.
type State interface {
	Health(c *Cluster) Health
	PoolMetrics(c *Cluster) *PoolMetrics
}

// PickRequest is what a policy knows about the request.
type PickRequest struct {
	// Criticality of the request, from the InferenceModel of its model.
	Criticality scheduling.Criticality
	// Now is the reference time for metrics staleness.
	Now time.Time
}

// ErrShed means a sheddable request was shed: every cluster with known
// metrics is saturated and none has unknown metrics. Answered with 429.
var ErrShed = errors.New("sheddable request shed: every cluster is saturated")

// ClusterPolicy orders the clusters of a backend for one request: the
// request goes to the first, and to the next ones in order when a
// cluster's EPP fails before answering. Clusters left out are not tried
// (except as the last resort of FailOpen). An empty order means no cluster
// can take the request.
type ClusterPolicy interface {
	Order(b *Backend, req PickRequest, st State) ([]*Cluster, error)
}

// NewPolicies returns the policies by name. cfg configures MetricsBased's
// filter chain.
func NewPolicies(cfg scheduling.Config) map[Policy]ClusterPolicy {
	hb := HealthBased{}
	return map[Policy]ClusterPolicy{
		PolicyWeighted:     Weighted{},
		PolicyHealthBased:  hb,
		PolicyMetricsBased: NewMetricsBased(cfg),
		PolicyLocalFirst:   LocalFirst{},
	}
}

// Weighted picks a cluster by weight (smooth weighted round-robin, so the
// split is exact over time), whatever its health; the failover order is
// the other clusters by decreasing weight. Weight 0 is never tried.
type Weighted struct{}

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
// queue, its pool's average KV cache utilization for the KV cache. So a
// critical request goes to the least loaded cluster, and a sheddable one
// only to a cluster with capacity (average queue <= 5 and KV cache <= 80%
// by default), and is shed (ErrShed) only when every cluster is saturated.
//
// Clusters whose EPP is known not to be serving, and those whose fresh
// metrics say the pool has no ready pod, are skipped. A cluster without
// fresh metrics is unknown: it never wins against a measured one, but it is
// not taken for saturated either, so a sheddable request is not shed while
// such a cluster remains. With no fresh metrics at all the order is
// HealthBased's.
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

func (p *MetricsBased) fresh(m *PoolMetrics, now time.Time) bool {
	return m != nil && !math.IsNaN(m.AverageKVCache) && !math.IsNaN(m.AverageQueue) &&
		(p.cfg.MetricsStaleness <= 0 || !m.UpdatedAt.Before(now.Add(-p.cfg.MetricsStaleness)))
}

func (p *MetricsBased) Order(b *Backend, req PickRequest, st State) ([]*Cluster, error) {
	var (
		clusters []*Cluster
		cands    []*scheduling.Metrics
		known    int
	)
	for _, c := range b.Clusters {
		if st.Health(c) == HealthNotServing {
			continue
		}
		m := st.PoolMetrics(c)
		if !p.fresh(m, req.Now) {
			clusters, cands = append(clusters, c), append(cands, nil)
			continue
		}
		if m.ReadyPods == 0 {
			continue
		}
		known++
		clusters = append(clusters, c)
		cands = append(cands, &scheduling.Metrics{
			WaitingQueue: int(math.Round(min(max(m.AverageQueue, 0), 1<<30))),
			KVCacheUsage: min(max(m.AverageKVCache, 0), 1),
			UpdatedAt:    m.UpdatedAt,
		})
	}
	if known == 0 {
		return HealthBased{}.Order(b, req, st)
	}

	s := p.schedulers.Get().(*scheduling.Scheduler)
	defer p.schedulers.Put(s)
	out := make([]*Cluster, 0, len(clusters))
	for len(clusters) > 0 {
		i, err := s.Schedule(scheduling.Request{Criticality: req.Criticality}, cands, req.Now)
		if errors.Is(err, scheduling.ErrDropped) {
			if len(out) > 0 {
				// The fallbacks of a sheddable request need capacity too.
				break
			}
			for j, m := range cands {
				if m == nil {
					out = append(out, clusters[j])
				}
			}
			if len(out) == 0 {
				return nil, ErrShed
			}
			break
		}
		if err != nil {
			break
		}
		out = append(out, clusters[i])
		clusters = slices.Delete(clusters, i, i+1)
		cands = slices.Delete(cands, i, i+1)
	}
	return out, nil
}
