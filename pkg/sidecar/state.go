package sidecar

import (
	"strings"

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
}

func (s liveState) Read(clusters []*routetable.Cluster, cands []clusterscore.Candidate, pools bool) {
	for i, c := range clusters {
		cands[i].Health = HealthUnknown
		if s.health != nil {
			cands[i].Health = healthOf(s.health, c.Health)
		}
		if pools {
			cands[i].Pool = s.poolMetrics(c)
		}
	}
}

// healthOf is what prober knows of the EPP at health address addr.
func healthOf(prober *eppprobe.HealthProber, addr string) Health {
	switch serving, known := prober.Serving(addr); {
	case !known:
		return HealthUnknown
	case serving:
		return HealthServing
	default:
		return HealthNotServing
	}
}

// poolMetrics are the latest gauges of c's pool; nil when none were read.
func (s liveState) poolMetrics(c *routetable.Cluster) *PoolMetrics {
	if s.metrics == nil {
		return nil
	}
	_, pool, _ := strings.Cut(c.Pool, "/")
	return s.metrics.Get(c.Metrics, pool)
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
