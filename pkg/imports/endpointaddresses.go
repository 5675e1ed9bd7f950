package imports

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/publishedaddrs"
)

// endpointAddresses is what the exporting member publishes of the pool's
// endpoints (publishedaddrs.Publish): the addresses of every pod of the
// pool's namespace that its selector picks and that may still serve, ready
// or not. Not only the ready ones: a pod has its address before it is
// ready, and the exporter's EPP may pick it the moment it becomes ready,
// before importers could learn of a readiness change; and the list then
// moves only when pods come and go, not on every readiness flap. A pod
// that has finished (Succeeded, Failed) is left out: its address may
// already be another pod's. An address that does not parse (the member is
// untrusted) is an error, and the entry then publishes none.
func endpointAddresses(m *Member, pool *poolv1.InferencePool) ([]string, error) {
	if m == nil || m.Pods == nil || len(pool.Spec.Selector.MatchLabels) == 0 {
		// An empty selector would pick every pod of the namespace; the
		// InferencePool API requires one.
		return nil, nil
	}
	pods, err := m.Pods.Pods(pool.Namespace).List(labels.SelectorFromSet(pool.Spec.Selector.MatchLabels))
	if err != nil {
		return nil, fmt.Errorf("listing the pods of InferencePool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	var addrs []netip.Addr
	for _, p := range pods {
		if p == nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ips := podIPs(p)
		for _, ip := range ips {
			a, err := netip.ParseAddr(ip)
			if err != nil || a.Zone() != "" {
				return nil, fmt.Errorf("pod %s/%s has the address %.64q, which is not an IP address", p.Namespace, p.Name, ip)
			}
			addrs = append(addrs, a)
		}
	}
	return publishedaddrs.Publish(addrs), nil
}

// podIPs are the pod's addresses: status.podIPs, or status.podIP alone.
func podIPs(p *corev1.Pod) []string {
	if len(p.Status.PodIPs) == 0 {
		if p.Status.PodIP == "" {
			return nil
		}
		return []string{p.Status.PodIP}
	}
	out := make([]string, len(p.Status.PodIPs))
	for i, ip := range p.Status.PodIPs {
		out[i] = ip.IP
	}
	return out
}

// withEndpointAddresses sets entry's endpoint addresses to those of the
// pool (EndpointMode only), or, when they cannot be published, to none,
// and then the entry is not ready: no destination of its EPP could pass.
func withEndpointAddresses(cluster string, e exporter, entry *inference.InferencePoolExportSummaryStatus, ready verdict) verdict {
	addrs, err := endpointAddresses(e.member, e.pool)
	if err != nil {
		entry.EndpointAddresses = nil
		return invalidAddressesVerdict(cluster, err)
	}
	entry.EndpointAddresses = addrs
	return ready
}

// checkPublishedAddresses reads the endpoint addresses of a member's
// summary (publishedaddrs.Parse): a list that does not parse is dropped
// whole, and the entry is then not ready.
func checkPublishedAddresses(cluster string, entry *inference.InferencePoolExportSummaryStatus, ready verdict) verdict {
	if entry.RoutingMode != inference.RoutingModeEndpoint {
		entry.EndpointAddresses = nil
		return ready
	}
	if _, err := publishedaddrs.Parse(entry.EndpointAddresses); err != nil {
		entry.EndpointAddresses = nil
		return invalidAddressesVerdict(cluster, err)
	}
	return ready
}

func invalidAddressesVerdict(cluster string, err error) verdict {
	return verdict{
		reason:  v1alpha1.ReasonInvalidEndpointAddresses,
		message: fmt.Sprintf("cluster %s publishes no usable endpoint addresses for the pool, so no destination its EPP names can be accepted: %v", cluster, err),
	}
}
