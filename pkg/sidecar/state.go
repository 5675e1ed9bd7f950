package sidecar

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/routetable"
)

// liveState is the State of the running sidecar: what its health prober and
// pool scraper (pkg/eppprobe) last learned of each cluster's EPP. Either may
// be nil (tests): every cluster's health is then unknown, or its metrics
// unread.
type liveState struct {
	health  *eppprobe.HealthProber
	metrics *eppprobe.PoolScraper
	// refs keeps each backend's references to the prober's and the
	// scraper's findings; nil (tests): they are looked up at every pick.
	refs *byBackend[*backendRefs]
}

// newLiveState is the state of prober and scraper, each backend's
// references to their findings kept from pick to pick.
func newLiveState(prober *eppprobe.HealthProber, scraper *eppprobe.PoolScraper) liveState {
	return liveState{health: prober, metrics: scraper, refs: &byBackend[*backendRefs]{}}
}

func (s liveState) Read(clusters []*routetable.Cluster, at []int, cands []clusterscore.Candidate, pools bool) {
	refs := s.refsOf(clusters)
	for k := range cands {
		i := placeOf(at, k)
		cands[k].Health = HealthUnknown
		if s.health != nil {
			cands[k].Health = healthFrom(refs.health[i].Serving())
		}
		if pools {
			cands[k].Pool = nil
			if s.metrics != nil {
				cands[k].Pool = refs.metrics[i].Get()
			}
		}
	}
}

// placeOf is the place in a backend's clusters of the k-th candidate
// read (State.Read): at[k], or k when every cluster is read.
func placeOf(at []int, k int) int {
	if at == nil {
		return k
	}
	return at[k]
}

// healthOf is what prober knows of the EPP at health address addr.
func healthOf(prober *eppprobe.HealthProber, addr string) Health {
	return healthFrom(prober.Serving(addr))
}

// healthFrom is the Health of what a prober answers of an EPP.
func healthFrom(serving, known bool) Health {
	switch {
	case !known:
		return HealthUnknown
	case serving:
		return HealthServing
	default:
		return HealthNotServing
	}
}

// backendRefs are the prober's and the scraper's references (Refs) to
// the findings of a backend's clusters, in the clusters' order, made for
// one version of each one's targets.
type backendRefs struct {
	healthVersion, metricsVersion uint64
	health                        []eppprobe.HealthRef
	metrics                       []eppprobe.MetricsRef
}

// byBackend keeps a value for each backend picked lately, by its
// clusters: what a pick would otherwise compute again from every cluster
// (2,000 look-ups a pick at 1,000 clusters), kept while what it was
// computed from stays. The key is the address of the clusters' first
// element: a published table's slice, the same at every pick; other
// clusters are at another address.
type byBackend[T any] struct {
	values sync.Map
	// stored counts the clusters of the values stored since the map was
	// last cleared: those of the tables replaced are dropped, with the
	// tables they keep, once it passes maxKeptClusters.
	stored atomic.Int64
}

// maxKeptClusters bounds a byBackend: the clusters of 25 tables of 1,000
// clusters x 10 pools.
const maxKeptClusters = 1 << 18

// load is the value kept for clusters, which are not empty.
func (c *byBackend[T]) load(clusters []*routetable.Cluster) (T, bool) {
	v, ok := c.values.Load(&clusters[0])
	if !ok {
		var zero T
		return zero, false
	}
	return v.(T), true
}

// store keeps v for clusters, which are not empty.
func (c *byBackend[T]) store(clusters []*routetable.Cluster, v T) {
	if c.stored.Add(int64(len(clusters))) > maxKeptClusters {
		c.values.Clear()
		c.stored.Store(int64(len(clusters)))
	}
	c.values.Store(&clusters[0], v)
}

// refsOf is the references to the findings of clusters: kept ones while
// the prober's and the scraper's targets are those they were made for,
// else made anew (and kept).
func (s liveState) refsOf(clusters []*routetable.Cluster) *backendRefs {
	var healthVersion, metricsVersion uint64
	if s.health != nil {
		healthVersion = s.health.Version()
	}
	if s.metrics != nil {
		metricsVersion = s.metrics.Version()
	}
	if s.refs != nil && len(clusters) > 0 {
		if r, ok := s.refs.load(clusters); ok && len(r.health) == len(clusters) && r.healthVersion == healthVersion && r.metricsVersion == metricsVersion {
			return r
		}
	}
	r := &backendRefs{health: make([]eppprobe.HealthRef, len(clusters)), metrics: make([]eppprobe.MetricsRef, len(clusters))}
	if s.health != nil {
		r.healthVersion = s.health.Refs(func(i int) string { return clusters[i].Health }, r.health)
	}
	if s.metrics != nil {
		r.metricsVersion = s.metrics.Refs(func(i int) (string, string) {
			_, pool, _ := strings.Cut(clusters[i].Pool, "/")
			return clusters[i].Metrics, pool
		}, r.metrics)
	}
	if s.refs != nil && len(clusters) > 0 {
		s.refs.store(clusters, r)
	}
	return r
}

// Failed marks the cluster's EPP NotServing until its next good probe.
func (s liveState) Failed(c *routetable.Cluster) {
	if s.health != nil {
		s.health.MarkFailed(c.Health)
	}
}

// scrapedPools are the pools of t's clusters with their EPPs' metrics URLs,
// for mci_sidecar_epp_metrics_state.
func scrapedPools(t *routetable.Table) []eppprobe.ScrapedPool {
	var out []eppprobe.ScrapedPool
	for _, cl := range t.Clusters() {
		out = append(out, eppprobe.ScrapedPool{Cluster: cl.Name, Pool: cl.Pool, URL: cl.Metrics})
	}
	return out
}
