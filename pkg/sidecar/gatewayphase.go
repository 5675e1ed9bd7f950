package sidecar

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// MissingResponsePhaseStreak is how many routed streams in a row must end
// without a response phase before the gateway is said not to send it. One
// such stream means little: Envoy ends a stream after the request phase
// when the request never reaches an upstream.
const MissingResponsePhaseStreak = 10

// responsePhaseWatch says whether the gateway sends the response phase.
// A stream counts when the sidecar answered its request phase with a
// destination (routed or parent): it lacked the response phase when the
// gateway ended its side of the stream cleanly (half-close, not a reset)
// before sending any response message, as NGINX Gateway Fabric's EPP shim
// does after the request body. After MissingResponsePhaseStreak such
// streams in a row the state turns "missing"; one stream with a response
// phase turns it back. Each change is said once: a log line and
// mci_sidecar_gateway_response_phase_missing (1/0);
// mci_sidecar_streams_without_response_phase_total counts the streams.
// Without it, the EPP that routed a request (EndpointMode) sees its
// stream end at the pick, so its in-flight counts end there.
type responsePhaseWatch struct {
	logger  logr.Logger
	gauge   prometheus.Gauge
	streams prometheus.Counter

	mu      sync.Mutex
	streak  int
	missing bool
}

func newResponsePhaseWatch(reg prometheus.Registerer, logger logr.Logger) *responsePhaseWatch {
	w := &responsePhaseWatch{
		logger: logger,
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_sidecar_gateway_response_phase_missing",
			Help: "1 while the gateway ends its ext_proc streams after the request phase (the last 10 routed streams in a row ended without any response message, as NGINX Gateway Fabric's do): the EPPs that route requests see their streams end at the pick. 0 once a stream brings its response phase.",
		}),
		streams: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mci_sidecar_streams_without_response_phase_total",
			Help: "Routed ext_proc streams that the gateway ended cleanly after the request phase, without any response message.",
		}),
	}
	reg.MustRegister(w.gauge, w.streams)
	return w
}

// ended notes how a routed stream ended: with a response phase (sent) or
// without one; cfg is what the gateway announced in its first message.
func (w *responsePhaseWatch) ended(sent bool, cfg *extprocv3.ProtocolConfiguration) {
	if w == nil {
		return
	}
	if !sent {
		w.streams.Inc()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case sent:
		w.streak = 0
		if w.missing {
			w.missing = false
			w.gauge.Set(0)
			w.logger.Info("The gateway sends the response phase again")
		}
	case !w.missing:
		w.streak++
		if w.streak >= MissingResponsePhaseStreak {
			w.missing = true
			w.gauge.Set(1)
			w.logger.Info("The gateway ends its ext_proc streams after the request phase: the EPPs that route its requests see their streams end at the pick, and their in-flight counts with them (counted in mci_sidecar_streams_without_response_phase_total; logged again when a stream brings its response phase)",
				"streak", w.streak, "announcedResponseBodyMode", announcedResponseMode(cfg))
		}
	}
}

// announcedResponseMode is the response body mode the gateway announced,
// "none" when it announced no protocol configuration.
func announcedResponseMode(cfg *extprocv3.ProtocolConfiguration) string {
	if cfg == nil {
		return "none"
	}
	return cfg.GetResponseBodyMode().String()
}

// phaseStream is the gateway's stream in the response phase, noting
// whether any message came and whether the gateway ended its side cleanly.
// The relay reads it from a goroutine of its own, hence the atomics.
type phaseStream struct {
	gatewayStream
	got, closed atomic.Bool
}

func (s *phaseStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m, err := s.gatewayStream.Recv()
	s.note(err)
	return m, err
}

func (s *phaseStream) RecvMsg(m any) error {
	err := s.gatewayStream.RecvMsg(m)
	s.note(err)
	return err
}

func (s *phaseStream) note(err error) {
	switch {
	case err == nil:
		s.got.Store(true)
	case errors.Is(err, io.EOF):
		s.closed.Store(true)
	}
}

// outcome says whether the stream brought a response phase (sent), and
// whether that is known (known: a message came, or the gateway ended its
// side cleanly without one).
func (s *phaseStream) outcome() (sent, known bool) {
	if s.got.Load() {
		return true, true
	}
	return false, s.closed.Load()
}
