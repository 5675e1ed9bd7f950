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
	refs *stateRefs
}

// newLiveState is the state of prober and scraper, each backend's
// references to their findings kept from pick to pick.
func newLiveState(prober *eppprobe.HealthProber, scraper *eppprobe.PoolScraper) liveState {
	return liveState{health: prober, metrics: scraper, refs: &stateRefs{}}
}

func (s liveState) Read(clusters []*routetable.Cluster, cands []clusterscore.Candidate, pools bool) {
	refs := s.refsOf(clusters)
	for i := range clusters {
		cands[i].Health = HealthUnknown
		if s.health != nil {
			cands[i].Health = healthFrom(refs.health[i].Serving())
		}
		if pools {
			cands[i].Pool = nil
			if s.metrics != nil {
				cands[i].Pool = refs.metrics[i].Get()
			}
		}
	}
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

// stateRefs keeps the backendRefs of the backends picked lately. A pick
// over 1,000 clusters looked up 2,000 addresses in the prober's and the
// scraper's maps (half of BenchmarkLiveStateRead); their targets change
// only with the routing table, so the look-ups are made once a version
// of the targets and a backend, and a pick reads the references.
type stateRefs struct {
	// byBackend holds a *backendRefs by the address of the first element
	// of the backend's clusters: a published table's slice, the same at
	// every pick, and other clusters at another address.
	byBackend sync.Map
	// stored counts the clusters of the entries stored since the map was
	// last cleared: those of the tables replaced are dropped, with the
	// tables they keep, once it passes maxClusterRefs.
	stored atomic.Int64
}

// maxClusterRefs bounds stateRefs: about 8 MB of references, the clusters
// of 25 tables of 1,000 clusters x 10 pools.
const maxClusterRefs = 1 << 18

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
		if v, ok := s.refs.byBackend.Load(&clusters[0]); ok {
			r := v.(*backendRefs)
			if len(r.health) == len(clusters) && r.healthVersion == healthVersion && r.metricsVersion == metricsVersion {
				return r
			}
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
		if s.refs.stored.Add(int64(len(clusters))) > maxClusterRefs {
			s.refs.byBackend.Clear()
			s.refs.stored.Store(int64(len(clusters)))
		}
		s.refs.byBackend.Store(&clusters[0], r)
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
