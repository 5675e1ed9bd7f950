package sidecar

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// relayConn is a connection of the relay to an EPP, with the ext_proc
// streams open on it.
type relayConn struct {
	*grpc.ClientConn
	streams *openStreams
}

// openStreams counts the ext_proc streams open on one connection, from
// gRPC's own view of them (a stats.Handler of that connection alone). A
// connection the relay no longer hands out (its EPP left the routing table:
// an export withdrawn, a cluster gone, or its credentials changed) is closed
// when its last stream ends rather than at a fixed time: a stream of a
// request in flight, a long generation among them, keeps the EPP that
// routed it until the response ends, so that the EPP's in-flight counts
// and accounting see it through. The drain timeout bounds the wait.
type openStreams struct {
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

func (s *openStreams) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (s *openStreams) HandleRPC(_ context.Context, st stats.RPCStats) {
	switch st.(type) {
	case *stats.Begin:
		s.mu.Lock()
		s.open++
		s.mu.Unlock()
	case *stats.End:
		s.mu.Lock()
		s.open--
		closeNow := s.open == 0 && s.retired != nil
		retired := s.retired
		s.mu.Unlock()
		if closeNow {
			// Not on the stream's own goroutine: closing waits for it.
			go retired()
		}
	}
}

func (s *openStreams) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (s *openStreams) HandleConn(context.Context, stats.ConnStats) {}

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
