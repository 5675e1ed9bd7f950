package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/responserelay"
	"github.com/mci-dev/mci/pkg/routetable"
)

// recorder is the gateway's stream, keeping every message read from it so
// that the request can be replayed, exactly as the gateway sent it, to an
// EPP (and again to the next one when the first fails).
//
// Each body chunk takes twice its bytes from budget (nil: none), as it is
// held twice (kept here and read into the request's body), until release.
type recorder struct {
	extproc.Stream
	msgs []*extprocv3.ProcessingRequest
	// raw is the gateway's encoding of each of msgs (nil: not kept, the
	// stream reads no frames), which EPPs get as it is (outbound).
	raw [][]byte
	// buf, rawBuf and frames hold the messages of most requests (the
	// headers, a body in one chunk, maybe trailers) without an allocation
	// of their own.
	buf    [3]*extprocv3.ProcessingRequest
	rawBuf [3][]byte
	frames [3]extproc.RequestFrame
	// budget is charged bytes.
	budget  *admission
	charged int64
}

func newRecorder(s extproc.Stream, budget *admission) *recorder {
	r := &recorder{Stream: s, budget: budget}
	r.msgs, r.raw = r.buf[:0], r.rawBuf[:0]
	return r
}

func (r *recorder) Recv() (*extprocv3.ProcessingRequest, error) {
	m, raw, err := r.recv()
	if err != nil {
		return m, err
	}
	if n := 2 * int64(len(m.GetRequestBody().GetBody())); n > 0 && r.budget != nil {
		if !r.budget.reserve(n) {
			return nil, errOverBudget
		}
		r.charged += n
	}
	r.msgs, r.raw = append(r.msgs, m), append(r.raw, raw)
	return m, nil
}

// recv reads the next message. Those after the first (the body chunks,
// most of a request's bytes, and the trailers) are read as frames when
// the stream reads frames (the sidecar's gRPC server, extproc.FrameCodec):
// with the bytes they came in. The first, the request headers, is decoded
// only: a remote EPP gets it changed (forRemote), and keeping its bytes
// would cost a copy for the local EPP's sake alone, about what encoding
// it again costs.
func (r *recorder) recv() (*extprocv3.ProcessingRequest, []byte, error) {
	fs, ok := r.Stream.(interface{ RecvMsg(any) error })
	if !ok || len(r.msgs) == 0 {
		m, err := r.Stream.Recv()
		return m, nil, err
	}
	f := &extproc.RequestFrame{}
	if n := len(r.msgs); n < len(r.frames) {
		f = &r.frames[n]
	}
	f.ProcessingRequest = &extprocv3.ProcessingRequest{}
	if err := fs.RecvMsg(f); err != nil {
		return nil, nil, err
	}
	return f.ProcessingRequest, f.Raw, nil
}

// outbound is a request phase as an EPP is sent it: its messages, and
// the gateway's encoding of those it sent unchanged (raw[i], nil when
// changed or not kept), which go as those bytes rather than encoded again.
type outbound struct {
	msgs []*extprocv3.ProcessingRequest
	raw  [][]byte
}

// rawOf is the encoding message i goes as (nil: encoded again).
func (o outbound) rawOf(i int) []byte {
	if i < len(o.raw) {
		return o.raw[i]
	}
	return nil
}

// release gives the bytes charged back to the budget.
func (r *recorder) release() {
	if r.budget != nil {
		r.budget.release(r.charged)
		r.charged = 0
	}
}

// errNoAnswer wraps the ways an EPP can fail before answering.
var errNoAnswer = errors.New("the EPP did not answer")

// errAttemptTimeout ends an EPP stream that did not answer in time.
var errAttemptTimeout = errors.New("attempt timeout")

// refusal is an EPP's immediate 503 (its pool has no endpoint): the next
// cluster is tried, and the answer is kept in case none does better.
type refusal struct {
	resp *extprocv3.ProcessingResponse
}

func (r *refusal) Error() string {
	return fmt.Sprintf("the EPP answered %d: %s", r.resp.GetImmediateResponse().GetStatus().GetCode(), r.resp.GetImmediateResponse().GetDetails())
}

