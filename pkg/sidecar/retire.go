package sidecar

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// relayConn is a connection of the relay to an EPP, with the ext_proc
// streams the relay has open on it.
type relayConn struct {
	*grpc.ClientConn
	streams *openStreams
}

// openStreams counts the ext_proc streams the relay has open on one
// connection, and those of all its connections in gauge (nil: not
// counted), mci_sidecar_epp_streams: a stream the relay forgets to end
// stays counted, so the gauge is how a leak shows (with no request open,
// it is 0).
//
// A connection the relay no longer hands out (its EPP left the routing
// table: an export withdrawn, a cluster gone, or its credentials changed)
// is closed when its last stream ends rather than at a fixed time: a
// stream of a request in flight, a long generation among them, keeps the
// EPP that routed it until the response ends, so that the EPP's in-flight
// counts and accounting see it through. The drain timeout bounds the wait.
//
// The relay counts its streams itself (opened) rather than with a gRPC
// stats.Handler on the connection, which would see each stream's begin
// and end too, but is handed an event for every message and header sent
// or received: about 21 allocations and 1.8 KB a request.
type openStreams struct {
	gauge prometheus.Gauge

	mu   sync.Mutex
	open int
	// retired closes the connection once it has no stream left; nil while
	// the relay still hands it out.
	retired func()
}

// streamsBeginGrace is how long a retired connection stays open even with no
// stream on it: a request given the connection just before it was retired
// begins its stream within it.
const streamsBeginGrace = time.Second

// opened counts a stream the relay is about to open on the connection,
// under a context that cancel cancels, and returns the cancel the stream is
// to be ended with: it is counted until that is first called, whoever
// calls it. This is the one place that counts streams, and every way a
// stream of the relay ends cancels its context: the EPP's end of stream
// read once the request phase was all (settle); a reset, for an immediate
// answer or a failure; the gateway's end, linked to it; the attempt
// timeout; the end of the response phase (responserelay.Run, deferred).
// A panic on the way is covered too: until the response phase the
// gateway's end cancels the stream (linked), and in it Run's deferred
// cancel does. A stream the EPP has ended stays
// counted until the relay is done with it: at once in settle, and in the
// response phase when Run returns (when the EPP ended early and the
// sidecar answers the rest, as the gateway's stream ends).
func (s *openStreams) opened(cancel context.CancelCauseFunc) context.CancelCauseFunc {
	s.add(1)
	e := &streamEnd{cancel: cancel, streams: s}
	return e.end
}

// streamEnd ends one stream of the relay, counting its end once.
type streamEnd struct {
	cancel  context.CancelCauseFunc
	streams *openStreams
	ended   atomic.Bool
}

func (e *streamEnd) end(cause error) {
	// Canceled first: a retired connection closed for the stream's end
	// finds it canceled already.
	e.cancel(cause)
	if e.ended.CompareAndSwap(false, true) {
		e.streams.add(-1)
	}
}

// add counts n streams more (n > 0) or fewer (n < 0), and closes a retired
// connection left with none.
func (s *openStreams) add(n int) {
	if s.gauge != nil {
		s.gauge.Add(float64(n))
	}
	s.mu.Lock()
	s.open += n
	closeNow := s.open == 0 && s.retired != nil
	retired := s.retired
	s.mu.Unlock()
	if closeNow {
		// Not on the caller's goroutine, which may be one the connection
		// waits for as it closes.
		go retired()
	}
}

// retire closes c once its last stream has ended (after streamsBeginGrace
// at the earliest), or at drainTimeout whatever is still open on it.
func (c relayConn) retire(drainTimeout time.Duration) {
	var once sync.Once
	closeConn := func() { once.Do(func() { _ = c.Close() }) }
	time.AfterFunc(streamsBeginGrace, func() {
		c.streams.mu.Lock()
		c.streams.retired = closeConn
		idle := c.streams.open == 0
		c.streams.mu.Unlock()
		if idle {
			closeConn()
		}
	})
	time.AfterFunc(drainTimeout, closeConn)
}
