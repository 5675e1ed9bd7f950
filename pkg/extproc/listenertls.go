package extproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	certutil "k8s.io/client-go/util/cert"
)

// ListenerTransport is what an ext_proc port serves, when no serving
// certificate (TLSOptions) is given.
type ListenerTransport string

const (
	// ListenerAuto resolves to ListenerSelfSignedOrPlaintext for an EPP
	// shim, ListenerPlaintext otherwise, and ListenerCertificate when a
	// serving certificate is given (ResolveListenerTransport).
	ListenerAuto ListenerTransport = "auto"
	// ListenerPlaintext serves plaintext (h2c) only.
	ListenerPlaintext ListenerTransport = "plaintext"
	// ListenerSelfSigned serves TLS only, with a certificate generated at
	// start, as upstream EPPs do by default; gateways reach it without
	// verifying it.
	ListenerSelfSigned ListenerTransport = "self-signed"
	// ListenerSelfSignedOrPlaintext serves both on one port: TLS with a
	// self-signed certificate to clients that open with a TLS handshake,
	// plaintext to the others (SniffingCredentials).
	ListenerSelfSignedOrPlaintext ListenerTransport = "self-signed-or-plaintext"
	// ListenerCertificate serves TLS with the given serving certificate
	// (TLSOptions) on every port. Not a value of the flag: what auto
	// resolves to when a certificate is given.
	ListenerCertificate ListenerTransport = "certificate"
)

// ListenerTransports are the values of the flag.
var ListenerTransports = []ListenerTransport{ListenerAuto, ListenerSelfSignedOrPlaintext, ListenerSelfSigned, ListenerPlaintext}

// ParseListenerTransport checks a value of the flag.
func ParseListenerTransport(s string) (ListenerTransport, error) {
	for _, t := range ListenerTransports {
		if string(t) == s {
			return t, nil
		}
	}
	names := make([]string, len(ListenerTransports))
	for i, t := range ListenerTransports {
		names[i] = string(t)
	}
	return "", fmt.Errorf("%q: want one of %s", s, strings.Join(names, ", "))
}

// ResolveListenerTransport is what t means for a process that serves the
// certificate of tlsOpts (when enabled) and is an EPP shim (shim) or not.
// A TLS mode of its own along with a given certificate is an error: the
// certificate already says what the port serves.
func ResolveListenerTransport(t ListenerTransport, tlsOpts TLSOptions, shim bool) (ListenerTransport, error) {
	switch {
	case tlsOpts.Enabled() && t != ListenerAuto:
		return "", fmt.Errorf("%s conflicts with --tls-cert-file, which serves that certificate on every port: leave it %s", t, ListenerAuto)
	case tlsOpts.Enabled():
		return ListenerCertificate, nil
	case t != ListenerAuto:
		return t, nil
	case shim:
		return ListenerSelfSignedOrPlaintext, nil
	}
	return ListenerPlaintext, nil
}

// SelfSignedConfig returns a server TLS configuration with a certificate
// generated now (client-go's cert helpers: a self-signed CA and a serving
// certificate it signs, valid for host, the IP bindAddress unless it is
// unspecified or not an IP, and dnsNames), as upstream EPPs generate one at
// start when none is given.
func SelfSignedConfig(host, bindAddress string, dnsNames []string) (*tls.Config, error) {
	var ips []net.IP
	if ip := net.ParseIP(bindAddress); ip != nil && !ip.IsUnspecified() {
		ips = append(ips, ip)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, ips, dnsNames)
	if err != nil {
		return nil, fmt.Errorf("generating a self-signed serving certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the self-signed serving certificate: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// What a connection spoke, as ConnectionObserver is told.
const (
	ConnTLS       = "tls"
	ConnPlaintext = "plaintext"
)

// ConnectionObserver learns, per connection, what it spoke (ConnTLS or
// ConnPlaintext) and the error that ended its handshake (nil when it was
// served).
type ConnectionObserver func(spoke string, err error)

// tlsRecordHandshake is the first byte of every TLS connection: the
// record type of its ClientHello. A gRPC client in plaintext opens with
// the HTTP/2 preface ("PRI * HTTP/2.0"), never with it.
const tlsRecordHandshake = 0x16

// SniffingCredentials are gRPC server credentials that serve TLS with
// config to the connections that open with a TLS handshake and, with
// plaintext, the others in plaintext; without plaintext, such a connection
// fails its handshake. observe, when set, learns what each connection
// spoke. gRPC bounds the handshake with its connection timeout.
func SniffingCredentials(config *tls.Config, plaintext bool, observe ConnectionObserver) credentials.TransportCredentials {
	return &sniffing{tls: credentials.NewTLS(config), plain: insecure.NewCredentials(), plaintext: plaintext, observe: observe}
}

type sniffing struct {
	tls, plain credentials.TransportCredentials
	plaintext  bool
	observe    ConnectionObserver
}

// ErrPlaintextRefused is the handshake error of a plaintext connection to
// a port that serves TLS only.
var ErrPlaintextRefused = errors.New("the client spoke plaintext to a port that serves TLS only")

func (s *sniffing) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	var first [1]byte
	if _, err := io.ReadFull(conn, first[:]); err != nil {
		// The client left before it said anything: nothing to tell.
		return nil, nil, fmt.Errorf("reading the first byte of the connection: %w", err)
	}
	pc := &peekedConn{Conn: conn, first: first[:]}
	spoke, creds := ConnPlaintext, s.plain
	if first[0] == tlsRecordHandshake {
		spoke, creds = ConnTLS, s.tls
	}
	var (
		out  net.Conn
		info credentials.AuthInfo
		err  error
	)
	if creds == s.plain && !s.plaintext {
		err = ErrPlaintextRefused
	} else {
		out, info, err = creds.ServerHandshake(pc)
	}
	if s.observe != nil {
		s.observe(spoke, err)
	}
	return out, info, err
}

func (s *sniffing) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("sniffing credentials are server credentials")
}

// Info is TLS's: what the port offers at best.
func (s *sniffing) Info() credentials.ProtocolInfo { return s.tls.Info() }

func (s *sniffing) Clone() credentials.TransportCredentials {
	c := *s
	c.tls = s.tls.Clone()
	return &c
}

// OverrideServerName does nothing: a server has no server name to check.
func (s *sniffing) OverrideServerName(string) error { return nil }

// peekedConn is a connection whose first bytes were already read.
type peekedConn struct {
	net.Conn
	first []byte
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
