// Package responserelay relays the response phase of a request to the EPP
// that routed it, as if the gateway talked to the EPP directly: the
// gateway's response headers, body and trailers go to the EPP, and its
// answers back to the gateway, message by message, until both sides have
// ended their streams. When the EPP cannot finish (it fails, does not
// answer in time, or ends its stream with answers owed), the sidecar
// answers what the EPP owed and the rest of the response phase itself: a
// response already served is not failed because its EPP failed.
package responserelay

import (
	"context"
	"errors"
	"io"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
)

// Outcomes of a response phase relayed to an EPP, the outcome label of
// mci_sidecar_epp_response_phase_total. For the last three the sidecar
// answered what the EPP still owed, and the rest of the response phase,
// itself, letting the response through unchanged: the user's response goes
// on, only the EPP misses its end.
const (
	// Completed: the EPP answered the whole response phase.
	Completed = "completed"
	// Canceled: the gateway ended the stream early (the client
	// went away, a timeout); the EPP's stream was reset with it, as the
	// gateway's own would have been.
	Canceled = "canceled"
	// Immediate: the EPP answered the response phase with an
	// immediate response, which went to the gateway.
	Immediate = "immediate"
	// Failed: the EPP's stream failed in the response phase.
	Failed = "failed"
	// Timeout: the EPP did not answer a response message within
	// the attempt timeout.
	Timeout = "timeout"
	// Ended: the EPP ended its stream while it owed answers.
	Ended = "ended"
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

// EPPStream is the open stream of the EPP that answered the request
// phase, kept for the response phase. cancel resets it; ctx carries the
// cause. unlink stops the gateway's end from resetting it, and says
// whether it had not yet.
type EPPStream struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	ctx    context.Context
	cancel context.CancelCauseFunc
	unlink func() bool
}

// NewEPPStream is stream, kept for the response phase: ctx is its context,
// cancel resets it, and unlink stops the gateway's end from resetting it
// (saying whether it had not yet).
func NewEPPStream(stream extprocv3.ExternalProcessor_ProcessClient, ctx context.Context, cancel context.CancelCauseFunc, unlink func() bool) *EPPStream {
	return &EPPStream{stream: stream, ctx: ctx, cancel: cancel, unlink: unlink}
}

// Reset resets the EPP's stream with cause.
func (e *EPPStream) Reset(cause error) { e.cancel(cause) }

// Config is how a response phase is relayed.
type Config struct {
	// Protocol is the processing mode the gateway announced, and Answers
	// the EPP's answers to the request phase (their mode overrides).
	Protocol *extprocv3.ProtocolConfiguration
	Answers  []*extprocv3.ProcessingResponse
	// Ahead: the chunks of a streamed response body go to the gateway
	// without waiting for the EPP's answers (machine.go explains why).
	Ahead bool
	// Remote: the EPP is a remote cluster's: what of its answers goes to
	// the gateway is eppanswer.ResponsePhase's, and what of the gateway's
	// messages goes to it is ToRemote's (nil: all of them).
	Remote   bool
	ToRemote func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest
	// Timeout bounds the wait for each answer the gateway waits for, and
	// Linger the wait for the EPP's end of stream once the gateway ended
	// its own.
	Timeout, Linger time.Duration
	// Workers run the goroutine that relays the gateway's messages to the
	// EPP.
	Workers interface{ Go(func()) }
}

// Observer learns what happens to a response phase as it goes.
type Observer interface {
	// TakenOver: the EPP did not see the response phase through (outcome,
	// and why), and the sidecar answers the rest itself. Told before the
	// gateway is answered: a gateway gone already does not make the EPP's
	// failure go unseen.
	TakenOver(outcome string, why error)
}

// Result is how a response phase ended: its outcome; the EPP's answers to
// body chunks that went ahead which the gateway could not apply any more
// (Late, and what the first one asked for); and the answer of a remote
// EPP that was refused (Refused, an eppanswer.Refusal), after which the
// sidecar answered the rest itself.
type Result struct {
	Outcome  string
	Late     int
	LateWhat string
	Refused  error
}