// relayer opens ext_proc streams to EPPs on connections kept per address
// and credentials (epptransport.Conns).
type relayer struct {
	timeout time.Duration
	linger  time.Duration
	// creds say how each address is reached (nil: plaintext), and learn
	// of the addresses that failed or answered.
	creds *epptransport.Credentials
	conns *epptransport.Conns[relayConn]
}

// newRelayer returns the relay to EPPs: each answer awaited for
// cfg.AttemptTimeout at most, each connection dialled with cfg.Dial and
// the credentials creds give its address (nil: plaintext), its streams
// counted in metrics (nil: not counted; openStreams). A connection whose
// credentials changed, or to an EPP that left the table, stays open for
// the streams still using it until they end, cfg.EPPDrainTimeout at most
// (relayConn).
func newRelayer(cfg ServerConfig, creds *epptransport.Credentials, metrics *Metrics) *relayer {
	cfg = cfg.withDefaults()
	dial := append(cfg.Dial.Options(), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(extproc.FrameCodec{})), extproc.DialBuffers())
	var gauge prometheus.Gauge
	if metrics != nil {
		gauge = metrics.eppStreams
	}
	r := &relayer{timeout: cfg.AttemptTimeout, linger: time.Second, creds: creds}
	r.conns = epptransport.NewConns(creds, 0, func(addr string, t *epptransport.EndpointTLS) (relayConn, error) {
		c, err := grpc.NewClient(addr, append(slices.Clip(dial), grpc.WithTransportCredentials(t.GRPC))...)
		return relayConn{ClientConn: c, streams: &openStreams{gauge: gauge}}, err
	}, func(c relayConn) { _ = c.Close() })
	r.conns.RetireWith(func(c relayConn) { c.retire(cfg.EPPDrainTimeout) })
	return r
}

// conn returns the connection to addr with its current credentials.
func (r *relayer) conn(addr string) (relayConn, error) {
	c, err := r.conns.Get(addr)
	if err != nil {
		return relayConn{}, fmt.Errorf("connecting to EPP %s: %w", addr, err)
	}
	return c, nil
}

// retain closes the connections to addresses not in keep once their
// streams have ended (relayConn.retire).
func (r *relayer) retain(keep map[string]bool) {
	r.conns.Retain(func(addr string) bool { return keep[addr] })
}

// reconnect makes the connection to addr, when it waits to reconnect, try
// at once: the EPP's health port answered again, so its ext_proc port
// likely does too, and the next request should not fail on a connection
// still in its backoff. A connection in its backoff is replaced by a new
// one (streams on the old one finish within the grace period), rather than
// told ResetConnectBackoff: in grpc-go (v1.84 and v1.85 at least) that
// ranges over the connection's subchannels outside its lock, a fatal
// concurrent map access when the balancer changes them at that moment.
func (r *relayer) reconnect(addr string) {
	waiting := false
	r.conns.With(addr, func(c relayConn) { waiting = c.GetState() == connectivity.TransientFailure })
	if waiting {
		r.conns.Forget(addr)
	}
}

func (r *relayer) close() { r.conns.Close() }

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

// replay is the request as the gateway sent it (sent), replayed to each
// cluster's EPP tried: as it is to the local one, and with forRemote's
// changes, made once (remoteMade), to remote ones.
type replay struct {
	sent, remote outbound
	remoteMade   bool
	// local names the local cluster, which remote EPPs learn relayed the
	// request.
	local string
	// filter says what of the request remote EPPs get.
	filter *remoteAnswers
}

// to is the request as c's EPP gets it. A message forRemote leaves as it
// is keeps the gateway's encoding.
func (r *replay) to(c *routetable.Cluster) outbound {
	if c.Local {
		return r.sent
	}
	if !r.remoteMade {
		r.remoteMade = true
		r.remote.msgs = forRemote(r.sent.msgs, r.local, r.filter)
		for i, m := range r.remote.msgs {
			if raw := r.sent.rawOf(i); raw != nil && m == r.sent.msgs[i] {
				if r.remote.raw == nil {
					r.remote.raw = make([][]byte, len(r.remote.msgs))
				}
				r.remote.raw[i] = raw
			}
		}
	}
	return r.remote
}

