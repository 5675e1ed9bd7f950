package epptransport

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The transports a port can answer with instead of the one asked, as
// mismatch names them.
const (
	answeredTLS       = "TLS"
	answeredPlaintext = "plaintext HTTP/2"
)

// probeTimeout bounds the look at a port whose transport seems wrong.
const probeTimeout = 500 * time.Millisecond

// mismatchSigns are the words of gRPC's errors when a connection's two ends
// do not speak the same transport: a plaintext client reading a TLS
// server's refusal ("error reading server preface: EOF", or a TLS alert
// taken for an HTTP/2 frame), a TLS client reading HTTP/2 ("first record
// does not look like a TLS handshake") or a plaintext server's close
// ("authentication handshake failed: EOF").
var mismatchSigns = []string{"server preface", "frame too large", "first record does not look like a TLS handshake", "authentication handshake failed: EOF"}

// mismatch says what the port addr ("host:port"), reached with TLS or not
// as tlsAsked says, answered instead when err, its failure, looks like a
// transport mismatch: answeredTLS, answeredPlaintext, or "" when it is
// not one or cannot tell. A TLS handshake that read HTTP/2 says so; the
// other signs are checked with one connection to the port, speaking the
// other transport. Why: the gRPC error alone ("error reading server
// preface: EOF") does not tell a user that the EPP serves TLS.
func mismatch(ctx context.Context, addr string, tlsAsked bool, err error) string {
	if status.Code(err) != codes.Unavailable || strings.Contains(addr, "://") {
		return ""
	}
	msg := err.Error()
	sign := false
	for _, s := range mismatchSigns {
		sign = sign || strings.Contains(msg, s)
	}
	switch {
	case !sign:
		return ""
	case tlsAsked && strings.Contains(msg, "first record does not look like a TLS handshake"):
		return answeredPlaintext
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if tlsAsked {
		if speaksHTTP2(ctx, addr) {
			return answeredPlaintext
		}
		return ""
	}
	if speaksTLS(ctx, addr) {
		return answeredTLS
	}
	return ""
}

// speaksTLS says whether addr completes a TLS handshake (its certificate
// not verified: only the transport is in question).
func speaksTLS(ctx context.Context, addr string) bool {
	d := tls.Dialer{Config: &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, NextProtos: []string{"h2"}}} //nolint:gosec // a probe of the transport, nothing is sent
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// http2Preface is an HTTP/2 client's connection preface and an empty
// SETTINGS frame.
var http2Preface = append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)

// speaksHTTP2 says whether addr answers a plaintext HTTP/2 connection
// preface with a SETTINGS frame, as a gRPC server does.
func speaksHTTP2(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := conn.Write(http2Preface); err != nil {
		return false
	}
	var header [9]byte
	if _, err := io.ReadFull(conn, header[:]); err != nil {
		return false
	}
	// A frame header: 24-bit length, type 4 (SETTINGS), no stream. A TLS
	// record would start with its content type (21, 22) and version.
	return header[3] == 4 && bytes.Equal(header[5:9], []byte{0, 0, 0, 0})
}
