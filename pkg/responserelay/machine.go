package responserelay

import (
	"bytes"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
)

// The response phase relayed to an EPP is a state machine: machine holds
// its state, step is its one transition function (an event in, the next
// state and the actions out), and phaseRelay carries the actions out on
// the streams and timers. Its events are the EPP protocol's: the gateway's
// response headers, body chunks and trailers; the EPP's answers to them
// (or an immediate response); the gateway's end of its side of the stream
// or its going away; the EPP's deadline and linger; and the sidecar taking
// over when the EPP cannot finish.
//
// What the EPP owes are answers to the messages relayed to it. When the
// EPP cannot answer them, the sidecar answers what the gateway still waits
// for (take over), in the order the protocol wants: headers, body,
// trailers. The EPP's answers are bounded in time (the deadline).
//
// With ahead (a streamed response body, under the Relay response phase),
// the gateway does not wait for the EPP's answers to body chunks: the
// sidecar answers each chunk itself as it arrives, unchanged, and relays
// it to the EPP all the same; the EPP's answers to chunks are checked
// against what the gateway got and not sent (late counts what could not be
// applied). Why: an upstream EPP reads a streamed response only to count
// it (usage, in-flight requests) and answers each chunk with the chunk
// unchanged, so waiting for its round trip per chunk slowed every token
// down by that round trip and by the EPP's own pace, for nothing. The
// answer to the response headers, which EPPs do mutate, and to the
// trailers are still the EPP's, and the gateway waits for them; so a
// chunk's answer never goes before the EPP's answer to the headers (held
// until then).

// phase is where a response phase relayed to an EPP stands.
type phase uint8

const (
	// relaying: the gateway's messages go to the EPP and its answers to the
	// gateway.
	relaying phase = iota
	// gatewayEnded: the gateway ended its side of the stream (a
	// half-close); the EPP's side is ended too, and the EPP has the linger
	// to answer what it owes and end its own.
	gatewayEnded
	// kept: the gateway went away after it had ended its side with every
	// answer it waits for, while the EPP still owed answers to chunks that
	// went ahead: the EPP's stream is kept for it to give them, within the
	// linger.
	kept
	// takenOver: the sidecar answers the gateway itself from now on.
	takenOver
	// answeredImmediately: the EPP answered with an immediate response,
	// which ends the exchange: nothing more goes either way.
	answeredImmediately
)

var phaseNames = [...]string{"relaying", "gatewayEnded", "kept", "takenOver", "answeredImmediately"}

func (p phase) String() string { return phaseNames[p] }

// eventKind is what happened.
type eventKind uint8

const (
	// gatewayMessage: a message of the gateway (event.msg): response
	// headers, a body chunk, trailers, or anything else (the EPP's to
	// refuse).
	gatewayMessage eventKind = iota
	// eppAnswer: an answer of the EPP (event.answer).
	eppAnswer
	// gatewayEOF: the gateway ended its side of the stream cleanly.
	gatewayEOF
	// gatewayGone: the gateway's stream ended (event.cause).
	gatewayGone
	// deadlineFired: the timer of the EPP's deadline fired.
	deadlineFired
	// lingerOver: the EPP did not end its stream within the linger after
	// the gateway ended its own.
	lingerOver
	// takeOver: the EPP cannot finish (it failed, did not answer in time,
	// or ended its stream): the sidecar answers what it owed and the rest.
	takeOver
)

// event is an input of step.
type event struct {
	kind   eventKind
	msg    *extprocv3.ProcessingRequest
	answer *extprocv3.ProcessingResponse
	cause  error
}

// action is what the relay is to do after a step, in this order.
type action uint8

const (
	// answerGateway: send the EPP's answer on to the gateway
	// (actions.answer: rebuilt, or nil for the answer as it came).
	answerGateway action = 1 << iota
	// replyGateway: send the sidecar's own answer to the gateway's
	// message (actions.reply).
	replyGateway
	// flushGateway: send answers the gateway waits for (actions.flush):
	// the answers to chunks held for the EPP's answer to the headers, or
	// what the EPP owed when the sidecar takes over.
	flushGateway
	// forwardEPP: send the gateway's message on to the EPP.
	forwardEPP
	// armDeadline: (re)arm the deadline's timer for actions.wait.
	armDeadline
	// endEPPSide: end the sidecar's side of the EPP's stream, and start
	// the linger.
	endEPPSide
	// resetEPP: reset the EPP's stream with actions.cause.
	resetEPP
)

