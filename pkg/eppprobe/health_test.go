package eppprobe

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

// What a prober knows of an address, for assertions.
const (
	isUnknown    = "unknown"
	isServing    = "serving"
	isNotServing = "not serving"
)

func statusOf(p *HealthProber, addr string) string {
	switch ok, known := p.Serving(addr); {
	case !known:
		return isUnknown
	case ok:
		return isServing
	default:
		return isNotServing
	}
}

// serveHealth serves a gRPC health service on loopback until the test ends.
func serveHealth(t *testing.T) (*health.Server, string) {
	hs := health.NewServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return hs, lis.Addr().String()
}

// runProber runs p until the test ends.
func runProber(t *testing.T, p *HealthProber) { runUntilTheEnd(t, context.Background(), p.Run) }

// runUntilTheEnd runs run with ctx until the test ends, and waits for it.
func runUntilTheEnd(t *testing.T, ctx context.Context, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		_ = run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func TestHealthProber(t *testing.T) {
	hs, up := serveHealth(t)

	// A closed port: nothing listens.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := dead.Addr().String()
	require.NoError(t, dead.Close())

	p := NewHealthProber(HealthProberOptions{Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond})
	p.SetTargets([]string{up, down})
	runProber(t, p)

	assert.Equal(t, isUnknown, statusOf(p, ""), "no health address")
	assert.Equal(t, isUnknown, statusOf(p, "127.0.0.1:1"), "not a target")

	hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
	require.Eventually(t, func() bool { return statusOf(p, up) == isServing }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return statusOf(p, down) == isNotServing }, 5*time.Second, 10*time.Millisecond)

	hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_NOT_SERVING)
	require.Eventually(t, func() bool { return statusOf(p, up) == isNotServing }, 5*time.Second, 10*time.Millisecond)

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
		require.Eventually(t, func() bool { return statusOf(p, lis.Addr().String()) == isServing }, 5*time.Second, 10*time.Millisecond)
	})

	t.Run("a failure marks the EPP down until its next good probe", func(t *testing.T) {
		hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
		p2 := NewHealthProber(HealthProberOptions{Interval: time.Hour, Timeout: time.Second})
		p2.SetTargets([]string{up})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = p2.Run(ctx) }()
		require.Eventually(t, func() bool { return statusOf(p2, up) == isServing }, 5*time.Second, 10*time.Millisecond)
		addrs := []string{up, "", "not-a-target:1"}
		refs := make([]HealthRef, len(addrs))
		version := p2.Refs(func(i int) string { return addrs[i] }, refs)
		refsAnswer := func() {
			t.Helper()
			for i, addr := range addrs {
				serving, known := p2.Serving(addr)
				refServing, refKnown := refs[i].Serving()
				assert.Equal(t, [2]bool{serving, known}, [2]bool{refServing, refKnown}, "a HealthRef answers as Serving for %q", addr)
			}
		}
		refsAnswer()
		p2.MarkFailed(up)
		assert.Equal(t, isNotServing, statusOf(p2, up))
		refsAnswer()
		p2.MarkFailed("not-a-target:1")
		assert.Equal(t, isUnknown, statusOf(p2, "not-a-target:1"))
		refsAnswer()
		assert.Equal(t, version, p2.Version())
		p2.SetTargets(nil)
		assert.NotEqual(t, version, p2.Version(), "a change of the addresses changes the version")
	})

	t.Run("removed targets are forgotten", func(t *testing.T) {
		p.SetTargets([]string{down})
		assert.Equal(t, isUnknown, statusOf(p, up))
	})
}

// TestHealthProberOnServing: the prober tells OnServing of each address that
// turns SERVING, once per turn, so that the relay retries at once.
func TestHealthProberOnServing(t *testing.T) {
	hs, up := serveHealth(t)
	hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_NOT_SERVING)

	turned := make(chan string, 10)
	p := NewHealthProber(HealthProberOptions{Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, OnServing: func(addr string) { turned <- addr }})
	p.SetTargets([]string{up})
	runProber(t, p)

	require.Eventually(t, func() bool { return statusOf(p, up) == isNotServing }, 5*time.Second, 10*time.Millisecond)
	assert.Empty(t, turned, "not serving yet")
	hs.SetServingStatus(HealthService, healthpb.HealthCheckResponse_SERVING)
	select {
	case addr := <-turned:
		assert.Equal(t, up, addr)
	case <-time.After(5 * time.Second):
		t.Fatal("OnServing never learned of the address")
	}
	// Several checks (every 20ms), all SERVING.
	assert.Never(t, func() bool { return len(turned) > 0 }, 100*time.Millisecond, 10*time.Millisecond, "once per turn, not once per check")

	p.MarkFailed(up)
	select {
	case addr := <-turned:
		assert.Equal(t, up, addr, "serving again after a failure")
	case <-time.After(5 * time.Second):
		t.Fatal("OnServing never learned of the address serving again")
	}
}
