package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/extproc"
)

// ResponsePhase says what the sidecar does with the response phase of a
// request that an EPP routed (EndpointMode).
type ResponsePhase string

const (
	// ResponsePhaseRelay keeps the stream of the EPP that picked the
	// endpoint open and relays the response phase to it, as if the gateway
	// talked to it directly: its in-flight counts, flow control and usage
	// accounting, and the served report, depend on it. The default.
	ResponsePhaseRelay ResponsePhase = "Relay"
	// ResponsePhaseSkip ends the EPP's stream with the request phase; the
	// sidecar lets the response phase through itself. It saves the EPP a
	// hop per response message, and leaves EPPs blind to responses.
	ResponsePhaseSkip ResponsePhase = "Skip"
)

// ParseResponsePhase returns the ResponsePhase named s; "" is Relay.
func ParseResponsePhase(s string) (ResponsePhase, error) {
	switch ResponsePhase(s) {
	case "", ResponsePhaseRelay:
		return ResponsePhaseRelay, nil
	case ResponsePhaseSkip:
		return ResponsePhaseSkip, nil
	}
	return "", fmt.Errorf("unknown response phase %q: want %s or %s", s, ResponsePhaseRelay, ResponsePhaseSkip)
}

// Outcomes of a response phase relayed to an EPP, the outcome label of
// mci_sidecar_epp_response_phase_total. For the last three the sidecar
// answered what the EPP still owed, and the rest of the response phase,
// itself, letting the response through unchanged: the user's response goes
// on, only the EPP misses its end.
const (
	// ResponseCompleted: the EPP answered the whole response phase.
	ResponseCompleted = "completed"
	// ResponseCanceled: the gateway ended the stream early (the client
	// went away, a timeout); the EPP's stream was reset with it, as the
	// gateway's own would have been.
	ResponseCanceled = "canceled"
	// ResponseImmediate: the EPP answered the response phase with an
	// immediate response, which went to the gateway.
	ResponseImmediate = "immediate"
	// ResponseFailed: the EPP's stream failed in the response phase.
	ResponseFailed = "failed"
	// ResponseTimeout: the EPP did not answer a response message within
	// the attempt timeout.
	ResponseTimeout = "timeout"
	// ResponseEnded: the EPP ended its stream while it owed answers.
	ResponseEnded = "ended"
)

var (
	// errTakenOver ends the stream of an EPP whose response phase the
	// sidecar answers itself.
	errTakenOver = errors.New("the sidecar answers the rest of the response phase")
	// errResponseTimeout ends the stream of an EPP that did not answer a
	// response message in time.
	errResponseTimeout = errors.New("no answer to a response message in time")
	// errLinger ends the stream of an EPP that did not end it after the
	// gateway ended its own.
	errLinger = errors.New("the EPP did not end its stream after the gateway")
)

// eppStream is the open stream of the EPP that answered the request phase,
// kept for the response phase. cancel resets it; ctx carries the cause.
type eppStream struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// relayResponse relays the response phase of the gateway's stream gw, whose
// processing mode cfg announced, to the EPP that routed the request (t's
// live stream), which answered the request phase with resps, and the EPP's
// answers back, message by message in both directions, until both sides
// have ended their streams. It returns what the gateway's stream ends
// with; t learns how the response phase ended.
//
// Two goroutines share the work: this one relays the EPP's answers to the
// gateway, a second one the gateway's messages to the EPP. When the EPP
// cannot finish (it fails, does not answer in time, or ends its stream with
// answers owed), the sidecar answers what it owed and the rest of the
// response phase itself, as ResponsePhaseSkip would: a response already
// served is not failed because its EPP failed.
func (s *Server) relayResponse(gw gatewayStream, t *tracker, cfg *extprocv3.ProtocolConfiguration, resps []*extprocv3.ProcessingResponse) error {
	e := t.live
	o := newOwed(cfg, resps, s.relay.timeout, e.cancel)
	defer o.stop()
	defer e.cancel(nil)
	toEPP := make(chan error, 1)
	go func() { toEPP <- o.pump(gw, e, s.relay.linger) }()

	outcome := ResponseCompleted
	defer func() { t.responsePhase(outcome) }()
	var err error
	for {
		// Each answer goes to the gateway as the EPP encoded it.
		f := newResponseFrame()
		if err = e.stream.RecvMsg(f); err != nil {
			break
		}
		immediate := o.fromEPP(f.ProcessingResponse)
		if err := gw.SendMsg(f); err != nil {
			outcome = ResponseCanceled
			e.cancel(err)
			return err
		}
		if immediate {
			// The gateway ends the exchange with an immediate response;
			// the sender ends when the gateway's stream does.
			outcome = ResponseImmediate
			return nil
		}
	}

	if ctxErr := gw.Context().Err(); ctxErr != nil {
		// A gateway that had ended its side with every answer given may
		// reset the stream before the EPP's end of stream reaches it (a
		// slow link, a gateway that lingers less): the response phase was
		// complete all the same.
		// The pump has ended or is ending with the gateway's stream.
		pumpErr := <-toEPP
		if !o.gatewayDone() {
			outcome = ResponseCanceled
		}
		if pumpErr != nil {
			return pumpErr
		}
		return status.FromContextError(ctxErr).Err()
	}
	cause := context.Cause(e.ctx)
	switch {
	case err == io.EOF || errors.Is(cause, errLinger):
		if !o.owing() {
			// The EPP is done (it may end its stream before the gateway
			// does); whatever the gateway still sends passes through.
			o.takeOver(gw)
			return <-toEPP
		}
		outcome = ResponseEnded
		if err != io.EOF {
			outcome = ResponseTimeout
		}
	case errors.Is(cause, errResponseTimeout):
		outcome, err = ResponseTimeout, cause
	default:
		outcome = ResponseFailed
	}
	if err := o.takeOver(gw); err != nil {
		return err
	}
	e.cancel(errTakenOver)
	t.takenOver(outcome, err)
	return <-toEPP
}

