package servingcert

import (
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	// certificateExpiry is served on mci-apiserver's /metrics: the
	// server renews the certificate while it runs, once two thirds of its
	// validity have passed; a gauge that comes near now says that renewal
	// keeps failing.
	certificateExpiry = metrics.NewGauge(&metrics.GaugeOpts{
		Name:           "mci_apiserver_serving_certificate_expiry_timestamp_seconds",
		Help:           "When the serving certificate this server serves from --serving-cert-secret ends (Unix seconds). The server renews it while running once two thirds of its validity have passed, and serves the new one to new connections.",
		StabilityLevel: metrics.ALPHA,
	})
	refreshFailures = metrics.NewCounter(&metrics.CounterOpts{
		Name:           "mci_apiserver_serving_certificate_refresh_failures_total",
		Help:           "Checks of --serving-cert-secret (read, renew, trust by the APIService) that failed; the server serves its current certificate meanwhile.",
		StabilityLevel: metrics.ALPHA,
	})
)

func init() {
	legacyregistry.MustRegister(certificateExpiry, refreshFailures)
}
