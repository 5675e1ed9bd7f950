package epptransport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/credentials"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// BackendTLSPolicyCAKey is the key of a BackendTLSPolicy's CA ConfigMap
// that holds the PEM certificates, as Gateway API names it.
const BackendTLSPolicyCAKey = "ca.crt"

// loadedValidation is what one version of a BackendTLSPolicy validation
// (and of its CA ConfigMaps) gave.
type loadedValidation struct {
	version string
	tls     *EndpointTLS
	err     error
}

// resolveValidation returns the TLS configuration that verifies a serving
// certificate as a BackendTLSPolicy's validation says: its CA ConfigMaps
// (key ca.crt) of namespace, read like the credentials Secrets (labelled
// CredentialsLabel=true, in the sidecar's namespaces), and/or the system's
// CAs; the hostname as SNI and, without subjectAltNames, as the name
// verified; else one of the subjectAltNames. Its problems are logged once
// per change; a validation that cannot be used is an error (the cluster
// fails), never a connection without verification.
// key identifies the validation and its namespace (eppaddr.PortTransport.Key).
func (c *Credentials) resolveValidation(namespace string, v *v1alpha1.BackendTLSValidation, key string) (*EndpointTLS, error) {
	policy := namespace + "/" + v.PolicyName
	if !c.isSynced() {
		return nil, fmt.Errorf("the sidecar has not listed the CA ConfigMaps yet (BackendTLSPolicy %s)", policy)
	}
	var (
		version strings.Builder
		pems    [][]byte
		problem error
	)
	lister := c.configMaps[namespace]
	for _, ref := range v.CACertificateRefs {
		if ref.Group != "" || ref.Kind != "ConfigMap" {
			problem = fmt.Errorf("BackendTLSPolicy %s: caCertificateRef %s %q of group %q: only core ConfigMaps are supported", policy, ref.Kind, ref.Name, ref.Group)
			break
		}
		if lister == nil {
			problem = fmt.Errorf("BackendTLSPolicy %s: ConfigMap %s/%s: namespace %s is not one of the sidecar's --endpoint-picker-secret-namespaces, so the sidecar reads no ConfigMap there", policy, namespace, ref.Name, namespace)
			break
		}
		cm, err := lister.Get(ref.Name)
		if err != nil {
			problem = fmt.Errorf("BackendTLSPolicy %s: ConfigMap %s/%s labelled %s=true does not exist in this cluster", policy, namespace, ref.Name, CredentialsLabel)
			break
		}
		fmt.Fprintf(&version, "%s/%s;", cm.UID, cm.ResourceVersion)
		pem := cm.Data[BackendTLSPolicyCAKey]
		if pem == "" {
			problem = fmt.Errorf("BackendTLSPolicy %s: ConfigMap %s/%s has no %s", policy, namespace, ref.Name, BackendTLSPolicyCAKey)
			break
		}
		pems = append(pems, []byte(pem))
	}
	ver := version.String()
	if problem != nil {
		ver = "error:" + problem.Error()
	}
	c.mu.RLock()
	l := c.validated[key]
	c.mu.RUnlock()
	if l != nil && l.version == ver {
		return l.tls, l.err
	}

	l = &loadedValidation{version: ver, err: problem}
	if problem == nil {
		var config *tls.Config
		if config, l.err = validationTLSConfig(policy, v, pems); l.err == nil {
			l.tls = &EndpointTLS{Version: "btls/" + key + "/" + ver, Config: config, GRPC: credentials.NewTLS(config)}
		}
	}
	c.mu.Lock()
	prev := c.validated[key]
	c.validated[key] = l
	c.mu.Unlock()
	switch {
	case l.err != nil:
		if prev == nil || prev.err == nil || prev.err.Error() != l.err.Error() {
			c.logger.Error(l.err, "BackendTLSPolicy validation is unusable: the EPPs it verifies are not reached, and their clusters fail over or follow the failure mode")
		}
	case prev == nil || prev.version != l.version:
		c.logger.Info("BackendTLSPolicy validation loaded", "policy", policy, "hostname", v.Hostname, "caCertificateRefs", len(v.CACertificateRefs), "wellKnownCACertificates", v.WellKnownCACertificates)
	}
	return l.tls, l.err
}

// validationTLSConfig is the client configuration of a BackendTLSPolicy
// validation whose CA certificates are pems.
func validationTLSConfig(policy string, v *v1alpha1.BackendTLSValidation, pems [][]byte) (*tls.Config, error) {
	var roots *x509.CertPool
	switch v.WellKnownCACertificates {
	case "":
		roots = x509.NewCertPool()
	case string(gatewayv1.WellKnownCACertificatesSystem):
		system, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("BackendTLSPolicy %s: the system's CA certificates: %w", policy, err)
		}
		roots = system
	default:
		return nil, fmt.Errorf("BackendTLSPolicy %s: wellKnownCACertificates %q is not supported (want %s)", policy, v.WellKnownCACertificates, gatewayv1.WellKnownCACertificatesSystem)
	}
	if len(pems) == 0 && v.WellKnownCACertificates == "" {
		return nil, fmt.Errorf("BackendTLSPolicy %s names no CA certificates", policy)
	}
	for _, pem := range pems {
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("BackendTLSPolicy %s: a %s holds no PEM certificate", policy, BackendTLSPolicyCAKey)
		}
	}
	if v.Hostname == "" {
		return nil, fmt.Errorf("BackendTLSPolicy %s has no hostname", policy)
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: v.Hostname}
	if len(v.SubjectAltNames) == 0 {
		return config, nil
	}
	// The chain is verified against roots as usual, but the name against
	// the subjectAltNames instead of the hostname, as Gateway API says.
	sans := v.SubjectAltNames
	config.InsecureSkipVerify = true //nolint:gosec // verified in VerifyConnection
	config.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the EPP sent no certificate")
		}
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
			return err
		}
		for _, san := range sans {
			switch san.Type {
			case string(gatewayv1.HostnameSubjectAltNameType):
				if leaf.VerifyHostname(san.Hostname) == nil {
					return nil
				}
			case string(gatewayv1.URISubjectAltNameType):
				for _, u := range leaf.URIs {
					if u.String() == san.URI {
						return nil
					}
				}
			}
		}
		return fmt.Errorf("the EPP's certificate carries none of the subjectAltNames of BackendTLSPolicy %s", policy)
	}
	return config, nil
}