// owed is what the EPP owes the gateway in the response phase: answers to
// the messages relayed to it. When the EPP cannot answer them, the sidecar
// does (takeOver), in the order the protocol wants: headers, body,
// trailers. It also bounds the EPP's answers in time (timeout).
type owed struct {
	mu sync.Mutex
	// duplex: the response body goes FULL_DUPLEX_STREAMED: the EPP streams
	// the body back rather than answering each chunk.
	duplex bool
	// headers, chunks and trailers count the messages owed one answer each
	// (chunks: body messages of the other body modes).
	headers, chunks, trailers int
	// body holds the duplex body the gateway sent and the EPP has not
	// streamed back (the chunks' own bytes, not copies); bodyEOS: the
	// gateway's body ended with end_of_stream; bodyClosed: it ended, by
	// end_of_stream or trailers; backEOS: the EPP streamed the end back.
	body                         [][]byte
	bodyEOS, bodyClosed, backEOS bool
	// takenOver: the sidecar answers the gateway from now on.
	takenOver bool
	// gwEnded: the gateway ended its side of the stream.
	gwEnded bool

	// deadline is when the EPP must have answered something; zero while
	// it owes nothing it is waited for. timer checks it.
	timeout  time.Duration
	deadline time.Time
	timer    *time.Timer
	linger   *time.Timer
	cancel   context.CancelCauseFunc
}

func newOwed(cfg *extprocv3.ProtocolConfiguration, resps []*extprocv3.ProcessingResponse, timeout time.Duration, cancel context.CancelCauseFunc) *owed {
	o := &owed{duplex: cfg.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, timeout: timeout, cancel: cancel}
	o.timer = time.AfterFunc(timeout, o.expire)
	o.timer.Stop()
	for _, r := range resps {
		o.override(cfg, r)
	}
	return o
}

// override applies a processing mode override of the EPP the way a gateway
// does: Envoy ignores them when a body mode is FULL_DUPLEX_STREAMED (the
// ext_proc filter's allow_mode_override documentation). Only the response
// body mode matters here: the gateway's messages say the rest.
func (o *owed) override(cfg *extprocv3.ProtocolConfiguration, r *extprocv3.ProcessingResponse) {
	mo := r.GetModeOverride()
	if mo == nil || cfg.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || cfg.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return
	}
	o.duplex = mo.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// pump relays the gateway's messages to the EPP until the gateway ends its
// stream, and answers them itself once the sidecar has taken over.
func (o *owed) pump(gw gatewayStream, e *eppStream, linger time.Duration) error {
	for {
		// Each message goes to the EPP as the gateway encoded it.
		f := newRequestFrame()
		err := gw.RecvMsg(f)
		if err == io.EOF {
			o.mu.Lock()
			o.gwEnded = true
			if !o.takenOver {
				// End our side and let the EPP end its own, so that it
				// sees a clean end of stream; one that lingers is reset.
				_ = e.stream.CloseSend()
				o.linger = time.AfterFunc(linger, func() { o.cancel(errLinger) })
			}
			o.mu.Unlock()
			return nil
		}
		if err != nil {
			// The gateway went away: so does the EPP's stream, as it
			// would if the gateway had talked to it.
			e.cancel(err)
			return err
		}
		forward, err := o.fromGateway(f.ProcessingRequest, gw)
		if err != nil {
			e.cancel(err)
			return err
		}
		if forward {
			// A failed send shows in the receiver, which takes over; the
			// message is owed until then.
			_ = e.stream.SendMsg(f)
		}
	}
}

