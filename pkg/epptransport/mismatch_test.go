package epptransport

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/test/tlstest"
)

// serveHealth serves gRPC health on a loopback port, with TLS when
// serverTLS is set, and returns its address.
func serveHealth(t *testing.T, serverTLS bool) string {
	t.Helper()
	var opts []grpc.ServerOption
	if serverTLS {
		s := tlstest.NewServing(t, "127.0.0.1", "127.0.0.1")
		cert, err := tls.X509KeyPair(s.CertPEM, s.KeyPEM)
		require.NoError(t, err)
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// dialError is the error of a health check on addr, reached with TLS (its
// certificate not verified) when clientTLS is set: gRPC's own words.
func dialError(t *testing.T, addr string, clientTLS bool) error {
	t.Helper()
	creds := insecure.NewCredentials()
	if clientTLS {
		creds = unverifiedTLS.GRPC
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Error(t, err)
	return err
}

func TestFailedSaysWhichTransportTheEPPAnswered(t *testing.T) {
	tests := []struct {
		name                 string
		serverTLS, clientTLS bool
		want                 string
	}{
		{name: "a plaintext dial to a TLS port: the EPP answered TLS", serverTLS: true, want: "the EPP answered TLS on a port reached with plaintext"},
		{name: "a TLS dial to a plaintext port: the EPP answered plaintext", clientTLS: true, want: "the EPP answered plaintext HTTP/2 on a port reached with tls-unverified"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := serveHealth(t, tt.serverTLS)
			err := dialError(t, addr, tt.clientTLS)
			var logged []string
			logger := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
			c := NewCredentials(nil, nil, logger)
			c.SetTargets([]Target{{Addr: addr, Cluster: "cluster-a", Pool: "ns/pool", Port: eppaddr.PortHealth, Transport: eppaddr.PortTransport{TLS: tt.clientTLS}}})
			logged = nil

			c.Failed(addr, err)
			require.Len(t, logged, 1)
			assert.Contains(t, logged[0], tt.want, "gRPC said: %v", err)
			assert.Contains(t, logged[0], `"pool"="ns/pool"`)
		})
	}
}

func TestMismatchOnlyWhenTheErrorSaysSo(t *testing.T) {
	plain, tlsAddr := serveHealth(t, false), serveHealth(t, true)
	refused := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		return addr
	}()
	tests := []struct {
		name     string
		addr     string
		tlsAsked bool
		clientOf string // the address whose real error is used
		want     string
	}{
		{name: "a matching transport that failed otherwise (refused): nothing to say", addr: refused, clientOf: refused, want: ""},
		{name: "TLS asked of a TLS port: no mismatch", addr: tlsAddr, tlsAsked: true, clientOf: "", want: ""},
		{name: "plaintext asked of a TLS port", addr: tlsAddr, clientOf: tlsAddr, want: answeredTLS},
		{name: "TLS asked of a plaintext port", addr: plain, tlsAsked: true, clientOf: plain, want: answeredPlaintext},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.clientOf != "" {
				err = dialError(t, tt.clientOf, tt.tlsAsked)
			} else {
				err = assert.AnError
			}
			assert.Equal(t, tt.want, mismatch(context.Background(), tt.addr, tt.tlsAsked, err), "%v", err)
		})
	}
	t.Run("a metrics URL is not probed", func(t *testing.T) {
		err := dialError(t, tlsAddr, false)
		assert.Empty(t, mismatch(context.Background(), "https://"+tlsAddr+"/metrics", false, err))
		assert.True(t, strings.Contains(err.Error(), "server preface") || strings.Contains(err.Error(), "frame"), "%v", err)
	})
}
