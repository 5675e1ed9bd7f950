package imports

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// PortTransport is how mci-sidecar reaches one address of a cluster's EPP
// (ext_proc, gRPC health or metrics), resolved from the settings this
// package computes for an import's EPP (or reads from a local pool): plaintext, or TLS verified with the mci
// credentials Secret, or verified as a BackendTLSPolicy says, or — TLS
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