// actions are the output of step: what to do (do), with what.
type actions struct {
	do     action
	answer *extprocv3.ProcessingResponse
	reply  *extprocv3.ProcessingResponse
	flush  []*extprocv3.ProcessingResponse
	wait   time.Duration
	cause  error
	// err: the gateway's message cannot be answered; the response phase
	// fails with it.
	err error
}

// bodyMode is how the response body goes: whole (BUFFERED and the like),
// in chunks each answered (STREAMED), or streamed both ways
// (FULL_DUPLEX_STREAMED: the EPP streams the body back rather than answer
// each chunk).
type bodyMode uint8

const (
	bodyWhole bodyMode = iota
	bodyStreamed
	bodyDuplex
)

func bodyModeOf(m filterv3.ProcessingMode_BodySendMode) bodyMode {
	switch m {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return bodyDuplex
	case filterv3.ProcessingMode_STREAMED:
		return bodyStreamed
	}
	return bodyWhole
}

// bodyEnd is how far the gateway's duplex response body went: open, ended
// by trailers, or ended with end_of_stream.
type bodyEnd uint8

const (
	bodyOpen bodyEnd = iota
	bodyEndedByTrailers
	bodyEnded
)

// owedAnswers counts the gateway's messages the EPP owes one answer each
// (chunks: body messages of the modes but duplex).
type owedAnswers struct {
	headers, chunks, trailers int
}

// machine is the state of a response phase relayed to an EPP.
type machine struct {
	// mode, ahead, remote and timeout are set once, by newMachine.
	mode bodyMode
	// ahead: body chunks go to the gateway without waiting for the EPP.
	ahead bool
	// remote: the EPP is a remote cluster's: what of its answers goes to
	// the gateway is eppanswer.ResponsePhase's.
	remote  bool
	timeout time.Duration
	// now is the clock (time.Now).
	now func() time.Time

	phase phase
	owed  owedAnswers
	// body holds the duplex body the gateway sent and the EPP has not
	// streamed back (the chunks' own bytes, not copies); bodyEnd says how
	// far the gateway's body went, echoEnded whether the EPP streamed its
	// end back.
	body      [][]byte
	bodyEnd   bodyEnd
	echoEnded bool
	// held are the sidecar's answers to body chunks that wait for the
	// EPP's answer to the response headers to reach the gateway.
	held []*extprocv3.ProcessingResponse
	// late counts the EPP's answers to chunks answered ahead that asked
	// for something the gateway could no longer get; lateWhat says what
	// the first one asked for.
	late     int
	lateWhat string
	// deadline is when the EPP must have answered something; zero while
	// it owes nothing it is waited for.
	deadline time.Time
}

// newMachine returns the state of a response phase announced by cfg, for
// an EPP that answered the request phase with resps. wantAhead says
// whether a streamed response body goes ahead of the EPP's answers.
func newMachine(cfg *extprocv3.ProtocolConfiguration, resps []*extprocv3.ProcessingResponse, wantAhead, remote bool, timeout time.Duration) machine {
	m := machine{mode: bodyModeOf(cfg.GetResponseBodyMode()), remote: remote, timeout: timeout, now: time.Now}
	for _, r := range resps {
		m.override(cfg, r)
	}
	// In the whole modes the body comes in one message: there is no pace
	// to keep, and the EPP may rewrite it.
	m.ahead = wantAhead && m.mode != bodyWhole
	return m
}

// override applies a processing mode override of the EPP the way a gateway
// does: Envoy ignores them when a body mode is FULL_DUPLEX_STREAMED (the
// ext_proc filter's allow_mode_override documentation). Only the response
// body mode matters here: the gateway's messages say the rest.
func (m *machine) override(cfg *extprocv3.ProtocolConfiguration, r *extprocv3.ProcessingResponse) {
	mo := r.GetModeOverride()
	if mo == nil || cfg.GetRequestBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || cfg.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return
	}
	m.mode = bodyModeOf(mo.GetResponseBodyMode())
}

// step is the transition function: it moves the machine by ev and returns
// what the relay is to do.
func (m *machine) step(ev event) actions {
	switch ev.kind {
	case gatewayMessage:
		return m.fromGateway(ev.msg)
	case eppAnswer:
		return m.fromEPP(ev.answer)
	case gatewayEOF:
		if m.phase == takenOver {
			return actions{}
		}
		if m.phase == relaying {
			m.phase = gatewayEnded
		}
		// The EPP sees a clean end of stream; one that lingers is reset.
		return actions{do: endEPPSide}
	case gatewayGone:
		// A gateway that had every answer it waits for may go away before
		// the EPP's answers to chunks that went ahead are back: the EPP
		// may still give them. Otherwise its stream goes with the
		// gateway's, as if the gateway had talked to it.
		if m.phase == gatewayEnded && m.gatewayServed() && m.owing() {
			m.phase = kept
			return actions{}
		}
		return actions{do: resetEPP, cause: ev.cause}
	case deadlineFired:
		return m.expire()
	case lingerOver:
		return actions{do: resetEPP, cause: errLinger}
	case takeOver:
		return m.takeOver()
	}
	return actions{}
}

