// Package tlstest makes TLS material for tests with client-go's certificate
// helpers: a serving certificate with the CA that verifies it, and client
// certificates for mutual TLS.
package tlstest

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// Serving is a serving certificate and the CA that signed it.
type Serving struct {
	// CertPEM is the certificate followed by its CA, as a server presents
	// them; KeyPEM its private key.
	CertPEM, KeyPEM []byte
	// CAPEM is the CA alone: what a client verifies the server with.
	CAPEM []byte
}

// NewServing returns a serving certificate for host and the alternate
// names, each an IP address or a DNS name, signed by a CA of its own.
func NewServing(t testing.TB, host string, alternates ...string) Serving {
	t.Helper()
	var ips []net.IP
	var dns []string
	for _, a := range alternates {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, a)
		}
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, ips, dns)
	require.NoError(t, err)
	chain, err := certutil.ParseCertsPEM(certPEM)
	require.NoError(t, err)
	require.Len(t, chain, 2, "GenerateSelfSignedCertKey returns the certificate and its CA")
	caPEM, err := certutil.EncodeCertificates(chain[1])
	require.NoError(t, err)
	return Serving{CertPEM: certPEM, KeyPEM: keyPEM, CAPEM: caPEM}
}

// Client is a client certificate. It is self-signed and has no extended
// key usage, so it is valid for client authentication, and a server trusts
// it with CertPEM as its client CA.
type Client struct {
	CertPEM, KeyPEM []byte
}

// NewClient returns a client certificate for name.
func NewClient(t testing.TB, name string) Client {
	t.Helper()
	keyPEM, err := keyutil.MakeEllipticPrivateKeyPEM()
	require.NoError(t, err)
	key, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	require.NoError(t, err)
	signer, ok := key.(crypto.Signer)
	require.True(t, ok, "an elliptic key signs")
	// Backdated, so that a clock step cannot make it not valid yet.
	cert, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: name, NotBefore: time.Now().Add(-time.Hour)}, signer)
	require.NoError(t, err)
	certPEM, err := certutil.EncodeCertificates(cert)
	require.NoError(t, err)
	return Client{CertPEM: certPEM, KeyPEM: keyPEM}
}

// WriteFile writes data to name in dir and returns its path.
func WriteFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

// ClientConfig is a client configuration that verifies servers with caPEM
// and presents client, if not nil.
func ClientConfig(t testing.TB, caPEM []byte, client *Client) *tls.Config {
	t.Helper()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	c := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if client != nil {
		pair, err := tls.X509KeyPair(client.CertPEM, client.KeyPEM)
		require.NoError(t, err)
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}
