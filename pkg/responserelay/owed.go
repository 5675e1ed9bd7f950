package responserelay

import (
	"bytes"
	"context"
	"io"
	"sync"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
)

// owed is what the EPP owes in the response phase: answers to the messages
// relayed to it. When the EPP cannot answer them, the sidecar answers what
// the gateway still waits for (takeOver), in the order the protocol wants:
// headers, body, trailers. It also bounds the EPP's answers in time
// (timeout).
//
// With ahead (ResponsePhaseRelay and a streamed response body), the
// gateway does not wait for the EPP's answers to body chunks: the sidecar
// answers each chunk itself as it arrives, unchanged, and relays it to the
// EPP all the same; the EPP's answers to chunks are checked against what
// the gateway got and not sent (late keeps what could not be applied). Why:
// an upstream EPP reads a streamed response only to count it (usage,
// in-flight requests) and answers each chunk with the chunk unchanged, so
// waiting for its round trip per chunk slowed every token down by that
// round trip and by the EPP's own pace, for nothing. The answer to the
// response headers, which EPPs do mutate, and to the trailers are still
// the EPP's, and the gateway waits for them; so a chunk's answer never
// goes before the EPP's answer to the headers (held until then).
type owed struct {
	mu sync.Mutex
	// duplex: the response body goes FULL_DUPLEX_STREAMED: the EPP streams
	// the body back rather than answering each chunk. streamed: it goes in
	// a streamed mode (STREAMED or FULL_DUPLEX_STREAMED).
	duplex, streamed bool
	// ahead: the sidecar answers body chunks itself (wantAhead) as they
	// come, when the body is streamed.
	ahead, wantAhead bool
	// headers, chunks and trailers count the messages owed one answer each
	// (chunks: body messages of the other body modes).
	headers, chunks, trailers int
	// body holds the duplex body the gateway sent and the EPP has not
	// streamed back (the chunks' own bytes, not copies); bodyEOS: the
	// gateway's body ended with end_of_stream; bodyClosed: it ended, by
	// end_of_stream or trailers; backEOS: the EPP streamed the end back.
	body                         [][]byte
	bodyEOS, bodyClosed, backEOS bool
	// held are the sidecar's answers to body chunks that wait for the
	// EPP's answer to the response headers to reach the gateway.
	held []*extprocv3.ProcessingResponse
	// late counts the EPP's answers to chunks answered ahead that asked
	// for something the gateway could no longer get; lateWhat says what
	// the first one asked for.
	late     int
	lateWhat string
	// remote: the EPP is a remote cluster's; what of its answers goes to
	// the gateway is eppanswer.ResponsePhase's, and what of the gateway's
	// messages goes to it is toRemote's.
	remote   bool
	toRemote func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest
	// takenOver: the sidecar answers the gateway from now on; ended: the
	// gateway got an immediate response and expects nothing more.
	takenOver, ended bool
	// gwEnded: the gateway ended its side of the stream; kept: when the
	// gateway's stream ended, it had every answer it waited for and the
	// EPP still owed answers to chunks that went ahead, so the EPP's
	// stream was kept (linkToGateway), decided once.
	gwEnded, kept bool

	// deadline is when the EPP must have answered something; zero while
	// it owes nothing it is waited for. timer checks it.
	timeout  time.Duration
	deadline time.Time
	timer    *time.Timer
	linger   *time.Timer
	cancel   context.CancelCauseFunc
}

// newOwed returns what the EPP will owe for a response phase announced by
// cfg and the EPP's answers resps to the request phase. ahead says whether
// a streamed response body goes ahead of the EPP's answers.
func newOwed(cfg *extprocv3.ProtocolConfiguration, resps []*extprocv3.ProcessingResponse, ahead bool, timeout time.Duration, cancel context.CancelCauseFunc) *owed {
	o := &owed{wantAhead: ahead, timeout: timeout, cancel: cancel}
	o.setMode(cfg.GetResponseBodyMode())
	o.timer = time.AfterFunc(timeout, o.expire)
	o.timer.Stop()
	for _, r := range resps {
		o.override(cfg, r)
	}
	return o
}

func (o *owed) setMode(m filterv3.ProcessingMode_BodySendMode) {
	o.duplex = m == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	o.streamed = o.duplex || m == filterv3.ProcessingMode_STREAMED
	// In the buffered modes the body comes whole, in one message: there is
	// no pace to keep, and the EPP may rewrite it.
	o.ahead = o.wantAhead && o.streamed
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
	o.setMode(mo.GetResponseBodyMode())
}