// fromGateway notes a message of the gateway: owed by the EPP (forwarded),
// and, for a body chunk that goes ahead, answered (or held) at once; once
// the sidecar has taken over, answered at once and not forwarded.
func (m *machine) fromGateway(msg *extprocv3.ProcessingRequest) actions {
	switch m.phase {
	case answeredImmediately:
		return actions{}
	case takenOver:
		reply, err := m.passThrough(msg)
		if err != nil {
			return actions{err: err}
		}
		return actions{do: replyGateway, reply: reply}
	}
	a := actions{do: forwardEPP}
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		m.owed.headers++
	case *extprocv3.ProcessingRequest_ResponseBody:
		m.chunk(r.ResponseBody)
		if m.ahead {
			reply, err := m.passThrough(msg)
			if err != nil {
				return actions{err: err}
			}
			if m.owed.headers > 0 {
				m.held = append(m.held, reply)
			} else {
				a.do, a.reply = a.do|replyGateway, reply
			}
		}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		m.owed.trailers++
		if m.bodyEnd == bodyOpen {
			m.bodyEnd = bodyEndedByTrailers
		}
	}
	// Anything else is the EPP's to refuse, as it would be if the gateway
	// talked to it.
	if m.deadline.IsZero() && m.waited() {
		m.deadline = m.now().Add(m.timeout)
		a.do, a.wait = a.do|armDeadline, m.timeout
	}
	return a
}

// chunk notes a body chunk of the gateway: owed one answer, or, duplex, as
// bytes to stream back. Only a duplex body is owed as a whole.
func (m *machine) chunk(b *extprocv3.HttpBody) {
	if m.mode != bodyDuplex {
		m.owed.chunks++
		return
	}
	if len(b.GetBody()) > 0 {
		m.body = append(m.body, b.GetBody())
	}
	if b.GetEndOfStream() {
		m.bodyEnd = bodyEnded
	}
}

// passThrough is the sidecar's answer to msg: the message unchanged.
func (m *machine) passThrough(msg *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	resp, err := extproc.PassThrough(msg, m.protocol())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return resp, nil
}

// fromEPP notes an answer r of the EPP, which goes to the gateway but for
// an answer to a body chunk that went ahead, which is only checked against
// what the gateway got. An immediate response ends the exchange.
func (m *machine) fromEPP(r *extprocv3.ProcessingResponse) actions {
	a := actions{do: answerGateway}
	immediate := false
	switch rr := r.Response.(type) {
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		m.owed.headers = max(m.owed.headers-1, 0)
	case *extprocv3.ProcessingResponse_ResponseBody:
		if m.ahead {
			a.do = 0
		}
		m.bodyAnswered(rr.ResponseBody, r.GetDynamicMetadata() != nil)
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		m.owed.trailers = max(m.owed.trailers-1, 0)
		// The body is done with once its trailers are answered.
		m.body = nil
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		m.phase, immediate = answeredImmediately, true
	}
	// Progress: the EPP gets a new timeout for what it still owes.
	if m.waited() {
		m.deadline = m.now().Add(m.timeout)
	} else {
		m.deadline = time.Time{}
	}
	if a.do == 0 {
		return a
	}
	if m.remote {
		// The answer is the sidecar's: the message let through unchanged
		// (Run refused the answers that cannot be).
		if resp, err := eppanswer.ResponsePhase(r); err == nil {
			a.answer = resp
		}
	}
	if m.owed.headers == 0 && !immediate && len(m.held) > 0 {
		a.do, a.flush, m.held = a.do|flushGateway, m.held, nil
	}
	return a
}

