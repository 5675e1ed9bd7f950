package extproc

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestResolveListenerTransport(t *testing.T) {
	cert := TLSOptions{CertFile: "tls.crt", KeyFile: "tls.key"}
	tests := []struct {
		name    string
		flag    ListenerTransport
		tls     TLSOptions
		shim    bool
		want    ListenerTransport
		wantErr bool
	}{
		{name: "an EPP shim serves self-signed TLS, and plaintext to the gateways that speak it", flag: ListenerAuto, shim: true, want: ListenerSelfSignedOrPlaintext},
		{name: "an ext_proc server of Envoy serves plaintext, as before", flag: ListenerAuto, want: ListenerPlaintext},
		{name: "a given certificate is served", flag: ListenerAuto, tls: cert, shim: true, want: ListenerCertificate},
		{name: "TLS only is asked for", flag: ListenerSelfSigned, shim: true, want: ListenerSelfSigned},
		{name: "plaintext is asked for", flag: ListenerPlaintext, shim: true, want: ListenerPlaintext},
		{name: "a mode of its own with a given certificate is an error", flag: ListenerPlaintext, tls: cert, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveListenerTransport(tt.flag, tt.tls, tt.shim)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	_, err := ParseListenerTransport("tls")
	assert.ErrorContains(t, err, "want one of auto, self-signed-or-plaintext, self-signed, plaintext")
}

// connections records what each connection spoke and how it ended.
type connections struct {
	mu  sync.Mutex
	got []string
}

func (c *connections) observe(spoke string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		spoke += " failed"
	}
	c.got = append(c.got, spoke)
}

func (c *connections) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

// TestSniffingCredentials: one port serves TLS with a self-signed
// certificate to gateways that do not verify it (the upstream EPP
// default) and, when asked to, plaintext to those that speak it.
func TestSniffingCredentials(t *testing.T) {
	cfg, err := SelfSignedConfig("mci-sidecar", "127.0.0.1", []string{"mci-sidecar.ns.svc"})
	require.NoError(t, err)
	skipVerify := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})) //nolint:gosec // as gateways reach EPPs
	plaintext := grpc.WithTransportCredentials(insecure.NewCredentials())
	for _, tt := range []struct {
		name      string
		plaintext bool
		want      []string
	}{
		{name: "self-signed or plaintext", plaintext: true, want: []string{"tls", "plaintext"}},
		{name: "self-signed only", want: []string{"tls", "plaintext failed"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conns := &connections{}
			srv := grpc.NewServer(grpc.Creds(SniffingCredentials(cfg, tt.plaintext, conns.observe)))
			healthpb.RegisterHealthServer(srv, health.NewServer())
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)

			check := func(opt grpc.DialOption) error {
				cc, err := grpc.NewClient(lis.Addr().String(), opt)
				require.NoError(t, err)
				defer func() { _ = cc.Close() }()
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
				return err
			}
			require.NoError(t, check(skipVerify), "TLS without verification is served")
			if tt.plaintext {
				require.NoError(t, check(plaintext), "plaintext is served")
			} else {
				require.Error(t, check(plaintext), "plaintext is refused")
			}
			assert.Eventually(t, func() bool { return len(conns.list()) >= 2 }, 5*time.Second, 10*time.Millisecond)
			assert.Equal(t, tt.want, conns.list()[:2])
		})
	}
}
