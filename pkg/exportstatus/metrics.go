package exportstatus

import (
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// The metrics are served on mci-apiserver's /metrics.
var (
	writes = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "mci_exported_status_writes_total",
		Help:           "Writes of the Exported parent status entry on local InferencePools, by result: written, conflict (retried from the live object), gone (the pool was deleted), failed (retried with backoff).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	leading = metrics.NewGauge(&metrics.GaugeOpts{
		Name:           "mci_exported_status_leader",
		Help:           "1 while this replica holds the Exported status lease and writes, else 0.",
		StabilityLevel: metrics.ALPHA,
	})
)

func init() {
	legacyregistry.MustRegister(writes, leading)
}