// Run relays the response phase of the gateway's stream gw to the EPP that
// routed the request (its stream e), and the EPP's answers back, message by
// message in both directions, until both sides have ended their streams.
// It returns how the response phase ended, and what the gateway's stream
// ends with.
//
// Two goroutines share the work: this one relays the EPP's answers to the
// gateway, a second one (cfg.Workers) the gateway's messages to the EPP. When
// the EPP cannot finish (it fails, does not answer in time, or ends its
// stream with answers owed), the sidecar answers what it owed and the rest
// of the response phase itself, as if the response phase were not relayed.
func Run(gw extproc.FrameStream, e *EPPStream, cfg Config, obs Observer) (res Result, err error) {
	o := newPhaseRelay(cfg, e.stream, e.cancel)
	defer o.stop()
	defer e.cancel(nil)
	defer linkToGateway(gw, e, o)()
	toEPP := make(chan error, 1)
	cfg.Workers.Go(func() { toEPP <- o.pump(gw, e) })

	res.Outcome = Completed
	defer func() { res.Late, res.LateWhat = o.lateAnswers() }()
	recvErr, ended, err := relayAnswers(gw, e, cfg, o, &res)
	if ended {
		return res, err
	}
	err = afterEPPEnded(gw, e, o, obs, toEPP, recvErr, &res)
	return res, err
}

// relayAnswers relays the EPP's answers to the gateway until the EPP's
// stream ends (recvErr: its receive's error, or the refusal of a remote
// EPP's answer), or the response phase ends here (ended: an answer could
// not be sent, err, or it was an immediate response).
func relayAnswers(gw extproc.FrameStream, e *EPPStream, cfg Config, o *phaseRelay, res *Result) (recvErr error, ended bool, err error) {
	for {
		// Each answer that goes to the gateway goes as the EPP encoded
		// it.
		f := extproc.NewResponseFrame()
		if recvErr = e.stream.RecvMsg(f); recvErr != nil {
			return recvErr, false, nil
		}
		if cfg.Remote {
			// An answer eppanswer refuses (an immediate response): the
			// sidecar answers the rest of the response phase itself, the
			// response unchanged.
			if recvErr = eppanswer.CheckResponsePhase(f.ProcessingResponse); recvErr != nil {
				res.Refused = recvErr
				return recvErr, false, nil
			}
		}
		immediate, sendErr := o.fromEPP(f, gw)
		if sendErr != nil {
			res.Outcome = Canceled
			e.cancel(sendErr)
			return nil, true, sendErr
		}
		if immediate {
			// The gateway ends the exchange with an immediate response;
			// the sender ends when the gateway's stream does.
			res.Outcome = Immediate
			return nil, true, nil
		}
	}
}

// afterEPPEnded sees the response phase through once the EPP's stream
// ended (recvErr, relayAnswers'), and returns what the gateway's stream
// ends with. toEPP is the pump's result.
func afterEPPEnded(gw extproc.FrameStream, e *EPPStream, o *phaseRelay, obs Observer, toEPP <-chan error, recvErr error, res *Result) error {
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
			res.Outcome = Canceled
		}
		if pumpErr != nil {
			return pumpErr
		}
		return status.FromContextError(ctxErr).Err()
	}
	outcome, done, why := eppEnded(recvErr, cause, o.owing())
	res.Outcome = outcome
	if done {
		// Whatever the gateway still sends passes through.
		o.takeOver(gw)
		return <-toEPP
	}
	obs.TakenOver(outcome, why)
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
			return Completed, true, nil
		case err == io.EOF:
			return Ended, false, err
		}
		return Timeout, false, err
	case errors.Is(cause, errResponseTimeout):
		return Timeout, false, cause
	}
	return Failed, false, err
}

// linkToGateway makes the gateway's end of its stream reset the EPP's, as
// it would reset its own, unless the machine keeps it (the kept phase). It
// returns what undoes the link.
func linkToGateway(gw extproc.FrameStream, e *EPPStream, o *phaseRelay) (stop func() bool) {
	if !e.unlink() {
		// The gateway is gone already, and the EPP's stream with it.
		return func() bool { return false }
	}
	ctx := gw.Context()
	return context.AfterFunc(ctx, func() { o.gatewayGone(context.Cause(ctx)) })
}
