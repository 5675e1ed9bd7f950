package sidecar

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

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

	p := NewHealthProber(20*time.Millisecond, 200*time.Millisecond, DialPolicy{})
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
		p2 := NewHealthProber(time.Hour, time.Second, DialPolicy{})
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