// bodyAnswered notes the EPP's answer to body chunks: the bytes it streamed
// back (duplex) or one chunk answered; withMetadata: the answer sets
// dynamic metadata. For chunks that went ahead, an answer that asks for
// more than to let them through is late.
func (m *machine) bodyAnswered(r *extprocv3.BodyResponse, withMetadata bool) {
	sr := r.GetResponse().GetBodyMutation().GetStreamedResponse()
	agrees := true
	if m.mode == bodyDuplex && sr != nil {
		agrees = m.streamedBack(sr.GetBody(), sr.GetEndOfStream())
	} else {
		m.owed.chunks = max(m.owed.chunks-1, 0)
	}
	if !m.ahead {
		return
	}
	what := lateMutation(r, m.mode == bodyDuplex)
	switch {
	case what != "":
	case !agrees:
		what = "a rewritten body"
	case withMetadata:
		what = "dynamic metadata"
	}
	if what != "" {
		m.late++
		if m.lateWhat == "" {
			m.lateWhat = what
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
func (m *machine) streamedBack(b []byte, eos bool) (same bool) {
	same = true
	for len(b) > 0 && len(m.body) > 0 {
		n := min(len(b), len(m.body[0]))
		if !bytes.Equal(b[:n], m.body[0][:n]) {
			same = false
		}
		b = b[n:]
		if n < len(m.body[0]) {
			m.body[0] = m.body[0][n:]
			break
		}
		m.body = m.body[1:]
	}
	if len(b) > 0 || (eos && (len(m.body) > 0 || m.bodyEnd != bodyEnded)) {
		same = false
	}
	if eos {
		m.echoEnded, m.body = true, nil
	}
	return same
}

// expire resets the EPP's stream when its deadline has passed, and waits
// again when it moved.
func (m *machine) expire() actions {
	if m.deadline.IsZero() || m.phase == takenOver {
		return actions{}
	}
	if left := m.deadline.Sub(m.now()); left > 0 {
		return actions{do: armDeadline, wait: left}
	}
	return actions{do: resetEPP, cause: errResponseTimeout}
}

// takeOver answers what the gateway still waits for, in order, and makes
// the sidecar answer the gateway's messages from now on. Body chunks that
// went ahead are not answered again. (After an immediate response the
// gateway expects nothing more: the phase stays.)
func (m *machine) takeOver() actions {
	if m.phase != answeredImmediately {
		m.phase = takenOver
	}
	m.deadline = time.Time{}
	var resps []*extprocv3.ProcessingResponse
	for range m.owed.headers {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	}
	resps = append(resps, m.held...)
	if !m.ahead {
		resps = append(resps, m.owedBody()...)
	}
	for range m.owed.trailers {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	m.owed, m.body, m.held = owedAnswers{}, nil, nil
	m.echoEnded = m.bodyEnd == bodyEnded
	return actions{do: flushGateway, flush: resps}
}

// owedBody answers the body the EPP owes the gateway: one empty answer per
// chunk, or the duplex body it did not stream back.
func (m *machine) owedBody() []*extprocv3.ProcessingResponse {
	var resps []*extprocv3.ProcessingResponse
	for range m.owed.chunks {
		resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	}
	if len(m.body) > 0 || m.echoOwed() {
		var body []byte
		for _, b := range m.body {
			body = append(body, b...)
		}
		for _, r := range extproc.StreamedBody(body, m.bodyEnd == bodyEnded) {
			resps = append(resps, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: r.GetRequestBody()}})
		}
	}
	return resps
}

// echoOwed says whether the EPP owes the end of a duplex body it has not
// streamed back.
func (m *machine) echoOwed() bool { return m.bodyEnd == bodyEnded && !m.echoEnded }

// owing says whether the EPP owes any answer.
func (m *machine) owing() bool {
	return m.owed != owedAnswers{} || len(m.body) > 0 || m.echoOwed()
}

// waited says whether the EPP owes an answer it is given a time for. A
// duplex body is waited for only once the gateway's body has ended: an
// EPP may hold a body back until its end (to read the usage in it) while
// the model server is still generating it.
func (m *machine) waited() bool {
	return m.owed != owedAnswers{} || (m.bodyEnd != bodyOpen && (len(m.body) > 0 || m.echoOwed()))
}

// gatewayServed says whether the gateway ended its side of the stream with
// every answer it waits for given: what the EPP may still owe then
// (answers to chunks that went ahead) is the EPP's alone.
func (m *machine) gatewayServed() bool {
	if (m.phase != gatewayEnded && m.phase != kept) || m.owed.headers > 0 || m.owed.trailers > 0 || len(m.held) > 0 {
		return false
	}
	return m.ahead || (m.owed.chunks == 0 && len(m.body) == 0 && !m.echoOwed())
}

// protocol is the processing mode the sidecar answers in when it answers
// the gateway itself.
func (m *machine) protocol() *extprocv3.ProtocolConfiguration {
	if m.mode == bodyDuplex {
		return &extprocv3.ProtocolConfiguration{ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	}
	return nil
}
