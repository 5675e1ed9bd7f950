package clusterset

import (
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// The membership sources' metrics, served on mci-apiserver's /metrics.
var (
	memberConfigRejected = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "mci_clusterset_member_config_rejected_total",
		Help:           "Member configurations refused, counted once per change, by the kind of source that gave them: dir (a file of --member-kubeconfig-dir that is no usable kubeconfig), secrets (a Secret's kubeconfig that is no usable kubeconfig or is not self-contained: an exec or auth-provider plugin, a file, skipped TLS verification or a plaintext server, in any of its entries or in what client-go resolves), clusterprofiles (an unusable ClusterProfile, also counted by reason in mci_clusterset_clusterprofile_unusable_total). A member already connected keeps its working connection; each is also one log line.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"source"})
	profileUnusable = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "mci_clusterset_clusterprofile_unusable_total",
		Help:           "ClusterProfiles found unusable as members, counted once per change of the problem, by reason: InvalidName (the profile's name is not a valid cluster name; it is skipped), NoProviderFile (no readable --clusterprofile-provider-file), NoUsableAccessProvider (none of the profile's access providers is in the provider file, or the chosen one is incomplete or asks for what a profile may not: a server that is not https, a local file, skipped TLS verification, an environment variable the provider does not list).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	profileHealth = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Name:           "mci_clusterset_clusterprofile_control_plane_healthy",
		Help:           "The ControlPlaneHealthy condition of each member's ClusterProfile, as its cluster manager reports it: 1 True, 0 False, -1 Unknown or absent. A hint only: mci's own probes decide whether a member is reachable.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"member"})
)

func init() {
	legacyregistry.MustRegister(memberConfigRejected, profileUnusable, profileHealth)
}
