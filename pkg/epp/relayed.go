package epp

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mci-dev/mci/pkg/metrics"
)

// maxRelayers is how many relaying clusters relayedRequests counts apart;
// the requests of any more are counted as relayed elsewhere. The header
// comes from callers, so its values must not mint series at will.
const maxRelayers = 128

// relayedRequests counts the requests the EPP routed by the cluster whose
// mci-sidecar relayed them (extproc.RelayedHeader; "" for the requests of
// the EPP's own cluster's gateway), published as
// metrics.RelayedRequestsMetric. The own cluster's series is published
// from the start, so that a reader knows the EPP counts.
type relayedRequests struct {
	desc *prometheus.Desc
	pool *Pool

	mu     sync.Mutex
	counts map[string]uint64
	// named is how many relaying clusters are counted apart.
	named int
}

func newRelayedRequests(pool *Pool) *relayedRequests {
	return &relayedRequests{
		desc: prometheus.NewDesc(metrics.RelayedRequestsMetric,
			"Requests routed to a model server, by the cluster whose mci-sidecar relayed them: \"\" for the requests of this cluster's gateway, "+metrics.RelayedElsewhere+" for clusters beyond the 128 counted apart or with an invalid name.",
			[]string{metrics.PoolNameLabel, metrics.RelayedFromLabel}, nil),
		pool:   pool,
		counts: map[string]uint64{"": 0},
	}
}

// count counts a request routed for relayer.
func (r *relayedRequests) count(relayer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, counted := r.counts[relayer]; !counted {
		if len(validation.IsDNS1123Subdomain(relayer)) > 0 || r.named >= maxRelayers {
			relayer = metrics.RelayedElsewhere
		} else {
			r.named++
		}
	}
	r.counts[relayer]++
}

func (r *relayedRequests) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r *relayedRequests) Collect(ch chan<- prometheus.Metric) {
	name := r.pool.Name()
	r.mu.Lock()
	defer r.mu.Unlock()
	for relayer, n := range r.counts {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.CounterValue, float64(n), name, relayer)
	}
}
