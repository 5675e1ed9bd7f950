package sidecar

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mci-dev/mci/pkg/responserelay"
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
		c, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return relayConn{ClientConn: c, streams: &openStreams{}}
	}
	// open starts a long stream on c (a health Watch stays open), counted
	// as the relay counts its own, ended by the returned func.
	open := func(t *testing.T, c relayConn) func() {
		ctx, cancel := context.WithCancelCause(context.Background())
		end := c.streams.opened(cancel)
		w, err := healthpb.NewHealthClient(c).Watch(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = w.Recv()
		require.NoError(t, err)
		return func() { end(nil) }
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

// The relay counts each stream it opens until the stream ends, whichever
// way it ends, on its connection (which a retired connection waits for)
// and in mci_sidecar_epp_streams; a retired connection closes once the
// last stream the relay has on it ends. Real gRPC to a fake EPP.
func TestTheRelayCountsEachStreamUntilItEnds(t *testing.T) {
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/completions")}}},
	}}}
	body := func(n int) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: bytes.Repeat([]byte("x"), n), EndOfStream: true}}}
	}
	small := outbound{msgs: []*extprocv3.ProcessingRequest{headers, body(100)}}
	// Past sendAtOnceBytes: sent by a goroutine of its own, which ends the
	// stream.
	large := outbound{msgs: []*extprocv3.ProcessingRequest{headers, body(40 << 10)}}
	const timeout = 500 * time.Millisecond

	start := func(t *testing.T, mode int32) (*fakeEPP, *relayer, *Metrics) {
		e := startFakeEPP(t, "epp", "10.0.0.1:8000")
		e.mode.Store(mode)
		metrics := NewMetrics(prometheus.NewRegistry())
		r := newRelayer(ServerConfig{AttemptTimeout: timeout, EPPDrainTimeout: time.Minute}, nil, metrics)
		t.Cleanup(r.close)
		return e, r, metrics
	}
	// counted is what the relay counts open on e's connection, and in the
	// gauge.
	counted := func(t *testing.T, r *relayer, e *fakeEPP, m *Metrics) (int, float64) {
		c, err := r.conn(e.addr)
		if !assert.NoError(t, err) {
			return -1, -1
		}
		c.streams.mu.Lock()
		defer c.streams.mu.Unlock()
		return c.streams.open, testutil.ToFloat64(m.eppStreams)
	}
	ended := func(t *testing.T, r *relayer, e *fakeEPP, m *Metrics) {
		t.Helper()
		assert.Eventually(t, func() bool { open, gauge := counted(t, r, e, m); return open == 0 && gauge == 0 }, 5*time.Second, 10*time.Millisecond,
			"the stream's end is counted")
	}

	for _, tt := range []struct {
		name string
		mode int32
		msgs outbound
		keep bool
		// gatewayGoes: the gateway goes away while the EPP has not answered.
		gatewayGoes bool
		// end ends the kept stream.
		end     func(live *responserelay.EPPStream, gatewayGone context.CancelFunc)
		wantErr bool
	}{
		{name: "the EPP ends it once the request phase, all there is, is answered", mode: eppRoute, msgs: small},
		{name: "the same, the request sent beside the answer", mode: eppRoute, msgs: large},
		{name: "the EPP fails", mode: eppFail, msgs: small, wantErr: true},
		{name: "the EPP fails, the request sent beside the answer", mode: eppFail, msgs: large, wantErr: true},
		{name: "the EPP answers 503 and the relay resets it", mode: eppUnavailable, msgs: small, wantErr: true},
		{name: "the EPP does not answer in time", mode: eppHang, msgs: small, wantErr: true},
		{name: "the gateway goes away before the EPP answers", mode: eppHang, msgs: small, gatewayGoes: true, wantErr: true},
		{name: "kept for the response phase, then reset", mode: eppRoute, msgs: small, keep: true,
			end: func(live *responserelay.EPPStream, _ context.CancelFunc) { live.Reset(errors.New("done")) }},
		{name: "kept for the response phase, the gateway goes away", mode: eppRoute, msgs: small, keep: true,
			end: func(_ *responserelay.EPPStream, gatewayGone context.CancelFunc) { gatewayGone() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, r, m := start(t, tt.mode)
			gateway, gatewayGone := context.WithCancel(context.Background())
			defer gatewayGone()
			if tt.gatewayGoes {
				time.AfterFunc(timeout/5, func() {
					open, gauge := counted(t, r, e, m)
					assert.Equal(t, 1, open, "counted while open")
					assert.Equal(t, 1.0, gauge, "counted while open")
					gatewayGone()
				})
			}
			begun := time.Now()
			_, live, err := r.relay(gateway, e.addr, tt.msgs, tt.keep, 0)
			if tt.wantErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			if tt.gatewayGoes {
				assert.Less(t, time.Since(begun), timeout, "ended by the gateway, not the timeout")
			}
			if tt.keep {
				require.NotNil(t, live)
				time.Sleep(100 * time.Millisecond)
				open, gauge := counted(t, r, e, m)
				assert.Equal(t, 1, open, "the kept stream is counted")
				assert.Equal(t, 1.0, gauge, "the kept stream is counted")
				tt.end(live, gatewayGone)
			}
			ended(t, r, e, m)
		})
	}

	t.Run("a retired connection closes once the relay's last stream on it ends", func(t *testing.T) {
		e, r, m := start(t, eppRoute)
		c, err := r.conn(e.addr)
		require.NoError(t, err)
		var kept []*responserelay.EPPStream
		for range 2 {
			_, live, err := r.relay(context.Background(), e.addr, small, true, 0)
			require.NoError(t, err)
			kept = append(kept, live)
		}
		r.retain(nil)
		time.Sleep(streamsBeginGrace + 300*time.Millisecond)
		kept[0].Reset(errors.New("done"))
		time.Sleep(300 * time.Millisecond)
		assert.NotEqual(t, connectivity.Shutdown, c.GetState(), "a stream still runs on the retired connection")
		kept[1].Reset(errors.New("done"))
		assert.Eventually(t, func() bool { return c.GetState() == connectivity.Shutdown }, 2*time.Second, 10*time.Millisecond,
			"closed once its last stream ended")
		assert.Equal(t, 0.0, testutil.ToFloat64(m.eppStreams))
	})
}
