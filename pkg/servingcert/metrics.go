package servingcert

import (
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// certificateExpiry is served on mci-apiserver's /metrics: a certificate
// is renewed only when a server starts within RenewBefore of its end, so a
// server that runs on past that point must be restarted in time, and an
// alert on this gauge says when.
var certificateExpiry = metrics.NewGauge(&metrics.GaugeOpts{
	Name:           "mci_apiserver_serving_certificate_expiry_timestamp_seconds",
	Help:           "When the serving certificate this server took from --serving-cert-secret ends (Unix seconds). A server renews it only when it starts within 30 days of this time: restart mci-apiserver before then.",
	StabilityLevel: metrics.ALPHA,
})

func init() {
	legacyregistry.MustRegister(certificateExpiry)
}
