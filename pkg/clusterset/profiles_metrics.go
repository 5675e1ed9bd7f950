package clusterset

import (
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// The ClusterProfile source's metrics, served on mci-apiserver's /metrics.
var (
	profileUnusable = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "mci_clusterset_clusterprofile_unusable_total",
		Help:           "ClusterProfiles found unusable as members, counted once per change of the problem, by reason: InvalidName (the profile's name is not a valid cluster name; it is skipped), NoProviderFile (no readable --clusterprofile-provider-file), NoUsableAccessProvider (none of the profile's access providers is in the provider file, or the chosen one is incomplete).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	profileHealth = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Name:           "mci_clusterset_clusterprofile_control_plane_healthy",
		Help:           "The ControlPlaneHealthy condition of each member's ClusterProfile, as its cluster manager reports it: 1 True, 0 False, -1 Unknown or absent. A hint only: mci's own probes decide whether a member is reachable.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"member"})
)

func init() {
	legacyregistry.MustRegister(profileUnusable, profileHealth)
}