// forRemote returns msgs as a remote cluster's EPP is to get them: the
// headers filter strips (the client's credentials) taken out of the first
// message's headers and of the request's trailers; extproc.RelayedHeader, naming
// the local cluster, added to its headers; and each message without the
// attributes and metadata filter.message removes, such as the subset
// hint, which lists endpoints of the local pool that a remote EPP does
// not have and would answer with 503. msgs stay as they are, for the local
// EPP. Only the messages that lead to these changes are new; every other
// field is shared with the original: copying it whole (proto.Clone) costs
// an allocation per header, and a generic shallow copy (protoreflect)
// about as much time. TestForRemote fails when a field is left behind.
func forRemote(msgs []*extprocv3.ProcessingRequest, local string, filter *remoteAnswers) []*extprocv3.ProcessingRequest {
	if len(msgs) == 0 {
		return msgs
	}
	out := make([]*extprocv3.ProcessingRequest, len(msgs))
	for i, m := range msgs {
		out[i] = filter.message(m)
	}
	if h := msgs[0].GetRequestHeaders(); h != nil {
		first := out[0]
		if first == msgs[0] {
			first = &extprocv3.ProcessingRequest{
				MetadataContext:    first.MetadataContext,
				ObservabilityMode:  first.ObservabilityMode,
				ProtocolConfig:     first.ProtocolConfig,
				FlowControlInit:    first.FlowControlInit,
				ClientWindowUpdate: first.ClientWindowUpdate,
			}
			keepUnknown(first, msgs[0])
		}
		// Clipped, so that the append cannot write into the original's
		// array.
		hm := &corev3.HeaderMap{Headers: append(slices.Clip(filter.stripHeaders(h.GetHeaders().GetHeaders())),
			&corev3.HeaderValue{Key: extproc.RelayedHeader, RawValue: []byte(local)})}
		keepUnknown(hm, h.GetHeaders())
		headers := &extprocv3.HttpHeaders{Headers: hm, EndOfStream: h.EndOfStream}
		keepUnknown(headers, h)
		first.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers}
		out[0] = first
	}
	if last := out[len(out)-1]; len(out) > 1 && last.GetRequestTrailers() != nil {
		if tm := last.GetRequestTrailers().GetTrailers(); tm != nil {
			if kept := filter.stripHeaders(tm.GetHeaders()); len(kept) != len(tm.GetHeaders()) {
				out[len(out)-1] = trailersWith(last, kept)
			}
		}
	}
	return out
}

// trailersWith is the trailers message m with headers only.
func trailersWith(m *extprocv3.ProcessingRequest, headers []*corev3.HeaderValue) *extprocv3.ProcessingRequest {
	c := proto.Clone(m).(*extprocv3.ProcessingRequest)
	c.GetRequestTrailers().Trailers.Headers = headers
	return c
}

// keepUnknown gives dst the fields of src that this build does not know,
// such as a newer gateway's, so that the EPP still gets them.
func keepUnknown(dst, src proto.Message) {
	if u := src.ProtoReflect().GetUnknown(); len(u) > 0 {
		dst.ProtoReflect().SetUnknown(u)
	}
}

// relay replays the request to the EPP at addr and collects its whole
// answer to the request phase: the headers response (destination and
// mutations) and the streamed body, or an immediate response. Nothing is
// sent to the gateway until the answer is whole, so an EPP that fails at
// any point before can be replaced by the next cluster's. An immediate 503
// comes back as a *refusal error.
//
// With keep, the stream of an EPP that answered with a destination is
// returned open, for the response phase (relayResponse); without, it is
// ended with the request phase and the sidecar answers the response phase
// itself. A stream that answered with an immediate response, or failed, is
// reset, as a gateway resets it.
//
// limit, when above 0, bounds the body bytes the answer may stream back
// (a remote EPP's: eppanswer.BodyLimit); past it the answer is refused.
func (r *relayer) relay(ctx context.Context, addr string, msgs outbound, keep bool, limit int) ([]*extprocv3.ProcessingResponse, *responserelay.EPPStream, error) {
	conn, err := r.conn(addr)
	if err != nil {
		// Credentials that cannot be used fail the port, counted.
		r.creds.Failed(addr, err)
		return nil, nil, err
	}
	resps, kept, err := r.relayOn(ctx, conn, msgs, keep, limit)
	// A connection that failed (refused, reset, a failed TLS handshake, the
	// wrong transport) or an EPP that did not answer in time (a stalled or
	// blackholed link, on which the connection may never fail) is logged
	// once per change with the transport it was asked for, and counted.
	if status.Code(err) == codes.Unavailable || errors.Is(err, errAttemptTimeout) {
		r.creds.Failed(addr, err)
	} else if err == nil {
		r.creds.Reached(addr)
	}
	return resps, kept, err
}

