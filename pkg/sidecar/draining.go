package sidecar

import (
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mci-dev/mci/pkg/routetable"
)

// drainingWatch follows the clusters whose exports drain (their import
// entry's Draining condition, routetable.Cluster.Draining): how many each
// pool has, in mci_sidecar_clusters_draining{pool}, and one log line when a
// cluster starts draining and one when it stops (its export no longer
// drains, or it left the import).
type drainingWatch struct {
	logger logr.Logger
	gauge  *prometheus.GaugeVec

	mu sync.Mutex
	// draining is the set of pool/cluster pairs draining in the last
	// table followed.
	draining map[drainingCluster]bool
}

type drainingCluster struct{ pool, cluster string }

func newDrainingWatch(reg prometheus.Registerer, logger logr.Logger) *drainingWatch {
	w := &drainingWatch{
		logger: logger,
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mci_sidecar_clusters_draining",
			Help: "Clusters of each pool (namespace/name) whose export drains (the import's Draining condition): they take no new requests, only those of the sessions and prompts they hold.",
		}, []string{"pool"}),
		draining: map[drainingCluster]bool{},
	}
	reg.MustRegister(w.gauge)
	return w
}

// follow reads the draining clusters of a newly published table.
func (w *drainingWatch) follow(t *routetable.Table) {
	now := map[drainingCluster]bool{}
	perPool := map[string]int{}
	for _, c := range t.Clusters() {
		if c.Draining {
			now[drainingCluster{pool: c.Pool, cluster: c.Name}] = true
		}
	}
	for dc := range now {
		perPool[dc.pool]++
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for dc := range now {
		if !w.draining[dc] {
			w.logger.Info("Cluster draining: new requests go to the pool's other clusters; the sessions and prompts it holds stay until they end", "pool", dc.pool, "cluster", dc.cluster)
		}
	}
	for dc := range w.draining {
		if !now[dc] {
			w.logger.Info("Cluster no longer draining", "pool", dc.pool, "cluster", dc.cluster)
		}
	}
	w.draining = now
	w.gauge.Reset()
	for pool, n := range perPool {
		w.gauge.WithLabelValues(pool).Set(float64(n))
	}
}
