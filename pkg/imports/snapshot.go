// Package imports computes the InferencePoolImports and InferencePoolExports
// one cluster of a ClusterSet serves, from read-only views of every member's
// cache. It is pure: no clients, no goroutines, no clocks other than the
// member status it is given. This is where the semantics of export and
// import live.
//
// Every answer is a function of the caches alone, so that every replica of
// the server, and every restart, serves the same objects: uids are derived
// from names, creationTimestamps and labels come from the exporting pools,
// and the conditions the computation writes have a zero lastTransitionTime,
// which the server fills with CarryTransitionTimes from what it served
// before. Objects read from the listers are shared with the informer caches
// and are never changed; nothing returned shares memory with them.
package imports

import (
	"fmt"
	"time"

	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	gatewaylisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	gatewaylistersv1beta1 "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	inferencelisters "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha1"
	poollisters "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
)

// ClusterSet is what the computation reads: the cluster it computes for and
// a read-only view of each member.
type ClusterSet struct {
	// Name of the ClusterSet; it seeds the uids of virtual objects so that
	// every replica, and every restart, serves the same uid.
	Name string
	// Local is the name of the cluster the imports are computed for. It is
	// one of Members.
	Local string
	// Members are all members, the local cluster included, sorted by name.
	Members []Member
}

// Member is a read-only view of one member cluster's cache.
type Member struct {
	Name string
	// Labels are the member's labels as this server's membership knows
	// them: its ClusterProfile's, or its member Secret's (nil for a
	// kubeconfig file, and for the local cluster unless a membership
	// source names it too). An export's selector matches them.
	Labels map[string]string
	// Draining: the Secret or ClusterProfile that names the member in
	// this server's membership asks (v1alpha1.DrainAnnotation) that every
	// export of its cluster be drained (drain.go).
	Draining bool
	// Unreachable is set when the member's watches have been down longer
	// than the configured threshold. Its listers still hold the last
	// known data, which is served but flagged.
	Unreachable *Unreachable

	// Namespaces of the member: namespace sameness decides placement. Of
	// a member that publishes summaries, they are those its
	// InferenceClusterSummary lists.
	Namespaces corev1listers.NamespaceLister
	// Summaries are the InferencePoolExportSummaries the member's own
	// mci-apiserver publishes (summary mode): set, and the member's pools,
	// Services, EndpointSlices, Gateways and BackendTLSPolicies are not
	// watched (nil). Nil: the member's objects are watched (full mode, and
	// always the local cluster), and its exports are computed from them by
	// the same rule the member's server summarizes them with.
	Summaries inferencelisters.InferencePoolExportSummaryLister

	Pools          poollisters.InferencePoolLister
	Services       corev1listers.ServiceLister
	EndpointSlices discoverylisters.EndpointSliceLister
	Gateways       gatewaylisters.GatewayLister
	// Pods are the pods of the namespaces of the member's pools (only
	// their labels, addresses and phase): an export publishes the
	// addresses of its pool's pods (endpointaddresses.go). Nil publishes
	// none.
	Pods corev1listers.PodLister

	// Routes and ReferenceGrants are read of the local cluster only (nil
	// for the others): they give an import its parents, the local Gateways
	// of the HTTPRoutes that use it as a backendRef.
	Routes RouteIndex
	// ReferenceGrants are read at v1beta1, the version every Gateway API
	// release with ReferenceGrant serves (and the sidecar reads).
	ReferenceGrants gatewaylistersv1beta1.ReferenceGrantLister
	// BackendTLSPolicies say how importers verify an exported EPP's TLS;
	// nil when the member does not serve them.
	BackendTLSPolicies gatewaylisters.BackendTLSPolicyLister
}

// Unreachable says since when, and why, a member cannot be watched.
type Unreachable struct {
	Since   time.Time
	Message string
	// CredentialsRejected: the member answers, but refuses the
	// credentials it is read with (401, or 403 to what is read). Its last
	// known data is served as an unreachable member's, under its own
	// reason: an expired token is not a partition.
	CredentialsRejected bool
}

// Reason is the condition reason that flags the member's data.
func (u *Unreachable) Reason() string {
	if u.CredentialsRejected {
		return v1alpha1.ReasonCredentialsRejected
	}
	return v1alpha1.ReasonClusterUnreachable
}

// Describe says since when the member cluster has been flagged, and why in
// a word, without its last error.
func (u *Unreachable) Describe(cluster string) string {
	if u.CredentialsRejected {
		return fmt.Sprintf("cluster %s has rejected mci-apiserver's credentials since %s", cluster, u.Since.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("cluster %s has been unreachable since %s", cluster, u.Since.UTC().Format(time.RFC3339))
}