// fromGateway notes a message of the gateway: owed by the EPP (forward),
// or, once the sidecar has taken over, answered at once.
func (o *owed) fromGateway(msg *extprocv3.ProcessingRequest, gw extproc.Stream) (forward bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.takenOver {
		resp, err := extproc.PassThrough(msg, o.protocol())
		if err != nil {
			return false, status.Error(codes.InvalidArgument, err.Error())
		}
		return false, gw.Send(resp)
	}
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		o.headers++
	case *extprocv3.ProcessingRequest_ResponseBody:
		switch {
		case !o.duplex:
			o.chunks++
		case len(r.ResponseBody.GetBody()) > 0:
			o.body = append(o.body, r.ResponseBody.GetBody())
		}
		if o.duplex && r.ResponseBody.GetEndOfStream() {
			// Only a streamed body is owed as a whole; other modes owe
			// one answer per chunk.
			o.bodyEOS, o.bodyClosed = true, true
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		o.trailers++
		o.bodyClosed = true
	}
	// Anything else is the EPP's to refuse, as it would be if the gateway
	// talked to it.
	if o.deadline.IsZero() && o.waited() {
		o.deadline = time.Now().Add(o.timeout)
		o.timer.Reset(o.timeout)
	}
	return true, nil
}

// fromEPP notes an answer of the EPP and says whether it is an immediate
// response.
func (o *owed) fromEPP(resp *extprocv3.ProcessingResponse) (immediate bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch r := resp.Response.(type) {
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		o.headers = max(o.headers-1, 0)
	case *extprocv3.ProcessingResponse_ResponseBody:
		if sr := r.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse(); o.duplex && sr != nil {
			o.streamedBack(len(sr.GetBody()), sr.GetEndOfStream())
		} else {
			o.chunks = max(o.chunks-1, 0)
		}
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		o.trailers = max(o.trailers-1, 0)
		// The body is done with once its trailers are answered.
		o.body = nil
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		immediate = true
	}
	// Progress: the EPP gets a new timeout for what it still owes.
	if o.waited() {
		o.deadline = time.Now().Add(o.timeout)
	} else {
		o.deadline = time.Time{}
	}
	return immediate
}

// streamedBack drops n bytes the EPP streamed back from the body owed. An
// EPP that streams back more than it got (it rewrote the body) owes none.
func (o *owed) streamedBack(n int, eos bool) {
	for n > 0 && len(o.body) > 0 {
		if n < len(o.body[0]) {
			o.body[0] = o.body[0][n:]
			break
		}
		n -= len(o.body[0])
		o.body = o.body[1:]
	}
	if eos {
		o.backEOS, o.body = true, nil
	}
}

// gatewayDone says whether the gateway ended its side of the stream with
// every answer owed to it given.
func (o *owed) gatewayDone() bool {
	o.mu.Lock()
	ended := o.gwEnded
	o.mu.Unlock()
	return ended && !o.owing()
}

// owing says whether the EPP owes any answer.
func (o *owed) owing() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.headers > 0 || o.chunks > 0 || o.trailers > 0 || len(o.body) > 0 || (o.bodyEOS && !o.backEOS)
}

// waited says whether the EPP owes an answer it is given a time for. A
// duplex body is waited for only once the gateway's body has ended: an
// EPP may hold a body back until its end (to read the usage in it) while
// the model server is still generating it.
func (o *owed) waited() bool {
	return o.headers > 0 || o.chunks > 0 || o.trailers > 0 ||
		(o.bodyClosed && (len(o.body) > 0 || (o.bodyEOS && !o.backEOS)))
}

// expire resets the EPP's stream when its deadline has passed.
func (o *owed) expire() {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.deadline.IsZero() || o.takenOver:
	case time.Now().Before(o.deadline):
		o.timer.Reset(time.Until(o.deadline))
	default:
		o.cancel(errResponseTimeout)
	}
}

// takeOver answers what the EPP owes, in order, and makes the sidecar
// answer the gateway's messages from now on.
func (o *owed) takeOver(gw extproc.Stream) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.takenOver = true
	o.deadline = time.Time{}
	var resps []*extprocv3.ProcessingResponse
	for range o.headers {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	}
	for range o.chunks {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	}
	if len(o.body) > 0 || (o.bodyEOS && !o.backEOS) {
		var body []byte
		for _, b := range o.body {
			body = append(body, b...)
		}
		for _, r := range extproc.StreamedBody(body, o.bodyEOS) {
			resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: r.GetRequestBody()}})
		}
	}
	for range o.trailers {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	o.headers, o.chunks, o.trailers, o.body, o.backEOS = 0, 0, 0, nil, o.bodyEOS
	return extproc.SendAll(gw, resps)
}

// protocol is the processing mode the sidecar answers in once it has taken
// over.
func (o *owed) protocol() *extprocv3.ProtocolConfiguration {
	if o.duplex {
		return &extprocv3.ProtocolConfiguration{ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	}
	return nil
}

// stop stops the timers.
func (o *owed) stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.timer.Stop()
	if o.linger != nil {
		o.linger.Stop()
	}
}
