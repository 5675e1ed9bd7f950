package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/mci-dev/mci/pkg/extproc"
)

// recorder is the gateway's stream, keeping every message read from it so
// that the request can be replayed, exactly as the gateway sent it, to an
// EPP (and again to the next one when the first fails).
type recorder struct {
	extproc.Stream
	msgs []*extprocv3.ProcessingRequest
}

func (r *recorder) Recv() (*extprocv3.ProcessingRequest, error) {
	m, err := r.Stream.Recv()
	if err == nil {
		r.msgs = append(r.msgs, m)
	}
	return m, err
}

// errNoAnswer wraps the ways an EPP can fail before answering.
var errNoAnswer = errors.New("the EPP did not answer")

// refusal is an EPP's immediate 503 (its pool has no endpoint): the next
// cluster is tried, and the answer is kept in case none does better.
type refusal struct {
	resp *extprocv3.ProcessingResponse
}

func (r *refusal) Error() string {
	return fmt.Sprintf("the EPP answered %d: %s", r.resp.GetImmediateResponse().GetStatus().GetCode(), r.resp.GetImmediateResponse().GetDetails())
}

// relayer opens ext_proc streams to EPPs on connections cached per address.
type relayer struct {
	timeout time.Duration
	linger  time.Duration

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// grace is how long a connection to an EPP that left the table stays
	// open for the streams still using it.
	grace time.Duration
}

func newRelayer(timeout time.Duration) *relayer {
	return &relayer{timeout: timeout, linger: time.Second, conns: map[string]*grpc.ClientConn{}, grace: 2*timeout + 5*time.Second}
}

// dialOptions: plaintext, as gateways speak to EPPs; a short reconnect
// backoff so that an EPP that comes back is used again within about a
// second instead of gRPC's default of up to two minutes.
var dialOptions = []grpc.DialOption{
	grpc.WithTransportCredentials(insecure.NewCredentials()),
	grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: time.Second,
	}),
}

func (r *relayer) conn(addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, dialOptions...)
	if err != nil {
		return nil, fmt.Errorf("connecting to EPP %s: %w", addr, err)
	}
	r.conns[addr] = c
	return c, nil
}

// retain closes, after a grace period, the connections to addresses not in
// keep.
func (r *relayer) retain(keep map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, c := range r.conns {
		if !keep[addr] {
			delete(r.conns, addr)
			time.AfterFunc(r.grace, func() { _ = c.Close() })
		}
	}
}

func (r *relayer) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, c := range r.conns {
		_ = c.Close()
		delete(r.conns, addr)
	}
}

// shape is what the gateway expects back for a request.
type shape struct {
	hasBody, endedByTrailers bool
}

func shapeOf(msgs []*extprocv3.ProcessingRequest) shape {
	s := shape{hasBody: len(msgs) > 0 && !msgs[0].GetRequestHeaders().GetEndOfStream()}
	if s.hasBody && msgs[len(msgs)-1].GetRequestTrailers() != nil {
		s.endedByTrailers = true
	}
	return s
}

// withoutSubsetHint returns msgs with the subset hint removed from the
// metadata of the first message: the hint lists endpoints of the local
// pool, which a remote EPP does not have and would answer with 503.
func withoutSubsetHint(msgs []*extprocv3.ProcessingRequest) []*extprocv3.ProcessingRequest {
	if len(msgs) == 0 || msgs[0].GetMetadataContext().GetFilterMetadata()[extproc.SubsetHintNamespace] == nil {
		return msgs
	}
	first := proto.Clone(msgs[0]).(*extprocv3.ProcessingRequest)
	md := first.GetMetadataContext()
	fm := make(map[string]*structpb.Struct, len(md.GetFilterMetadata()))
	for k, v := range md.GetFilterMetadata() {
		if k != extproc.SubsetHintNamespace {
			fm[k] = v
		}
	}
	first.MetadataContext = &corev3.Metadata{FilterMetadata: fm, TypedFilterMetadata: md.GetTypedFilterMetadata()}
	out := make([]*extprocv3.ProcessingRequest, len(msgs))
	out[0] = first
	copy(out[1:], msgs[1:])
	return out
}

