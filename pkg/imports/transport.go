package imports

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// The ports of an EPP that a transport setting names.
const (
	PortExtProc = "ext-proc"
	PortHealth  = "health"
	PortMetrics = "metrics"
)

// TransportModes are the modes a transport setting gives each port of an
// EPP: "Plaintext", "TLS", or "" where it says nothing.
type TransportModes struct {
	ExtProc, Health, Metrics string
}

// ParseTransport reads a transport setting (the pool annotation
// mci.x-k8s.io/endpoint-picker-transport, or the sidecar's default): one
// mode for every port ("TLS", "Plaintext"), or a comma-separated list of
// port=mode with ports ext-proc, health and metrics, each at most once.
// Modes are matched exactly. "" says nothing.
func ParseTransport(value string) (TransportModes, error) {
	var out TransportModes
	value = strings.TrimSpace(value)
	if value == "" {
		return out, nil
	}
	mode := func(v string) (string, error) {
		switch m := strings.TrimSpace(v); m {
		case string(v1alpha1.TransportPlaintext), string(v1alpha1.TransportTLS):
			return m, nil
		default:
			return "", fmt.Errorf("transport mode %q: want %s or %s", m, v1alpha1.TransportTLS, v1alpha1.TransportPlaintext)
		}
	}
	if !strings.Contains(value, "=") {
		m, err := mode(value)
		if err != nil {
			return out, err
		}
		return TransportModes{ExtProc: m, Health: m, Metrics: m}, nil
	}
	seen := map[string]bool{}
	for item := range strings.SplitSeq(value, ",") {
		port, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		port = strings.TrimSpace(port)
		if !ok {
			return TransportModes{}, fmt.Errorf("%q: want port=mode, with ports %s, %s, %s", item, PortExtProc, PortHealth, PortMetrics)
		}
		m, err := mode(v)
		if err != nil {
			return TransportModes{}, fmt.Errorf("port %s: %w", port, err)
		}
		if seen[port] {
			return TransportModes{}, fmt.Errorf("port %s is named twice", port)
		}
		seen[port] = true
		switch port {
		case PortExtProc:
			out.ExtProc = m
		case PortHealth:
			out.Health = m
		case PortMetrics:
			out.Metrics = m
		default:
			return TransportModes{}, fmt.Errorf("unknown port %q: want %s, %s or %s", port, PortExtProc, PortHealth, PortMetrics)
		}
	}
	return out, nil
}

// EndpointPickerTransport reads a pool's transport annotation; a value
// that does not parse is an error that quotes it.
func EndpointPickerTransport(annotations map[string]string) (TransportModes, error) {
	v, ok := annotations[v1alpha1.EndpointPickerTransportAnnotation]
	if !ok {
		return TransportModes{}, nil
	}
	m, err := ParseTransport(v)
	if err != nil {
		return m, fmt.Errorf("annotation %q has value %q: %w", v1alpha1.EndpointPickerTransportAnnotation, v, err)
	}
	return m, nil
}

// TLSPolicyForPort returns the BackendTLSPolicy of policies that applies to
// the port named portName of Service svc: one whose targetRef names the
// Service and that port (sectionName), else one that names the Service
// without a section, as Gateway API gives a section-specific policy
// precedence. Among equals, the oldest (then the first by name) wins, as
// Gateway API resolves conflicts. nil when none applies.
func TLSPolicyForPort(policies []*gatewayv1.BackendTLSPolicy, svc, portName string) *gatewayv1.BackendTLSPolicy {
	var bySection, byService []*gatewayv1.BackendTLSPolicy
	for _, p := range policies {
		for _, ref := range p.Spec.TargetRefs {
			if ref.Group != "" || ref.Kind != "Service" || string(ref.Name) != svc {
				continue
			}
			switch {
			case ref.SectionName == nil:
				byService = append(byService, p)
			case portName != "" && string(*ref.SectionName) == portName:
				bySection = append(bySection, p)
			}
		}
	}
	oldest := func(ps []*gatewayv1.BackendTLSPolicy) *gatewayv1.BackendTLSPolicy {
		if len(ps) == 0 {
			return nil
		}
		return slices.MinFunc(ps, func(a, b *gatewayv1.BackendTLSPolicy) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
	}
	if p := oldest(bySection); p != nil {
		return p
	}
	return oldest(byService)
}

// ValidationOf is the validation of a BackendTLSPolicy, as an import
// carries it.
func ValidationOf(p *gatewayv1.BackendTLSPolicy) *inference.BackendTLSValidation {
	v := &inference.BackendTLSValidation{PolicyName: p.Name, Hostname: string(p.Spec.Validation.Hostname)}
	for _, r := range p.Spec.Validation.CACertificateRefs {
		v.CACertificateRefs = append(v.CACertificateRefs, inference.CACertificateRef{Group: string(r.Group), Kind: string(r.Kind), Name: string(r.Name)})
	}
	if w := p.Spec.Validation.WellKnownCACertificates; w != nil {
		v.WellKnownCACertificates = string(*w)
	}
	for _, san := range p.Spec.Validation.SubjectAltNames {
		v.SubjectAltNames = append(v.SubjectAltNames, inference.SubjectAltName{Type: string(san.Type), Hostname: string(san.Hostname), URI: string(san.URI)})
	}
	return v
}

// portTransport is the transport of one port of an exported EPP: the mode
// the annotation names (else TLS when the port has a BackendTLSPolicy and
// is the ext-proc port, which is what gateways reach; else unset, for the
// importer's Secret or default), and the policy's validation.
func portTransport(mode string, policy *gatewayv1.BackendTLSPolicy, extProc bool) *inference.EndpointTransport {
	t := &inference.EndpointTransport{Mode: inference.TransportMode(mode)}
	if policy != nil {
		t.Validation = ValidationOf(policy)
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

// servicePortName is the name of svc's port number, "" when unnamed or
// absent.
func servicePortName(svc *corev1.Service, number int32) string {
	for _, p := range svc.Spec.Ports {
		if p.Port == number {
			return p.Name
		}
	}
	return ""
}
