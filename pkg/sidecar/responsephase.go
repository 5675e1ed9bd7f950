package sidecar

import (
	"fmt"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/mci-dev/mci/pkg/responserelay"
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
	// to the EPP (pkg/responserelay explains why). The default.
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
// mci_sidecar_epp_response_phase_total: pkg/responserelay's.
const (
	ResponseCompleted = responserelay.Completed
	ResponseCanceled  = responserelay.Canceled
	ResponseImmediate = responserelay.Immediate
	ResponseFailed    = responserelay.Failed
	ResponseTimeout   = responserelay.Timeout
	ResponseEnded     = responserelay.Ended
)

// relayResponse relays the response phase of the gateway's stream gw, whose
// processing mode cfg announced, to the EPP that routed the request (t's
// live stream), which answered the request phase with resps
// (responserelay.Run). It returns what the gateway's stream ends with; t
// learns how the response phase ended.
func (s *Server) relayResponse(gw gatewayStream, t *tracker, cfg *extprocv3.ProtocolConfiguration, resps []*extprocv3.ProcessingResponse) error {
	// A remote EPP's answers to the chunks of a streamed body never reach
	// the gateway (eppanswer.ResponsePhase): they go ahead, whatever
	// --epp-response-phase says.
	remote := !t.liveCluster.Local
	rc := responserelay.Config{
		Protocol: cfg,
		Answers:  resps,
		Ahead:    s.bodyAhead || remote,
		Remote:   remote,
		Timeout:  s.relay.timeout,
		Linger:   s.relay.linger,
		Workers:  s.workers,
	}
	if remote {
		rc.ToRemote = s.remote.message
	}
	res, err := responserelay.Run(gw, t.live, rc, t)
	if res.Refused != nil {
		s.remote.refused(t.liveCluster, res.Refused)
	}
	t.responsePhase(res.Outcome, res.Late, res.LateWhat)
	return err
}

// TakenOver makes the tracker the observer of the response phase it
// relays (responserelay.Observer).
func (t *tracker) TakenOver(outcome string, why error) { t.takenOver(outcome, why) }