func (r *relayer) relayOn(ctx context.Context, conn relayConn, msgs outbound, keep bool, limit int) ([]*extprocv3.ProcessingResponse, *responserelay.EPPStream, error) {
	a, err := r.open(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	a.send(r, msgs)
	resps, err := receive(a.stream, shapeOf(msgs.msgs), limit)
	if err == nil && resps[len(resps)-1].GetImmediateResponse() == nil {
		if keep {
			// The timer still bounds the sender, which may be blocked on
			// an EPP that answered without reading everything.
			a.decided(r, fateKeep)
			a.timer.Stop()
			return resps, responserelay.NewEPPStream(a.stream, a.ctx, a.cancel, a.unlink), nil
		}
		a.timer.Stop()
		a.decided(r, fateEnd)
		return resps, nil, nil
	}
	a.timer.Stop()
	// A gateway resets the stream once it has an immediate response. The
	// sender takes the news only once it has stopped sending msgs, which
	// the next cluster's stream sends again.
	a.cancel(nil)
	a.decided(r, fateReset)
	if err != nil {
		if errors.Is(context.Cause(a.ctx), errAttemptTimeout) {
			err = fmt.Errorf("%w: no answer within %v: %w", errAttemptTimeout, r.timeout, err)
		}
		return nil, nil, fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	if resps[0].GetImmediateResponse().GetStatus().GetCode() == http.StatusServiceUnavailable {
		return nil, nil, &refusal{resp: resps[0]}
	}
	return resps, nil, nil
}

// eppAttempt is the stream of one attempt at an EPP: its context (ctx,
// reset with cancel, unlinked from the gateway's stream with unlink), the
// timer that bounds it, and the sender's channel (next, nil when the
// request was sent whole at once).
type eppAttempt struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	ctx    context.Context
	cancel context.CancelCauseFunc
	unlink func() bool
	timer  *time.Timer
	next   chan streamFate
}

// open opens the EPP's stream for one attempt of the gateway's stream's
// request (parent).
func (r *relayer) open(parent context.Context, conn relayConn) (eppAttempt, error) {
	// The EPP's stream ends with the gateway's: linked to it rather than
	// derived from it, so that a response phase can let the EPP finish
	// answering what the gateway already had (responserelay.EPPStream).
	// Every way it ends cancels its context, with cancel: the stream is
	// counted from here until then (openStreams.opened).
	ctx, cancelCtx := context.WithCancelCause(context.WithoutCancel(parent))
	cancel := conn.streams.opened(cancelCtx)
	unlink := context.AfterFunc(parent, func() { cancel(context.Cause(parent)) })
	// One timer bounds the wait for the answer and then, re-armed, the
	// wait for the EPP to end its stream.
	timer := time.AfterFunc(r.timeout, func() { cancel(errAttemptTimeout) })
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		timer.Stop()
		cancel(nil)
		return eppAttempt{}, fmt.Errorf("%w: opening the stream: %w", errNoAnswer, err)
	}
	return eppAttempt{stream: stream, ctx: ctx, cancel: cancel, unlink: unlink, timer: timer}, nil
}

// send sends msgs. The sender runs beside the receiver, as in a gateway:
// an EPP may answer (an immediate response) before it has read the whole
// body. Once it has sent everything, it learns what becomes of the stream
// (decided); a kept stream is handed over only then, so that nothing else
// sends on it while the sender does. A request that can be sent whole
// without the EPP reading any of it, as most can, is sent first, on this
// goroutine: a goroutine of its own would cost more than sending.
func (a *eppAttempt) send(r *relayer, msgs outbound) {
	if sendsAtOnce(msgs) {
		send(a.stream, msgs)
		return
	}
	a.next = make(chan streamFate)
	stream, timer, cancel, next := a.stream, a.timer, a.cancel, a.next
	go func() {
		send(stream, msgs)
		r.settle(<-next, stream, timer, cancel)
	}()
}