// pump relays the gateway's messages to the EPP until the gateway ends its
// stream, and answers them itself once the sidecar has taken over.
func (o *owed) pump(gw extproc.FrameStream, e *EPPStream, linger time.Duration) error {
	for {
		// Each message goes to the EPP as the gateway encoded it.
		f := extproc.NewRequestFrame()
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
			if o.toRemote != nil {
				if m := o.toRemote(f.ProcessingRequest); m != f.ProcessingRequest {
					f.ProcessingRequest, f.Raw = m, nil
				}
			}
			// A failed send shows in the receiver, which takes over; the
			// message is owed until then.
			_ = e.stream.SendMsg(f)
		}
	}
}

// fromGateway notes a message of the gateway: owed by the EPP (forward),
// and, for a body chunk that goes ahead, answered (or held) at once; once
// the sidecar has taken over, answered at once and not forwarded.
func (o *owed) fromGateway(msg *extprocv3.ProcessingRequest, gw extproc.Stream) (forward bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended {
		return false, nil
	}
	if o.takenOver {
		return false, o.passThrough(msg, gw)
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
		if o.ahead {
			if err := o.answerAhead(msg, gw); err != nil {
				return false, err
			}
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

// answerAhead answers a body chunk of the gateway unchanged, or holds the
// answer while the EPP's answer to the response headers has not gone to
// the gateway.
func (o *owed) answerAhead(msg *extprocv3.ProcessingRequest, gw extproc.Stream) error {
	resp, err := extproc.PassThrough(msg, o.protocol())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if o.headers > 0 {
		o.held = append(o.held, resp)
		return nil
	}
	return gw.Send(resp)
}

// passThrough answers a message of the gateway once the sidecar has taken
// over.
func (o *owed) passThrough(msg *extprocv3.ProcessingRequest, gw extproc.Stream) error {
	resp, err := extproc.PassThrough(msg, o.protocol())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return gw.Send(resp)
}

// fromEPP notes an answer f of the EPP and sends it to the gateway, but
// for an answer to a body chunk that went ahead, which is only checked
// against what the gateway got. It says whether f is an immediate
// response, which ends the exchange.
func (o *owed) fromEPP(f *extproc.ResponseFrame, gw extproc.FrameStream) (immediate bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	send := true
	switch r := f.Response.(type) {
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		o.headers = max(o.headers-1, 0)
	case *extprocv3.ProcessingResponse_ResponseBody:
		send = !o.ahead
		o.bodyAnswered(r.ResponseBody, f.GetDynamicMetadata() != nil)
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		o.trailers = max(o.trailers-1, 0)
		// The body is done with once its trailers are answered.
		o.body = nil
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		immediate, o.ended = true, true
	}
	// Progress: the EPP gets a new timeout for what it still owes.
	if o.waited() {
		o.deadline = time.Now().Add(o.timeout)
	} else {
		o.deadline = time.Time{}
	}
	if !send {
		return false, nil
	}
	if o.remote {
		// The answer is the sidecar's: the message let through unchanged
		// (relayResponse refused the answers that cannot be).
		if resp, err := eppanswer.ResponsePhase(f.ProcessingResponse); err == nil {
			f = &extproc.ResponseFrame{ProcessingResponse: resp}
		}
	}
	if err := gw.SendMsg(f); err != nil {
		return immediate, err
	}
	if o.headers == 0 && !immediate {
		return false, o.flushHeld(gw)
	}
	return immediate, nil
}

// flushHeld sends the answers to body chunks held for the EPP's answer to
// the response headers.
func (o *owed) flushHeld(gw extproc.Stream) error {
	held := o.held
	o.held = nil
	return extproc.SendAll(gw, held)
}

// bodyAnswered notes the EPP's answer to body chunks: the bytes it streamed
// back (duplex) or one chunk answered; withMetadata: the answer sets
// dynamic metadata. For chunks that went ahead, an answer that asks for
// more than to let them through is late.
func (o *owed) bodyAnswered(r *extprocv3.BodyResponse, withMetadata bool) {
	sr := r.GetResponse().GetBodyMutation().GetStreamedResponse()
	agrees := true
	if o.duplex && sr != nil {
		agrees = o.streamedBack(sr.GetBody(), sr.GetEndOfStream())
	} else {
		o.chunks = max(o.chunks-1, 0)
	}
	if !o.ahead {
		return
	}
	what := lateMutation(r, o.duplex)
	switch {
	case what != "":
	case !agrees:
		what = "a rewritten body"
	case withMetadata:
		what = "dynamic metadata"
	}
	if what != "" {
		o.late++
		if o.lateWhat == "" {
			o.lateWhat = what
		}
	}
}

// lateMutation says what an answer to a body chunk asks of the gateway
// beyond letting the chunk through ("" for nothing): a body chunk that
// went ahead cannot be changed any more, nor the headers that went before
// it. (A duplex body streamed back is compared by streamedBack.)
func lateMutation(r *extprocv3.BodyResponse, duplex bool) string {
	c := r.GetResponse()
	switch {
	case c == nil:
		return ""
	case len(c.GetHeaderMutation().GetSetHeaders()) > 0 || len(c.GetHeaderMutation().GetRemoveHeaders()) > 0:
		return "a header mutation"
	case c.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE:
		return "continue and replace"
	case c.GetTrailers() != nil:
		return "trailers"
	case c.GetBodyMutation() != nil && !(duplex && c.GetBodyMutation().GetStreamedResponse() != nil):
		return "a body mutation"
	}
	return ""
}

// streamedBack drops the bytes b the EPP streamed back from the body owed
// and says whether they are the bytes the gateway sent. An EPP that
// streams back more than it got (it rewrote the body) owes none.
func (o *owed) streamedBack(b []byte, eos bool) (same bool) {
	same = true
	for len(b) > 0 && len(o.body) > 0 {
		n := min(len(b), len(o.body[0]))
		if !bytes.Equal(b[:n], o.body[0][:n]) {
			same = false
		}
		b = b[n:]
		if n < len(o.body[0]) {
			o.body[0] = o.body[0][n:]
			break
		}
		o.body = o.body[1:]
	}
	if len(b) > 0 || (eos && (len(o.body) > 0 || !o.bodyEOS)) {
		same = false
	}
	if eos {
		o.backEOS, o.body = true, nil
	}
	return same
}

// gatewayServed says whether the gateway ended its side of the stream with
// every answer it waits for given: what the EPP may still owe then
// (answers to chunks that went ahead) is the EPP's alone.
func (o *owed) gatewayServed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.gwEnded || o.headers > 0 || o.trailers > 0 || len(o.held) > 0 {
		return false
	}
	return o.ahead || (o.chunks == 0 && len(o.body) == 0 && !(o.bodyEOS && !o.backEOS))
}

// keepForEPP decides, as the gateway's stream ends, whether the EPP's
// stream is kept: the gateway had every answer it waited for and the EPP
// still owes answers to chunks that went ahead.
func (o *owed) keepForEPP() bool {
	served := o.gatewayServed()
	owing := o.owing()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kept = served && owing
	return o.kept
}

// keptForEPP says whether keepForEPP kept the EPP's stream.
func (o *owed) keptForEPP() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.kept
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

// takeOver answers what the gateway still waits for, in order, and makes
// the sidecar answer the gateway's messages from now on. Body chunks that
// went ahead are not answered again.
func (o *owed) takeOver(gw extproc.Stream) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.takenOver = true
	o.deadline = time.Time{}
	var resps []*extprocv3.ProcessingResponse
	for range o.headers {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	}
	resps = append(resps, o.held...)
	if !o.ahead {
		resps = append(resps, o.owedBody()...)
	}
	for range o.trailers {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	o.headers, o.chunks, o.trailers, o.body, o.backEOS, o.held = 0, 0, 0, nil, o.bodyEOS, nil
	return extproc.SendAll(gw, resps)
}

// owedBody answers the body the EPP owes the gateway: one empty answer per
// chunk, or the duplex body it did not stream back.
func (o *owed) owedBody() []*extprocv3.ProcessingResponse {
	var resps []*extprocv3.ProcessingResponse
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
	return resps
}

// lateAnswers says how many answers of the EPP could not be applied, and
// what the first asked for.
func (o *owed) lateAnswers() (int, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.late, o.lateWhat
}

// protocol is the processing mode the sidecar answers in when it answers
// the gateway itself.
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
