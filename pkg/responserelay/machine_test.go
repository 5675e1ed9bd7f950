package responserelay

import (
	"errors"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Events of the transition table, as the EPP protocol has them.
var (
	gwEOF       = event{kind: gatewayEOF}
	errGone     = errors.New("the client went away")
	gwGone      = event{kind: gatewayGone, cause: errGone}
	deadline    = event{kind: deadlineFired}
	linger      = event{kind: lingerOver}
	sidecarTake = event{kind: takeOver}
	// otherMsg is a message the response phase does not expect: the
	// EPP's to refuse.
	otherMsg  = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}
	immediate = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{}}}
)

func gw(m *extprocv3.ProcessingRequest) event   { return event{kind: gatewayMessage, msg: m} }
func epp(r *extprocv3.ProcessingResponse) event { return event{kind: eppAnswer, answer: r} }

// doNames names the actions of a, in the order they are done.
func doNames(a actions) []string {
	names := []string{"answer", "reply", "flush", "forward", "arm", "endEPPSide", "reset"}
	var out []string
	for i, n := range names {
		if a.do&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// sent names what a sends the gateway of the sidecar's own (reply, flush),
// as describe does.
func sent(a actions) []string {
	var resps []*extprocv3.ProcessingResponse
	if a.do&replyGateway != 0 {
		resps = append(resps, a.reply)
	}
	if a.do&flushGateway != 0 {
		resps = append(resps, a.flush...)
	}
	return describe(resps)
}

// TestTransitions is the response phase's transition table: a machine
// brought to a state by the events before, one event, the state it moves
// to and what the relay then does.
func TestTransitions(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		cfg  *extprocv3.ProtocolConfiguration
		// ahead: body chunks go ahead of the EPP's answers (Relay).
		ahead  bool
		before []event
		// later: how long after the events before ev comes.
		later time.Duration
		ev    event
		// want is the phase after ev, wantDo the actions, wantSent what
		// of the sidecar's own goes to the gateway, wantCause the cause of
		// a reset.
		want      phase
		wantDo    []string
		wantSent  []string
		wantCause error
	}{
		// The gateway's messages, relaying.
		{name: "response headers: owed, forwarded, the EPP has the timeout to answer",
			cfg: duplexMode, ev: gw(gwHeaders), want: relaying, wantDo: []string{"forward", "arm"}},
		{name: "a chunk ahead after the headers were answered: answered at once and forwarded",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders), epp(eppHeaders)},
			ev: gw(gwChunk("tok", false)), want: relaying, wantDo: []string{"reply", "forward"}, wantSent: []string{"body:tok"}},
		{name: "a chunk ahead while the headers are owed: held, forwarded",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders)},
			ev: gw(gwChunk("tok", false)), want: relaying, wantDo: []string{"forward"}},
		{name: "a chunk not ahead (Intercept): forwarded, the open body not timed",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders)},
			ev: gw(gwChunk("tok", false)), want: relaying, wantDo: []string{"forward"}},
		{name: "the end of a duplex body: the EPP has the timeout to stream it back",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders), gw(gwChunk("tok", false))},
			ev: gw(gwChunk("", true)), want: relaying, wantDo: []string{"forward", "arm"}},
		{name: "a streamed chunk (not duplex): one answer owed, timed",
			cfg: streamedMode, before: []event{gw(gwHeaders), epp(eppHeaders)},
			ev: gw(gwChunk("tok", false)), want: relaying, wantDo: []string{"forward", "arm"}},
		{name: "trailers: owed, timed",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders), epp(eppHeaders)},
			ev: gw(gwTrailers), want: relaying, wantDo: []string{"forward", "arm"}},
		{name: "a message the phase does not expect: the EPP's to refuse",
			cfg: duplexMode, ev: gw(otherMsg), want: relaying, wantDo: []string{"forward"}},

		// The EPP's answers.
		{name: "the EPP answers the headers: the answer goes, then the chunks held for it",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders), gw(gwChunk("a", false)), gw(gwChunk("b", false))},
			ev: epp(eppHeaders), want: relaying, wantDo: []string{"answer", "flush"}, wantSent: []string{"body:a", "body:b"}},
		{name: "the EPP answers a chunk that went ahead: checked, not sent",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders), epp(eppHeaders), gw(gwChunk("a", true))},
			ev: epp(eppStreamedBack("a", true)), want: relaying},
		{name: "the EPP streams the body back (Intercept): it goes to the gateway",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders), gw(gwChunk("a", true))},
			ev: epp(eppStreamedBack("a", true)), want: relaying, wantDo: []string{"answer"}},
		{name: "the EPP answers with an immediate response: it goes, and ends the exchange",
			cfg: duplexMode, before: []event{gw(gwHeaders)},
			ev: epp(immediate), want: answeredImmediately, wantDo: []string{"answer"}},

		// End of stream.
		{name: "the gateway ends its side: so does the sidecar on the EPP's, the linger starts",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders)},
			ev: gwEOF, want: gatewayEnded, wantDo: []string{"endEPPSide"}},
		{name: "the gateway goes away while relaying: the EPP's stream goes with it",
			cfg: duplexMode, before: []event{gw(gwHeaders)},
			ev: gwGone, want: relaying, wantDo: []string{"reset"}, wantCause: errGone},
		{name: "the gateway goes away served, the EPP owing chunks that went ahead: the EPP's stream is kept",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders), epp(eppHeaders), gw(gwChunk("a", true)), gwEOF},
			ev: gwGone, want: kept},
		{name: "the gateway goes away waiting for an answer: the EPP's stream goes with it",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders), gw(gwChunk("a", true)), gwEOF},
			ev: gwGone, want: gatewayEnded, wantDo: []string{"reset"}, wantCause: errGone},
		{name: "the gateway goes away with nothing owed: the EPP's stream goes with it",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders), gwEOF},
			ev: gwGone, want: gatewayEnded, wantDo: []string{"reset"}, wantCause: errGone},
		{name: "the EPP does not end its stream within the linger: reset",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders), gwEOF},
			ev: linger, want: gatewayEnded, wantDo: []string{"reset"}, wantCause: errLinger},

		// Timeouts.
		{name: "the deadline with nothing owed: nothing",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders)},
			later: time.Hour, ev: deadline, want: relaying},
		{name: "the deadline passed with an answer owed: the EPP's stream is reset",
			cfg: duplexMode, before: []event{gw(gwHeaders)},
			later: time.Minute, ev: deadline, want: relaying, wantDo: []string{"reset"}, wantCause: errResponseTimeout},
		{name: "the deadline not yet passed: the timer waits again",
			cfg: duplexMode, before: []event{gw(gwHeaders)},
			later: time.Second, ev: deadline, want: relaying, wantDo: []string{"arm"}},

		// The sidecar takes over (errors: the EPP failed, timed out, or
		// ended its stream owing answers).
		{name: "take over: the headers, the chunks held, the trailers, in order",
			cfg: duplexMode, ahead: true, before: []event{gw(gwHeaders), gw(gwChunk("a", false)), gw(gwTrailers)},
			ev: sidecarTake, want: takenOver, wantDo: []string{"flush"}, wantSent: []string{"headers", "body:a", "trailers"}},
		{name: "take over (Intercept): the body the EPP did not stream back",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(eppHeaders), gw(gwChunk("abc", true)), epp(eppStreamedBack("a", false))},
			ev: sidecarTake, want: takenOver, wantDo: []string{"flush"}, wantSent: []string{"body:bc:eos"}},
		{name: "taken over: the gateway's messages are answered by the sidecar, not forwarded",
			cfg: duplexMode, before: []event{gw(gwHeaders), sidecarTake},
			ev: gw(gwTrailers), want: takenOver, wantDo: []string{"reply"}, wantSent: []string{"trailers"}},
		{name: "taken over: the gateway's end needs nothing of the EPP",
			cfg: duplexMode, before: []event{gw(gwHeaders), sidecarTake},
			ev: gwEOF, want: takenOver},
		{name: "taken over: no deadline",
			cfg: duplexMode, before: []event{gw(gwHeaders), sidecarTake},
			later: time.Hour, ev: deadline, want: takenOver},

		// After an immediate response.
		{name: "answered immediately: the gateway's messages go nowhere",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(immediate)},
			ev: gw(gwTrailers), want: answeredImmediately},
		{name: "answered immediately: the gateway's end ends the EPP's side",
			cfg: duplexMode, before: []event{gw(gwHeaders), epp(immediate)},
			ev: gwEOF, want: answeredImmediately, wantDo: []string{"endEPPSide"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := start
			m := newMachine(tt.cfg, nil, tt.ahead, false, time.Minute)
			m.now = func() time.Time { return now }
			for _, ev := range tt.before {
				require.NoError(t, m.step(ev).err)
			}
			now = now.Add(tt.later)
			a := m.step(tt.ev)
			require.NoError(t, a.err)
			assert.Equal(t, tt.want, m.phase, "phase")
			assert.Equal(t, tt.wantDo, doNames(a), "actions")
			assert.Equal(t, tt.wantSent, sent(a), "sent to the gateway")
			assert.Equal(t, tt.wantCause, a.cause, "cause of the reset")
		})
	}
}
