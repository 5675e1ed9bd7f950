package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
)

// ResponsePhase says what the sidecar does with the response phase of a
// request that an EPP routed (EndpointMode).
type ResponsePhase string

const (
	// ResponsePhaseRelay keeps the stream of the EPP that picked the
	// endpoint open and relays the response phase to it, as if the gateway
	// talked to it directly: its in-flight counts, flow control and usage
	// accounting, and the served report, depend on it. The gateway waits
	// for the EPP's answers to the response headers and trailers; the
	// chunks of a streamed response body (STREAMED, FULL_DUPLEX_STREAMED)
	// go to the gateway at the model server's pace, unchanged, as they go
	// to the EPP (owed explains why). The default.
	ResponsePhaseRelay ResponsePhase = "Relay"
	// ResponsePhaseIntercept relays the response phase as Relay does, but
	// every body chunk too waits for the EPP's answer, which is what the
	// gateway gets: for an EPP that rewrites streamed response bodies.
	// Each chunk then costs a round trip to the EPP.
	ResponsePhaseIntercept ResponsePhase = "Intercept"
	// ResponsePhaseSkip ends the EPP's stream with the request phase; the
	// sidecar lets the response phase through itself. It saves the EPP a
	// hop per response message, and leaves EPPs blind to responses.
	ResponsePhaseSkip ResponsePhase = "Skip"
)

// ParseResponsePhase returns the ResponsePhase named s; "" is Relay.
func ParseResponsePhase(s string) (ResponsePhase, error) {
	switch p := ResponsePhase(s); p {
	case "":
		return ResponsePhaseRelay, nil
	case ResponsePhaseRelay, ResponsePhaseIntercept, ResponsePhaseSkip:
		return p, nil
	}
	return "", fmt.Errorf("unknown response phase %q: want %s, %s or %s", s, ResponsePhaseRelay, ResponsePhaseIntercept, ResponsePhaseSkip)
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
// unlink stops the gateway's end from resetting it, and says whether it
// had not yet.
type eppStream struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	ctx    context.Context
	cancel context.CancelCauseFunc
	unlink func() bool
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
	// A remote EPP's answers to the chunks of a streamed body never reach
	// the gateway (eppanswer.ResponsePhase): they go ahead, whatever
	// --epp-response-phase says.
	remote := !t.liveCluster.Local
	o := newOwed(cfg, resps, s.bodyAhead || remote, s.relay.timeout, e.cancel)
	o.remote = remote
	if remote {
		o.toRemote = s.remote.message
	}
	defer o.stop()
	defer e.cancel(nil)
	defer linkToGateway(gw, e, o)()
	toEPP := make(chan error, 1)
	s.workers.Go(func() { toEPP <- o.pump(gw, e, s.relay.linger) })

	outcome := ResponseCompleted
	defer func() { t.responsePhase(outcome, o) }()
	var err error
	for {
		// Each answer that goes to the gateway goes as the EPP encoded
		// it.
		f := extproc.NewResponseFrame()
		if err = e.stream.RecvMsg(f); err != nil {
			break
		}
		if remote {
			// An answer eppanswer refuses (an immediate response): the
			// sidecar answers the rest of the response phase itself, the
			// response unchanged.
			if err = eppanswer.CheckResponsePhase(f.ProcessingResponse); err != nil {
				s.remote.refused(t.liveCluster, err)
				break
			}
		}
		immediate, sendErr := o.fromEPP(f, gw)
		if sendErr != nil {
			outcome = ResponseCanceled
			e.cancel(sendErr)
			return sendErr
		}
		if immediate {
			// The gateway ends the exchange with an immediate response;
			// the sender ends when the gateway's stream does.
			outcome = ResponseImmediate
			return nil
		}
	}

	// What ended the EPP's stream: the gateway going away (linkToGateway),
	// or the EPP itself (its stream failed or ended, or it did not answer
	// in time: errResponseTimeout, errLinger).
	cause := context.Cause(e.ctx)
	eppStalled := errors.Is(cause, errResponseTimeout) || (errors.Is(cause, errLinger) && o.owing())
	if ctxErr := gw.Context().Err(); ctxErr != nil && !eppStalled && !o.keptForEPP() {
		// A gateway that had ended its side with every answer it waits for
		// given may reset the stream before the EPP's end of stream
		// reaches it (a slow link, a gateway that lingers less): the
		// response phase was complete all the same. Otherwise it went away
		// early. (An EPP that still owed answers to chunks that went ahead
		// had its stream kept (linkToGateway); one that stalled timed out
		// whenever the gateway went: both are decided below.)
		// The pump has ended or is ending with the gateway's stream.
		pumpErr := <-toEPP
		if !o.gatewayServed() {
			outcome = ResponseCanceled
		}
		if pumpErr != nil {
			return pumpErr
		}
		return status.FromContextError(ctxErr).Err()
	}
	var done bool
	if outcome, done, err = eppEnded(err, cause, o.owing()); done {
		// Whatever the gateway still sends passes through.
		o.takeOver(gw)
		return <-toEPP
	}
	// Noted before the gateway is answered: a gateway gone already does
	// not make the EPP's failure go unseen.
	t.takenOver(outcome, err)
	if err := o.takeOver(gw); err != nil {
		return err
	}
	e.cancel(errTakenOver)
	return <-toEPP
}

// eppEnded says how the response phase of an EPP whose stream ended (err
// from its receive, cause of its context) goes on while the gateway is
// there: done, when the EPP owes nothing (it may end its stream before the
// gateway does), or else the outcome of a phase the sidecar takes over,
// and why.
func eppEnded(err, cause error, owing bool) (outcome string, done bool, why error) {
	switch {
	case err == io.EOF || errors.Is(cause, errLinger):
		switch {
		case !owing:
			return ResponseCompleted, true, nil
		case err == io.EOF:
			return ResponseEnded, false, err
		}
		return ResponseTimeout, false, err
	case errors.Is(cause, errResponseTimeout):
		return ResponseTimeout, false, cause
	}
	return ResponseFailed, false, err
}

// linkToGateway makes the gateway's end of its stream reset the EPP's, as
// it would reset its own, unless the gateway had every answer it waits for
// and the EPP still owes answers to chunks that went ahead: a gateway may
// reset its stream as soon as it has the last chunk, before the EPP's
// answer to it is back, and the EPP may still give it, within the linger
// that bounds its stream once the gateway ended its side. It returns what
// undoes the link.
func linkToGateway(gw gatewayStream, e *eppStream, o *owed) (stop func() bool) {
	if !e.unlink() {
		// The gateway is gone already, and the EPP's stream with it.
		return func() bool { return false }
	}
	ctx := gw.Context()
	return context.AfterFunc(ctx, func() {
		if !o.keepForEPP() {
			e.cancel(context.Cause(ctx))
		}
	})
}
