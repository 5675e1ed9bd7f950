// Package servedapis asks a cluster's API discovery which of the optional
// resources a binary can do without it serves: the Gateway API's (Gateways,
// HTTPRoutes, ReferenceGrants, BackendTLSPolicies), InferencePools, and the
// model configuration of the Inference Extension and llm-d
// (InferenceModels, InferenceObjectives, InferenceModelRewrites). mci-apiserver
// asks each member, mci-sidecar and mci-epp their own cluster, all in the
// same way, so that a resource a cluster does not serve is an empty cache
// rather than an informer that retries forever (and, where the caller waits
// for its cache, never syncs).
//
// Each group version is asked once, without the discovery client's retries
// (it retries a connection closed or reset ten times, a second apart, for
// each group version: a dead cluster took half a minute to answer), within
// one timeout in all. A group version the cluster does not know (404) is not
// served. A cluster that cannot be asked is taken to serve every resource of
// that group version, so that their informers keep retrying, and say why,
// instead of the binary going without them unnoticed; that is logged once.
package servedapis

import (
	"context"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
)

// DefaultTimeout bounds asking a cluster, all group versions together.
const DefaultTimeout = 5 * time.Second

// Set is what a cluster answered about the resources it was asked of.
type Set struct {
	served map[schema.GroupVersionResource]bool
	// assumed are served only because the cluster could not be asked.
	assumed map[schema.GroupVersionResource]bool
}

// Has reports whether the cluster serves r, or could not be asked about it.
func (s Set) Has(r schema.GroupVersionResource) bool { return s.served[r] }

// Known reports whether the cluster serves r by its own answer, not
// because it could not be asked. An aggregated API whose server is not
// available yet (503) counts as served: the aggregator knows its group.
func (s Set) Known(r schema.GroupVersionResource) bool { return s.served[r] && !s.assumed[r] }

// Answered reports whether the cluster itself said whether it serves r
// (it serves it, or answered that it does not), rather than r being taken
// as served because the cluster could not be asked.
func (s Set) Answered(r schema.GroupVersionResource) bool {
	_, asked := s.served[r]
	return asked && !s.assumed[r]
}

// Any reports whether the cluster serves at least one of rs.
func (s Set) Any(rs ...schema.GroupVersionResource) bool {
	return slices.ContainsFunc(rs, s.Has)
}

// Map returns the answer for each resource asked of, for callers that keep
// or export it.
func (s Set) Map() map[schema.GroupVersionResource]bool {
	out := make(map[schema.GroupVersionResource]bool, len(s.served))
	for r, ok := range s.served {
		out[r] = ok
	}
	return out
}

// Discover asks the cluster behind d which of resources it serves, within timeout in
// all (DefaultTimeout when 0). What the cluster does not serve, and what
// could not be asked, is logged through ctx's logger, once per call.
func Discover(ctx context.Context, d discovery.DiscoveryInterface, timeout time.Duration, resources ...schema.GroupVersionResource) Set {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	logger := klog.FromContext(ctx)
	s := Set{served: map[schema.GroupVersionResource]bool{}, assumed: map[schema.GroupVersionResource]bool{}}
	for _, gv := range groupVersions(resources) {
		names, err := resourcesOf(ctx, d, gv)
		for _, r := range resources {
			if r.GroupVersion() != gv {
				continue
			}
			switch {
			case apierrors.IsServiceUnavailable(err):
				s.served[r] = true
			case err != nil:
				s.served[r] = true
				s.assumed[r] = true
			case names[r.Resource]:
				s.served[r] = true
			default:
				s.served[r] = false
				logger.Info("The cluster does not serve this resource; going without it (one installed later is read after a restart)", "resource", r.GroupResource().String(), "version", r.Version)
			}
		}
		if err != nil {
			logger.Error(err, "Cannot ask the cluster which resources of an API group version it serves; taking it to serve them, whose informers retry", "groupVersion", gv.String())
		}
	}
	return s
}

// Unasked is the set of a cluster that could not be asked: every one of
// resources taken as served, as Discover takes what it cannot ask.
func Unasked(resources ...schema.GroupVersionResource) Set {
	s := Set{served: map[schema.GroupVersionResource]bool{}, assumed: map[schema.GroupVersionResource]bool{}}
	for _, r := range resources {
		s.served[r], s.assumed[r] = true, true
	}
	return s
}

// groupVersions lists the group versions of resources, each once, in order.
func groupVersions(resources []schema.GroupVersionResource) []schema.GroupVersion {
	var gvs []schema.GroupVersion
	for _, r := range resources {
		if gv := r.GroupVersion(); !slices.Contains(gvs, gv) {
			gvs = append(gvs, gv)
		}
	}
	return gvs
}

// resourcesOf returns the names of the resources the cluster serves in gv:
// none when it does not know gv, an error when it could not be asked. A
// discovery client without a REST client (client-go's fake) is asked
// through its ServerResourcesForGroupVersion.
func resourcesOf(ctx context.Context, d discovery.DiscoveryInterface, gv schema.GroupVersion) (map[string]bool, error) {
	list, err := askResources(ctx, d, gv)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, r := range list.APIResources {
		names[r.Name] = true
	}
	return names, nil
}

func askResources(ctx context.Context, d discovery.DiscoveryInterface, gv schema.GroupVersion) (*metav1.APIResourceList, error) {
	client := d.RESTClient()
	if client == nil {
		return d.ServerResourcesForGroupVersion(gv.String())
	}
	path := "/apis/" + gv.String()
	if gv.Group == "" {
		path = "/api/" + gv.Version
	}
	list := &metav1.APIResourceList{}
	return list, client.Get().AbsPath(path).MaxRetries(0).Do(ctx).Into(list)
}
