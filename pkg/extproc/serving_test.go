package extproc

import (
	"context"
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
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestServingOptions(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "the defaults are the Endpoint Picker ports"},
		{name: "a port of 0 picks a free one", args: []string{"--grpc-port=0"}},
		{name: "a port above 65535 is refused", args: []string{"--grpc-health-port=70000"}, wantErr: "--grpc-health-port 70000 is not a port"},
		{name: "a negative port is refused", args: []string{"--metrics-port=-1"}, wantErr: "--metrics-port -1 is not a port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewServingOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			require.NoError(t, fs.Parse(tt.args))
			err := o.Validate()
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			assert.NoError(t, err)
		})
	}
	t.Run("the command says when the health services turn SERVING", func(t *testing.T) {
		o := NewServingOptions()
		o.HealthPortUsage = "SERVING once ready."
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(fs)
		assert.Equal(t, "Port of the gRPC health service (grpc.health.v1): SERVING once ready.", fs.Lookup("grpc-health-port").Usage)
		assert.Equal(t, "9002", fs.Lookup("grpc-port").DefValue)
	})
}

func TestTheExtProcPortListensOnItsOwnAddress(t *testing.T) {
	s, err := Listen(ServingOptions{BindAddress: "127.0.0.1", ExtProcBindAddress: "127.0.0.2"}, extprocv3.UnimplementedExternalProcessorServer{}, prometheus.NewRegistry())
	require.NoError(t, err)
	t.Cleanup(s.closeListeners)
	assert.Regexp(t, `^127\.0\.0\.2:\d+$`, s.GRPCAddr())
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, s.HealthAddr())
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, s.MetricsAddr())
}

func TestServers(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "test_total", Help: "A test counter."}))
	o := ServingOptions{BindAddress: "127.0.0.1"}
	s, err := Listen(o, extprocv3.UnimplementedExternalProcessorServer{}, reg)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Second) }()

	healthOf := func(addr, service string) healthpb.HealthCheckResponse_ServingStatus {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer func() { _ = conn.Close() }()
		resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		require.NoError(t, err)
		return resp.GetStatus()
	}
	for _, addr := range []string{s.HealthAddr(), s.GRPCAddr()} {
		assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, healthOf(addr, ReadinessService), "before Ready, on %s", addr)
	}
	s.Ready()
	for _, addr := range []string{s.HealthAddr(), s.GRPCAddr()} {
		for _, svc := range []string{"", ReadinessService, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
			assert.Equal(t, healthpb.HealthCheckResponse_SERVING, healthOf(addr, svc), "service %q on %s", svc, addr)
		}
	}

	resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(b), "test_total 0")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestProfilesAreServedOnlyWhenEnabledAndOnlyToWhomTheMetricsFilterAdmits(t *testing.T) {
	// The filter admits requests bearing the header, as the sidecar's
	// admits an authorized scraper.
	admit := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Admitted") == "" {
				http.Error(w, "forbidden", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	get := func(t *testing.T, addr string, admitted bool) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/debug/pprof/goroutine?debug=1", nil)
		require.NoError(t, err)
		if admitted {
			req.Header.Set("X-Admitted", "yes")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, enabled := range []bool{false, true} {
		s, err := Listen(ServingOptions{BindAddress: "127.0.0.1", EnablePprof: enabled, MetricsFilter: admit}, extprocv3.UnimplementedExternalProcessorServer{}, prometheus.NewRegistry())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx, time.Second) }()
		if enabled {
			assert.Equal(t, http.StatusOK, get(t, s.MetricsAddr(), true), "enabled, admitted")
			assert.Equal(t, http.StatusForbidden, get(t, s.MetricsAddr(), false), "enabled, not admitted")
		} else {
			assert.Equal(t, http.StatusNotFound, get(t, s.MetricsAddr(), true), "not enabled")
		}
		cancel()
		require.NoError(t, <-done)
	}
}
