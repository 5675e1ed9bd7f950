package sidecar

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mci-dev/mci/pkg/epp"
)

func TestParsePoolMetrics(t *testing.T) {
	at := epoch
	tests := []struct {
		name    string
		text    string
		want    map[string]*PoolMetrics
		wantErr bool
	}{
		{
			name: "the gauges of one pool",
			text: `# HELP inference_pool_average_queue_size Average queue.
# TYPE inference_pool_average_queue_size gauge
inference_pool_average_queue_size{name="llm"} 4.5
# HELP inference_pool_average_kv_cache_utilization Average KV.
# TYPE inference_pool_average_kv_cache_utilization gauge
inference_pool_average_kv_cache_utilization{name="llm"} 0.25
# TYPE inference_pool_ready_pods gauge
inference_pool_ready_pods{name="llm"} 3
# TYPE go_goroutines gauge
go_goroutines 12
this line is garbage of another metric
`,
			want: map[string]*PoolMetrics{"llm": {AverageQueue: 4.5, AverageKVCache: 0.25, ReadyPods: 3, UpdatedAt: at}},
		},
		{
			name: "several pools, one without ready pods gauge",
			text: `inference_pool_average_queue_size{name="a"} 1
inference_pool_average_kv_cache_utilization{name="a"} 0.1
inference_pool_average_queue_size{name="b"} 2
inference_pool_average_kv_cache_utilization{name="b"} 0.2
inference_pool_ready_pods{name="b"} 0
`,
			want: map[string]*PoolMetrics{
				"a": {AverageQueue: 1, AverageKVCache: 0.1, ReadyPods: -1, UpdatedAt: at},
				"b": {AverageQueue: 2, AverageKVCache: 0.2, ReadyPods: 0, UpdatedAt: at},
			},
		},
		{
			name:    "no pool gauges is an error",
			text:    "go_goroutines 12\n",
			wantErr: true,
		},
		{
			name:    "a queue without KV cache is not enough",
			text:    `inference_pool_average_queue_size{name="a"} 1` + "\n",
			wantErr: true,
		},
		{
			name:    "a malformed pool gauge is an error",
			text:    `inference_pool_average_queue_size{name="a" 1` + "\n",
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePoolMetrics(strings.NewReader(tt.text), at)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestParsePoolMetricsOfMCIEPP reads the gauges as pkg/epp exposes them.
func TestParsePoolMetricsOfMCIEPP(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := epp.NewPool("llm", nil, nil)
	require.NoError(t, p.SetEndpoints([]epp.Endpoint{{Name: "a", Address: "127.0.0.1:1"}}))
	epp.NewMetrics(reg, p, time.Second)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	got, err := ParsePoolMetrics(resp.Body, epoch)
	require.NoError(t, err)
	require.Contains(t, got, "llm")
	assert.Equal(t, 1, got["llm"].ReadyPods)
}

func TestHealthProber(t *testing.T) {
	hs := health.NewServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	up := lis.Addr().String()

	// A closed port: nothing listens.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := dead.Addr().String()
	require.NoError(t, dead.Close())

	p := NewHealthProber(20*time.Millisecond, 200*time.Millisecond)
	p.SetTargets([]string{up, down})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = p.Run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()

	assert.Equal(t, HealthUnknown, p.Health(""), "no health address")
	assert.Equal(t, HealthUnknown, p.Health("127.0.0.1:1"), "not a target")

	hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
	require.Eventually(t, func() bool { return p.Health(up) == HealthServing }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return p.Health(down) == HealthNotServing }, 5*time.Second, 10*time.Millisecond)

	hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_NOT_SERVING)
	require.Eventually(t, func() bool { return p.Health(up) == HealthNotServing }, 5*time.Second, 10*time.Millisecond)

	t.Run("a server that does not know the ext_proc service is asked about itself", func(t *testing.T) {
		// A fresh health server knows only "" (SERVING): NotFound for the
		// ext_proc service.
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go func() { _ = srv.Serve(lis) }()
		defer srv.Stop()
		p.SetTargets([]string{up, down, lis.Addr().String()})
		require.Eventually(t, func() bool { return p.Health(lis.Addr().String()) == HealthServing }, 5*time.Second, 10*time.Millisecond)
	})

	t.Run("a failure marks the EPP down until its next good probe", func(t *testing.T) {
		hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
		p2 := NewHealthProber(time.Hour, time.Second)
		p2.SetTargets([]string{up})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = p2.Run(ctx) }()
		require.Eventually(t, func() bool { return p2.Health(up) == HealthServing }, 5*time.Second, 10*time.Millisecond)
		p2.MarkFailed(up)
		assert.Equal(t, HealthNotServing, p2.Health(up))
		p2.MarkFailed("not-a-target:1")
		assert.Equal(t, HealthUnknown, p2.Health("not-a-target:1"))
	})

	t.Run("removed targets are forgotten", func(t *testing.T) {
		p.SetTargets([]string{down})
		assert.Equal(t, HealthUnknown, p.Health(up))
	})
}

func TestPoolScraper(t *testing.T) {
	var queue atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "inference_pool_average_queue_size{name=\"llm\"} %d\ninference_pool_average_kv_cache_utilization{name=\"llm\"} 0.5\n", queue.Load())
	}))
	defer srv.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer broken.Close()

	s := NewPoolScraper(20*time.Millisecond, time.Second)
	s.SetTargets([]string{srv.URL, broken.URL})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()

	queue.Store(7)
	require.Eventually(t, func() bool {
		m := s.Get(srv.URL, "llm")
		return m != nil && m.AverageQueue == 7
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 0.5, s.Get(srv.URL, "other-name").AverageKVCache, "the only series serves any pool name")
	assert.Nil(t, s.Get(broken.URL, "llm"))
	assert.Nil(t, s.Get("", "llm"))

	queue.Store(9)
	require.Eventually(t, func() bool { return s.Get(srv.URL, "llm").AverageQueue == 9 }, 5*time.Second, 10*time.Millisecond)
}