// decided tells the sender what becomes of the stream, or settles an
// ended one itself when the request was sent at once.
func (a *eppAttempt) decided(r *relayer, fate streamFate) {
	switch {
	case a.next != nil:
		a.next <- fate
	case fate == fateEnd:
		go r.settle(fate, a.stream, a.timer, a.cancel)
	}
}

// sendAtOnceBytes bounds the encoded bytes of a request sent before its
// answer is read: far below the first flow-control window HTTP/2 gives a
// stream (65,535 bytes, whatever the EPP's settings) and gRPC's quota of
// bytes queued per stream (64 KiB), so that sending them never waits for
// the EPP to read.
const sendAtOnceBytes = 32 << 10

// sendsAtOnce says whether msgs fit in sendAtOnceBytes.
func sendsAtOnce(msgs outbound) bool {
	n := 0
	for i, m := range msgs.msgs {
		size := len(msgs.rawOf(i))
		if size == 0 {
			size = proto.Size(m)
		}
		if n += size + 5; n > sendAtOnceBytes {
			return false
		}
	}
	return true
}

// send sends msgs on stream, until one fails; the failure shows in what
// the stream then receives. A message with the gateway's encoding goes as
// a frame of those bytes (extproc.FrameCodec, the codec of the relay's
// connections).
func send(stream extprocv3.ExternalProcessor_ProcessClient, msgs outbound) {
	var f extproc.RequestFrame
	for i, m := range msgs.msgs {
		var err error
		if raw := msgs.rawOf(i); raw != nil {
			// SendMsg encodes f before it returns: f serves every message.
			f.ProcessingRequest, f.Raw = m, raw
			err = stream.SendMsg(&f)
		} else {
			err = stream.Send(m)
		}
		if err != nil {
			return
		}
	}
}

// settle ends an EPP's stream whose request phase was all (fateEnd), once
// the EPP has read the whole request: it ends our side and lets the EPP
// end its own, so that it sees a clean end of stream; one that lingers is
// reset. Other fates need nothing more.
func (r *relayer) settle(fate streamFate, stream extprocv3.ExternalProcessor_ProcessClient, timer *time.Timer, cancel context.CancelCauseFunc) {
	if fate != fateEnd {
		return
	}
	_ = stream.CloseSend()
	timer.Reset(r.linger)
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	timer.Stop()
	cancel(nil)
}

// streamFate is what becomes of an EPP's stream once the request phase is
// answered.
type streamFate int

const (
	// fateEnd: the request phase was all; the stream ends cleanly.
	fateEnd streamFate = iota
	// fateKeep: the stream stays open for the response phase.
	fateKeep
	// fateReset: the stream was reset (an immediate answer, a failure).
	fateReset
)

// receive reads an EPP's answer to the request phase: until the headers
// response and the whole body (and the trailers response for a request
// ended by trailers) are back, or an immediate response comes. limit, when
// above 0, bounds the body bytes streamed back, and the messages with
// them (an EPP that streams empty chunks without end).
func receive(stream extprocv3.ExternalProcessor_ProcessClient, s shape, limit int) ([]*extprocv3.ProcessingResponse, error) {
	// Room for the headers response, a body in one chunk and the trailers
	// response: the answer of nearly every request.
	resps := make([]*extprocv3.ProcessingResponse, 0, 3)
	gotHeaders, bodyDone, trailersDone := false, !s.hasBody, !s.endedByTrailers
	bodyBytes := 0
	for !gotHeaders || !bodyDone || !trailersDone {
		if limit > 0 && len(resps) > 16+limit/1024 {
			return nil, &eppanswer.Refusal{Reason: eppanswer.ReasonProtocol, Detail: fmt.Sprintf("more than %d messages in an answer", len(resps)-1)}
		}
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
			if bodyBytes += len(sr.GetBody()) + len(r.RequestBody.GetResponse().GetBodyMutation().GetBody()); limit > 0 && bodyBytes > limit {
				return nil, &eppanswer.Refusal{Reason: eppanswer.ReasonProtocol, Detail: fmt.Sprintf("more than %d body bytes in an answer", limit)}
			}
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
