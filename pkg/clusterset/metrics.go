package clusterset

import (
	"k8s.io/component-base/metrics"
)

// Metrics exports each member's state as this replica sees it, read from
// the Cache at scrape time so that a member replaced (rotated credentials)
// or removed from the ClusterSet never leaves a stale series behind:
//
//	mci_clusterset_member_listed{member}       1 once every informer of the member has listed
//	mci_clusterset_member_unreachable{member}  1 while flagged ClusterUnreachable (last known data kept)
//	mci_clusterset_member_removed{member}      1 past --member-remove-after (its pools no longer served)
//
// A replica is not ready while a member has listed 0 and removed 0
// (Cache.Ready): these say which member holds it back.
type Metrics struct {
	metrics.BaseStableCollector
	cache *Cache
}

var (
	memberListedDesc = metrics.NewDesc("mci_clusterset_member_listed",
		"1 once every informer of the member has listed in this replica, else 0; a replica is not ready while a member that is not removed has not listed.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberUnreachableDesc = metrics.NewDesc("mci_clusterset_member_unreachable",
		"1 while the member is flagged ClusterUnreachable (it has not answered for --member-unreachable-after; its last known data is kept), else 0.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberRemovedDesc = metrics.NewDesc("mci_clusterset_member_removed",
		"1 while the member has not answered for --member-remove-after, so the pools it exported are not served, else 0.",
		[]string{"member"}, nil, metrics.ALPHA, "")
)

// NewMetrics returns the collector of the cache's member states, to be
// registered with the server's metrics registry.
func NewMetrics(c *Cache) *Metrics { return &Metrics{cache: c} }

// DescribeWithStability implements metrics.StableCollector.
func (m *Metrics) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- memberListedDesc
	ch <- memberUnreachableDesc
	ch <- memberRemovedDesc
}

// CollectWithStability implements metrics.StableCollector.
func (m *Metrics) CollectWithStability(ch chan<- metrics.Metric) {
	m.cache.mu.RLock()
	members := append([]*member(nil), m.cache.sorted...)
	m.cache.mu.RUnlock()
	for _, mb := range members {
		st := mb.status()
		ch <- metrics.NewLazyConstMetric(memberListedDesc, metrics.GaugeValue, bit(mb.hasSynced()), mb.name)
		ch <- metrics.NewLazyConstMetric(memberUnreachableDesc, metrics.GaugeValue, bit(st != nil), mb.name)
		ch <- metrics.NewLazyConstMetric(memberRemovedDesc, metrics.GaugeValue, bit(st != nil && st.removed), mb.name)
	}
}

func bit(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
