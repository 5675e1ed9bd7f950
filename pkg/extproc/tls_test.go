package extproc

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mci-dev/mci/test/tlstest"
	"github.com/mci-dev/mci/test/waitfor"
)

func TestTLSOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	serving := tlstest.NewServing(t, "127.0.0.1")
	cert := tlstest.WriteFile(t, dir, "tls.crt", serving.CertPEM)
	key := tlstest.WriteFile(t, dir, "tls.key", serving.KeyPEM)
	ca := tlstest.WriteFile(t, dir, "ca.crt", tlstest.NewClient(t, "client").CertPEM)
	garbage := tlstest.WriteFile(t, dir, "garbage.pem", []byte("not PEM"))
	otherKey := tlstest.WriteFile(t, dir, "other.key", tlstest.NewServing(t, "127.0.0.1").KeyPEM)
	missing := dir + "/missing.pem"

	tests := []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{name: "no TLS flags serve plaintext"},
		{name: "a certificate and its key serve TLS", args: []string{"--tls-cert-file=" + cert, "--tls-private-key-file=" + key}},
		{name: "a client CA asks for client certificates", args: []string{"--tls-cert-file=" + cert, "--tls-private-key-file=" + key, "--tls-client-ca-file=" + ca}},
		{name: "a certificate without its key is refused", args: []string{"--tls-cert-file=" + cert}, wantErr: []string{"--tls-cert-file needs --tls-private-key-file"}},
		{name: "a key without a certificate is refused", args: []string{"--tls-private-key-file=" + key}, wantErr: []string{"--tls-private-key-file needs --tls-cert-file"}},
		{name: "a client CA without a serving certificate is refused", args: []string{"--tls-client-ca-file=" + ca}, wantErr: []string{"--tls-client-ca-file needs --tls-cert-file"}},
		{name: "a missing certificate file is named", args: []string{"--tls-cert-file=" + missing, "--tls-private-key-file=" + key}, wantErr: []string{missing, "no such file"}},
		{name: "a certificate file without PEM is refused", args: []string{"--tls-cert-file=" + garbage, "--tls-private-key-file=" + key}, wantErr: []string{garbage, "PEM"}},
		{name: "a key that does not match the certificate is refused", args: []string{"--tls-cert-file=" + cert, "--tls-private-key-file=" + otherKey}, wantErr: []string{"private key does not match public key"}},
		{name: "a client CA file without certificates is refused", args: []string{"--tls-cert-file=" + cert, "--tls-private-key-file=" + key, "--tls-client-ca-file=" + garbage}, wantErr: []string{"--tls-client-ca-file", garbage}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewServingOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			require.NoError(t, fs.Parse(tt.args))
			err := o.Validate()
			if len(tt.wantErr) == 0 {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, s := range tt.wantErr {
				assert.Contains(t, err.Error(), s)
			}
			assert.NotContains(t, err.Error(), "PRIVATE KEY-----", "no key material in errors")
		})
	}
}

// tlsServers runs Servers on 127.0.0.1 with TLSOptions o until the test
// ends, ready.
func tlsServers(t *testing.T, o TLSOptions) *Servers {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "test_total", Help: "A test counter."}))
	s, err := Listen(ServingOptions{BindAddress: "127.0.0.1", TLS: o}, extprocv3.UnimplementedExternalProcessorServer{}, reg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Second) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	s.Ready()
	return s
}

// checkHealth asks addr's gRPC health service about the server over a new
// connection.
func checkHealth(addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	return err
}

func getMetrics(url string, c *tls.Config) (string, error) {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: c}, Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), err
}

