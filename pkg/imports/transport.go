package imports

import (
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/eppaddr"
)

// portTransport is the transport of one port of an exported EPP: the mode
// the annotation names (else TLS when the port has a BackendTLSPolicy and
// is the ext-proc port, which is what gateways reach; else unset, for the
// importer's Secret or default), and the policy's validation.
func portTransport(mode string, policy *gatewayv1.BackendTLSPolicy, extProc bool) *inference.EndpointTransport {
	t := &inference.EndpointTransport{Mode: inference.TransportMode(mode)}
	if policy != nil {
		t.Validation = eppaddr.ValidationOf(policy)
		if t.Mode == "" && extProc {
			t.Mode = inference.TransportTLS
		}
	}
	if t.Mode == "" && t.Validation == nil {
		return nil
	}
	return t
}

// backendTLSPolicies lists the member's BackendTLSPolicies in namespace;
// none when the member does not serve them.
func (m *Member) backendTLSPolicies(namespace string) []*gatewayv1.BackendTLSPolicy {
	if m == nil || m.BackendTLSPolicies == nil {
		return nil
	}
	ps, err := m.BackendTLSPolicies.BackendTLSPolicies(namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	return ps
}