// relay replays the request to the EPP at addr and collects its whole
// answer to the request phase: the headers response (destination and
// mutations) and the streamed body, or an immediate response. Nothing is
// sent to the gateway until the answer is whole, so an EPP that fails at
// any point before can be replaced by the next cluster's. An immediate 503
// comes back as a *refusal error.
//
// The EPP's stream ends with the request phase: the sidecar answers the
// response phase itself (it lets it through unchanged, as mci-epp does).
func (r *relayer) relay(ctx context.Context, addr string, msgs []*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	conn, err := r.conn(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var timedOut atomic.Bool
	timer := time.AfterFunc(r.timeout, func() {
		timedOut.Store(true)
		cancel()
	})
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		timer.Stop()
		cancel()
		return nil, fmt.Errorf("%w: opening the stream: %w", errNoAnswer, err)
	}
	// The sender runs beside the receiver, as in a gateway: an EPP may
	// answer (an immediate response) before it has read the whole body.
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, m := range msgs {
			if stream.Send(m) != nil {
				return
			}
		}
	})
	resps, err := receive(stream, shapeOf(msgs))
	timer.Stop()
	if err != nil || resps[len(resps)-1].GetImmediateResponse() != nil {
		// A gateway resets the stream once it has an immediate response.
		cancel()
		wg.Wait()
		if err != nil {
			if timedOut.Load() {
				err = fmt.Errorf("no answer within %v: %w", r.timeout, err)
			}
			return nil, fmt.Errorf("%w: %w", errNoAnswer, err)
		}
		if resps[0].GetImmediateResponse().GetStatus().GetCode() == http.StatusServiceUnavailable {
			return nil, &refusal{resp: resps[0]}
		}
		return resps, nil
	}
	// Answered: the EPP has read the whole request. End our side and let it
	// end its own, so that it sees a clean end of stream; one that lingers
	// is reset.
	wg.Wait()
	go func() {
		_ = stream.CloseSend()
		linger := time.AfterFunc(r.linger, cancel)
		for {
			if _, err := stream.Recv(); err != nil {
				break
			}
		}
		linger.Stop()
		cancel()
	}()
	return resps, nil
}

// receive reads an EPP's answer to the request phase: until the headers
// response and the whole body (and the trailers response for a request
// ended by trailers) are back, or an immediate response comes.
func receive(stream extprocv3.ExternalProcessor_ProcessClient, s shape) ([]*extprocv3.ProcessingResponse, error) {
	var resps []*extprocv3.ProcessingResponse
	gotHeaders, bodyDone, trailersDone := false, !s.hasBody, !s.endedByTrailers
	for !gotHeaders || !bodyDone || !trailersDone {
		resp, err := stream.Recv()
		if err == io.EOF {
			return nil, errors.New("the EPP ended the stream before answering")
		}
		if err != nil {
			return nil, err
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			return []*extprocv3.ProcessingResponse{resp}, nil
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if gotHeaders {
				return nil, errors.New("protocol violation: a second request headers response")
			}
			gotHeaders = true
		case *extprocv3.ProcessingResponse_RequestBody:
			if !gotHeaders {
				return nil, errors.New("protocol violation: a request body response before the headers response")
			}
			sr := r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil || (sr.GetEndOfStream() && !s.endedByTrailers) {
				// Without a streamed response the body goes on unchanged,
				// as in the modes other than FULL_DUPLEX_STREAMED.
				bodyDone = true
			}
		case *extprocv3.ProcessingResponse_RequestTrailers:
			bodyDone, trailersDone = true, true
		default:
			return nil, fmt.Errorf("protocol violation: %T during the request phase", resp.Response)
		}
		resps = append(resps, resp)
	}
	return resps, nil
}
