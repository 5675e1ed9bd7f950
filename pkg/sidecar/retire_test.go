package sidecar

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A retired connection of the relay closes when the last stream on it
// ends, and at the drain timeout whatever is still open on it.
func TestARetiredConnectionClosesWhenItsLastStreamEnds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	dial := func(t *testing.T) relayConn {
		streams := &openStreams{}
		c, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(streams))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return relayConn{ClientConn: c, streams: streams}
	}
	// open starts a long stream on c (a health Watch stays open), ended by
	// the returned cancel.
	open := func(t *testing.T, c relayConn) context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		w, err := healthpb.NewHealthClient(c).Watch(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = w.Recv()
		require.NoError(t, err)
		return cancel
	}
	closed := func(c relayConn) bool { return c.GetState() == connectivity.Shutdown }

	t.Run("the last stream ends", func(t *testing.T) {
		c := dial(t)
		end := open(t, c)
		c.retire(time.Minute)
		time.Sleep(streamsBeginGrace + 300*time.Millisecond)
		assert.False(t, closed(c), "a stream still runs on the retired connection")
		end()
		assert.Eventually(t, func() bool { return closed(c) }, 2*time.Second, 10*time.Millisecond, "closed once its last stream ended")
	})
	t.Run("the drain timeout passes", func(t *testing.T) {
		c := dial(t)
		end := open(t, c)
		defer end()
		c.retire(streamsBeginGrace + 500*time.Millisecond)
		assert.Eventually(t, func() bool { return closed(c) }, 3*time.Second, 10*time.Millisecond, "closed at the drain timeout with a stream open")
	})
	t.Run("no stream at all", func(t *testing.T) {
		c := dial(t)
		c.retire(time.Minute)
		assert.Eventually(t, func() bool { return closed(c) }, streamsBeginGrace+time.Second, 10*time.Millisecond, "closed after the grace for streams about to begin")
	})
}
