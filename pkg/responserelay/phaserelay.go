package responserelay

import (
	"context"
	"io"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/mci-dev/mci/pkg/extproc"
)

// phaseRelay carries out the machine of one response phase: each event,
// from the gateway's stream, the EPP's or a timer, goes through step under
// one lock, and its actions are done under it too, so that the gateway's
// stream is sent to by one goroutine at a time.
type phaseRelay struct {
	mu sync.Mutex
	m  machine
	// toRemote says what of the gateway's messages goes to a remote EPP
	// (nil: all of them).
	toRemote func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest
	// timer fires at the EPP's deadline, linger once the linger after the
	// gateway's end is over; cancel resets the EPP's stream.
	timer  *time.Timer
	linger *time.Timer
	cancel context.CancelCauseFunc
	// lingerFor is how long the EPP may take to end its stream once the
	// gateway ended its own; eppStream is where the sidecar ends its side.
	lingerFor time.Duration
	eppStream extprocv3.ExternalProcessor_ProcessClient
}

// newPhaseRelay returns the relay of a response phase as cfg says, to an
// EPP whose stream is eppStream, which cancel resets.
func newPhaseRelay(cfg Config, eppStream extprocv3.ExternalProcessor_ProcessClient, cancel context.CancelCauseFunc) *phaseRelay {
	r := &phaseRelay{
		m:         newMachine(cfg.Protocol, cfg.Answers, cfg.Ahead, cfg.Remote, cfg.Timeout),
		toRemote:  cfg.ToRemote,
		cancel:    cancel,
		lingerFor: cfg.Linger,
		eppStream: eppStream,
	}
	r.timer = time.AfterFunc(cfg.Timeout, func() { _, _ = r.on(event{kind: deadlineFired}, nil, nil) })
	r.timer.Stop()
	return r
}

// on moves the machine by ev and carries out its actions on the gateway's
// stream gw; f is the EPP's answer as it came (for eppAnswer). It says
// what is to be forwarded to the EPP.
func (r *phaseRelay) on(ev event, gw extproc.FrameStream, f *extproc.ResponseFrame) (forward bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.m.step(ev)
	if a.err != nil {
		return false, a.err
	}
	if err := r.do(a, gw, f); err != nil {
		return false, err
	}
	return a.do&forwardEPP != 0, nil
}

// do carries out a, in order; a failed send to the gateway stops it.
func (r *phaseRelay) do(a actions, gw extproc.FrameStream, f *extproc.ResponseFrame) error {
	if a.do&answerGateway != 0 {
		if a.answer != nil {
			f = &extproc.ResponseFrame{ProcessingResponse: a.answer}
		}
		if err := gw.SendMsg(f); err != nil {
			return err
		}
	}
	if a.do&replyGateway != 0 {
		if err := gw.Send(a.reply); err != nil {
			return err
		}
	}
	if a.do&flushGateway != 0 {
		if err := extproc.SendAll(gw, a.flush); err != nil {
			return err
		}
	}
	if a.do&armDeadline != 0 {
		r.timer.Reset(a.wait)
	}
	if a.do&endEPPSide != 0 {
		_ = r.eppStream.CloseSend()
		r.linger = time.AfterFunc(r.lingerFor, func() { _, _ = r.on(event{kind: lingerOver}, nil, nil) })
	}
	if a.do&resetEPP != 0 {
		r.cancel(a.cause)
	}
	return nil
}

// pump relays the gateway's messages to the EPP until the gateway ends its
// stream, and answers them itself once the sidecar has taken over.
func (r *phaseRelay) pump(gw extproc.FrameStream, e *EPPStream) error {
	for {
		// Each message goes to the EPP as the gateway encoded it.
		f := extproc.NewRequestFrame()
		err := gw.RecvMsg(f)
		if err == io.EOF {
			_, _ = r.on(event{kind: gatewayEOF}, gw, nil)
			return nil
		}
		if err != nil {
			// The gateway went away: so does the EPP's stream, as it
			// would if the gateway had talked to it.
			e.cancel(err)
			return err
		}
		forward, err := r.fromGateway(f.ProcessingRequest, gw)
		if err != nil {
			e.cancel(err)
			return err
		}
		if forward {
			if r.toRemote != nil {
				if m := r.toRemote(f.ProcessingRequest); m != f.ProcessingRequest {
					f.ProcessingRequest, f.Raw = m, nil
				}
			}
			// A failed send shows in the receiver, which takes over; the
			// message is owed until then.
			_ = e.stream.SendMsg(f)
		}
	}
}

// fromGateway notes a message of the gateway, and says whether it goes on
// to the EPP.
func (r *phaseRelay) fromGateway(msg *extprocv3.ProcessingRequest, gw extproc.FrameStream) (forward bool, err error) {
	return r.on(event{kind: gatewayMessage, msg: msg}, gw, nil)
}

// fromEPP notes an answer f of the EPP and sends it to the gateway (but an
// answer to a chunk that went ahead). It says whether f is an immediate
// response, which ends the exchange.
func (r *phaseRelay) fromEPP(f *extproc.ResponseFrame, gw extproc.FrameStream) (immediate bool, err error) {
	_, err = r.on(event{kind: eppAnswer, answer: f.ProcessingResponse}, gw, f)
	return f.GetImmediateResponse() != nil, err
}

// takeOver answers what the gateway still waits for, in order, and makes
// the sidecar answer the gateway's messages from now on.
func (r *phaseRelay) takeOver(gw extproc.FrameStream) error {
	_, err := r.on(event{kind: takeOver}, gw, nil)
	return err
}

// gatewayGone notes that the gateway's stream ended with cause: the EPP's
// stream is reset with it, or kept (the kept phase).
func (r *phaseRelay) gatewayGone(cause error) {
	_, _ = r.on(event{kind: gatewayGone, cause: cause}, nil, nil)
}

// keptForEPP says whether the EPP's stream was kept when the gateway went.
func (r *phaseRelay) keptForEPP() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.phase == kept
}

// owing says whether the EPP owes any answer.
func (r *phaseRelay) owing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.owing()
}

// gatewayServed says whether the gateway ended its side of the stream with
// every answer it waits for given.
func (r *phaseRelay) gatewayServed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.gatewayServed()
}

// lateAnswers says how many answers of the EPP could not be applied, and
// what the first asked for.
func (r *phaseRelay) lateAnswers() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.late, r.m.lateWhat
}

// stop stops the timers.
func (r *phaseRelay) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer.Stop()
	if r.linger != nil {
		r.linger.Stop()
	}
}