func TestServersServeMutualTLSOnEveryPort(t *testing.T) {
	dir := t.TempDir()
	serving := tlstest.NewServing(t, "127.0.0.1")
	client, stranger := tlstest.NewClient(t, "sidecar"), tlstest.NewClient(t, "stranger")
	s := tlsServers(t, TLSOptions{
		CertFile:     tlstest.WriteFile(t, dir, "tls.crt", serving.CertPEM),
		KeyFile:      tlstest.WriteFile(t, dir, "tls.key", serving.KeyPEM),
		ClientCAFile: tlstest.WriteFile(t, dir, "client-ca.crt", client.CertPEM),
	})

	for _, addr := range []string{s.GRPCAddr(), s.HealthAddr()} {
		assert.NoError(t, checkHealth(addr, credentials.NewTLS(tlstest.ClientConfig(t, serving.CAPEM, &client))), "a trusted client certificate on %s", addr)
		assert.Error(t, checkHealth(addr, credentials.NewTLS(tlstest.ClientConfig(t, serving.CAPEM, nil))), "no client certificate on %s", addr)
		assert.Error(t, checkHealth(addr, credentials.NewTLS(tlstest.ClientConfig(t, serving.CAPEM, &stranger))), "an untrusted client certificate on %s", addr)
		assert.Error(t, checkHealth(addr, insecure.NewCredentials()), "plaintext on %s", addr)
	}

	body, err := getMetrics("https://"+s.MetricsAddr()+"/metrics", tlstest.ClientConfig(t, serving.CAPEM, &client))
	require.NoError(t, err)
	assert.Contains(t, body, "test_total 0")
	_, err = getMetrics("https://"+s.MetricsAddr()+"/metrics", tlstest.ClientConfig(t, serving.CAPEM, nil))
	assert.Error(t, err, "metrics without a client certificate")
	_, err = getMetrics("http://"+s.MetricsAddr()+"/metrics", nil)
	assert.ErrorContains(t, err, "400 Bad Request", "metrics in plaintext")
}

func TestServersServeRotatedCertificates(t *testing.T) {
	dir := t.TempDir()
	first := tlstest.NewServing(t, "127.0.0.1")
	o := TLSOptions{
		CertFile: tlstest.WriteFile(t, dir, "tls.crt", first.CertPEM),
		KeyFile:  tlstest.WriteFile(t, dir, "tls.key", first.KeyPEM),
	}
	s := tlsServers(t, o)
	require.NoError(t, checkHealth(s.GRPCAddr(), credentials.NewTLS(tlstest.ClientConfig(t, first.CAPEM, nil))))

	t.Run("a pair that does not load keeps the last good one in use", func(t *testing.T) {
		tlstest.WriteFile(t, dir, "tls.key", []byte("half-written"))
		// The servers look at the files on a handshake, at most once a
		// second: within this window a handshake has made them try the
		// half-written pair.
		waitfor.Consistently(t, t.Context(), 1100*time.Millisecond, func(context.Context) (bool, string) {
			err := checkHealth(s.GRPCAddr(), credentials.NewTLS(tlstest.ClientConfig(t, first.CAPEM, nil)))
			return err == nil, fmt.Sprintf("a handshake with the last good certificate failed: %v", err)
		})
	})

	t.Run("new connections get the new certificate once the files change", func(t *testing.T) {
		second := tlstest.NewServing(t, "127.0.0.1")
		tlstest.WriteFile(t, dir, "tls.crt", second.CertPEM)
		tlstest.WriteFile(t, dir, "tls.key", second.KeyPEM)
		assert.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.NoError(c, checkHealth(s.GRPCAddr(), credentials.NewTLS(tlstest.ClientConfig(t, second.CAPEM, nil))))
		}, 5*time.Second, 100*time.Millisecond)
		assert.Error(t, checkHealth(s.GRPCAddr(), credentials.NewTLS(tlstest.ClientConfig(t, first.CAPEM, nil))), "the old CA no longer verifies the server")
		body, err := getMetrics("https://"+s.MetricsAddr()+"/metrics", tlstest.ClientConfig(t, second.CAPEM, nil))
		require.NoError(t, err)
		assert.Contains(t, body, "test_total 0")
	})
}
