package eppaddr

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
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

// EndpointPickerSecret reads a pool's endpoint-picker-secret annotation: the
// name of the Secret, in the pool's namespace, with the TLS credentials for
// its EPP; "" when the annotation is absent (plaintext). A value that is not
// a Secret name is an error that quotes it.
func EndpointPickerSecret(annotations map[string]string) (string, error) {
	return secretName(annotations, v1alpha1.EndpointPickerSecretAnnotation)
}

// EndpointPickerMetricsTokenSecret reads a pool's
// endpoint-picker-metrics-token-secret annotation: the name of the Secret,
// in the pool's namespace, whose token sidecars send to its EPP's
// /metrics; "" when the annotation is absent. A value that is not a Secret
// name is an error that quotes it.
func EndpointPickerMetricsTokenSecret(annotations map[string]string) (string, error) {
	return secretName(annotations, v1alpha1.EndpointPickerMetricsTokenSecretAnnotation)
}

func secretName(annotations map[string]string, key string) (string, error) {
	name, ok := annotations[key]
	if !ok {
		return "", nil
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("annotation %q has value %q, which is not a Secret name: %s", key, name, strings.Join(errs, "; "))
	}
	return name, nil
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

// TLSPolicyFor returns the BackendTLSPolicy of policies that applies to
// port number port of svc (TLSPolicyForPort, with the port's name); nil
// for port 0 or when none applies.
func TLSPolicyFor(policies []*gatewayv1.BackendTLSPolicy, svc *corev1.Service, port int32) *gatewayv1.BackendTLSPolicy {
	if len(policies) == 0 || port == 0 {
		return nil
	}
	return TLSPolicyForPort(policies, svc.Name, PortName(svc, port))
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

// PortTransport is how mci-sidecar reaches one address of a cluster's EPP
// (ext_proc, gRPC health or metrics), resolved from what an import says of
// its EPP (or a local pool of its own): plaintext, or TLS verified with the
// mci credentials Secret, or verified as a BackendTLSPolicy says, or — TLS
// asked for with neither — not verified, which is how gateways reach an
// upstream EPP's default self-signed certificate.
type PortTransport struct {
	// TLS is false for plaintext.
	TLS bool
	// Secret, when set, is the credentials Secret of the local cluster
	// (CA, optional client certificate) that TLS is verified with; on a
	// plaintext port, only its metrics token is used.
	Secret types.NamespacedName
	// Validation, when set and Secret is not, verifies TLS as the
	// BackendTLSPolicy it comes from says; its CA ConfigMaps are read in
	// Namespace of the local cluster.
	Validation *v1alpha1.BackendTLSValidation
	Namespace  string
}

// Kind names the transport, for logs and the mci_sidecar_epp_transport
// metric: plaintext, tls-unverified, tls-verified (a BackendTLSPolicy),
// tls-secret (the credentials Secret, which may add a client certificate).
func (p PortTransport) Kind() string {
	switch {
	case !p.TLS:
		return TransportKindPlaintext
	case p.Secret.Name != "":
		return TransportKindSecret
	case p.Validation != nil:
		return TransportKindVerified
	default:
		return TransportKindUnverified
	}
}

// The kinds of PortTransport.
const (
	TransportKindPlaintext  = "plaintext"
	TransportKindUnverified = "tls-unverified"
	TransportKindVerified   = "tls-verified"
	TransportKindSecret     = "tls-secret"
)

// Key is a comparable form of a PortTransport, for the table's
// set of distinct clusters and the credentials' conflicts.
func (p PortTransport) Key() string {
	if !p.TLS {
		if p.Secret.Name != "" {
			return "plain|" + p.Secret.String()
		}
		return ""
	}
	v := ""
	if p.Validation != nil {
		v = fmt.Sprintf("%+v", *p.Validation)
	}
	return fmt.Sprintf("tls|%s|%s|%s", p.Secret, p.Namespace, v)
}

// ResolvePortTransport decides how one port of a cluster's EPP is reached, from
// what its pool says (explicit: the transport annotation's mode, as an
// import carries it), the credentials Secret of the port (secret), the
// BackendTLSPolicy validation of the port, and the sidecar's default mode
// for that port (def). In order: an explicit mode; else TLS when the port
// has a Secret; else TLS when a BackendTLSPolicy targets the ext-proc port
// (as gateways reach it); else def; else plaintext.
//
// Plaintext asked for a port that a BackendTLSPolicy makes TLS (ext-proc)
// is an error, never a silent downgrade. Plaintext asked with a Secret
// reaches that port without it: a Secret for ext-proc with an upstream
// EPP's plaintext health port.
func ResolvePortTransport(port, explicit string, secret types.NamespacedName, validation *v1alpha1.BackendTLSValidation, namespace, def string) (PortTransport, error) {
	mode := explicit
	if mode == "" && secret.Name != "" {
		mode = string(v1alpha1.TransportTLS)
	}
	if mode == "" && validation != nil && port == PortExtProc {
		mode = string(v1alpha1.TransportTLS)
	}
	if mode == "" {
		mode = def
	}
	switch mode {
	case "", string(v1alpha1.TransportPlaintext):
		if validation != nil && port == PortExtProc {
			return PortTransport{}, fmt.Errorf("BackendTLSPolicy %s targets the EPP's ext-proc port, but its transport is Plaintext: TLS is never dropped; remove the policy or the Plaintext setting", validation.PolicyName)
		}
		// The Secret stays known to the port (its metrics token), but
		// TLS is off.
		return PortTransport{Secret: secret}, nil
	case string(v1alpha1.TransportTLS):
		t := PortTransport{TLS: true, Secret: secret, Namespace: namespace}
		if secret.Name == "" {
			t.Validation = validation
		}
		return t, nil
	}
	return PortTransport{}, fmt.Errorf("unknown transport mode %q of the %s port", mode, port)
}

// TransportOf is the explicit mode and the validation of an import's port.
func TransportOf(t *v1alpha1.EndpointTransport) (string, *v1alpha1.BackendTLSValidation) {
	if t == nil {
		return "", nil
	}
	return string(t.Mode), t.Validation
}
