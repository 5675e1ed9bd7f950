package sidecar

import (
	"fmt"

	"github.com/mci-dev/mci/pkg/routetable"
)

// What the sidecar does with a route's hard filter on clusters
// (routetable.ClusterFilter): the clusters outside are already out of the
// backend; here the two answers the filter changes.

// outsideFilter is the sidecar's own answer when the backend's filter left
// it no cluster: a 503 saying which restrictions hold and which clusters
// they left out, counted under the restriction that left none, rather
// than a fail-open to a cluster the filter rules out. ok is false when the
// filter leaves the backend a cluster, or there is none.
func outsideFilter(be *routetable.Backend) (outcome, message string, ok bool) {
	f := be.ClusterFilter
	if f == nil || len(be.Clusters) > 0 || be.Local != nil {
		return "", "", false
	}
	outcome = OutcomeOutsideTags
	if f.Decisive() == routetable.RegionRestriction {
		outcome = OutcomeOutsideRegions
	}
	return outcome, fmt.Sprintf("%s: %s", be, f.Unavailable()), true
}

// filterRefusal is the 503's message when none of the clusters the
// backend's filter allows took the request and FailOpen would let it go on
// without a destination: the gateway would then pick a pool of its own,
// which the filter may rule out. ok is false for a backend without a
// filter.
func filterRefusal(be *routetable.Backend, tried []string) (message string, ok bool) {
	f := be.ClusterFilter
	if f == nil {
		return "", false
	}
	return fmt.Sprintf("%s: no cluster's EPP answered (tried %v), and its route allows only the clusters %s: the request goes nowhere else", be, tried, f.Allowed()), true
}
