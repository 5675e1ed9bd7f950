package sidecar

import (
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
)

// ScoresHeader is the response header that explains the cluster decision
// of a request (clusterscore.Explanation) when ServerConfig.ExplainDecisions
// is on.
const ScoresHeader = "x-mci-cluster-scores"

// registerScoringMetrics registers the gauges of the policies' memory,
// read at scrape time, and the counter of unparseable prompts.
func registerScoringMetrics(reg prometheus.Registerer, mem *clusterscore.Memory, unparseable prometheus.Counter) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(
		gauge("mci_sidecar_prefix_index_bytes", "Memory of the prefix-cache affinity index, allocated once at its capacity.",
			func() float64 { return float64(mem.Prefixes.Bytes()) }),
		gauge("mci_sidecar_prefix_index_capacity_blocks", "Prompt blocks the prefix-cache affinity index holds at most.",
			func() float64 { return float64(mem.Prefixes.Capacity()) }),
		gauge("mci_sidecar_prefix_index_blocks", "Prompt blocks the prefix-cache affinity index holds now.",
			func() float64 { return float64(mem.Prefixes.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "mci_sidecar_prefix_index_evictions_total",
			Help: "Prompt blocks pushed out of the full prefix-cache affinity index by newer ones.",
		}, func() float64 { return float64(mem.Prefixes.Evicted()) }),
		gauge("mci_sidecar_session_pins", "Sessions pinned to a cluster (expired ones included until read or pushed out).",
			func() float64 { return float64(mem.Sessions.Len()) }),
		unparseable,
	)
}

func newUnparseableCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mci_sidecar_unparseable_prompts_total",
		Help: "Request bodies whose prompt a policy with the prefix-cache scorer could not read: routed without prefix affinity.",
	})
}

// promptLog logs a backend's unparseable prompts once per change of the
// reason, so that a client sending many does not flood the log.
type promptLog struct {
	mu   sync.Mutex
	last map[string]string
}

func (l *promptLog) failed(logger logr.Logger, be *routetable.Backend, err error) {
	key, reason := be.String(), err.Error()
	l.mu.Lock()
	changed := l.last[key] != reason
	if changed {
		if l.last == nil {
			l.last = map[string]string{}
		}
		l.last[key] = reason
	}
	l.mu.Unlock()
	if changed {
		logger.Info("Cannot read the prompt of a request body; it is routed without prefix affinity (counted in mci_sidecar_unparseable_prompts_total; logged again when the reason changes)", "backend", key, "err", err)
	}
}

// attempt is the observation of the request sent to the cluster that
// answered it (clusterscore.Observer): started when the request was sent
// to its EPP, answered when the EPP answered; its first byte is the
// response headers coming back through the response phase, or, when the
// gateway's stream ends without any (the gateway does not send the
// response phase), the EPP's answer.
type attempt struct {
	obs      *clusterscore.Observer
	scope    string
	cluster  string
	started  time.Time
	answered time.Time

	mu        sync.Mutex
	firstByte bool
	failed    bool
}

// responseHeaders notes the response headers the gateway sent: the first
// byte, and an error status.
func (at *attempt) responseHeaders(h *extprocv3.HttpHeaders) {
	at.mu.Lock()
	defer at.mu.Unlock()
	if at.firstByte {
		return
	}
	at.firstByte = true
	at.obs.FirstByte(at.scope, at.cluster, time.Since(at.started))
	if code := extproc.HeaderValue(findHeader(h.GetHeaders(), ":status")); len(code) == 3 && code[0] == '5' {
		at.failed = true
	}
}

// finish ends the observation; failed adds a failure of the stream.
func (at *attempt) finish(failed bool) {
	at.mu.Lock()
	defer at.mu.Unlock()
	if !at.firstByte {
		at.obs.FirstByte(at.scope, at.cluster, at.answered.Sub(at.started))
	}
	at.obs.Finished(at.scope, at.cluster, failed || at.failed)
}

func findHeader(hm *corev3.HeaderMap, name string) *corev3.HeaderValue {
	for _, h := range hm.GetHeaders() {
		if h.GetKey() == name {
			return h
		}
	}
	return nil
}

// observedStream is the gateway's stream in the response phase: it notes
// the response headers for the attempt, and adds ScoresHeader to them when
// the decision is explained.
type observedStream struct {
	gatewayStream
	at      *attempt
	explain string
}

func (s *observedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m, err := s.gatewayStream.Recv()
	s.observe(m)
	return m, err
}

func (s *observedStream) RecvMsg(m any) error {
	err := s.gatewayStream.RecvMsg(m)
	if f, ok := m.(*requestFrame); ok && err == nil {
		s.observe(f.ProcessingRequest)
	}
	return err
}

func (s *observedStream) observe(m *extprocv3.ProcessingRequest) {
	if h := m.GetResponseHeaders(); h != nil && s.at != nil {
		s.at.responseHeaders(h)
	}
}

func (s *observedStream) Send(r *extprocv3.ProcessingResponse) error {
	s.explainIn(r)
	return s.gatewayStream.Send(r)
}

func (s *observedStream) SendMsg(m any) error {
	if f, ok := m.(*responseFrame); ok && s.explainIn(f.ProcessingResponse) {
		f.raw = nil
	}
	return s.gatewayStream.SendMsg(m)
}

// explainIn adds the explanation header to a response headers answer and
// says whether it did.
func (s *observedStream) explainIn(r *extprocv3.ProcessingResponse) bool {
	rh, ok := r.GetResponse().(*extprocv3.ProcessingResponse_ResponseHeaders)
	if !ok || s.explain == "" {
		return false
	}
	if rh.ResponseHeaders == nil {
		rh.ResponseHeaders = &extprocv3.HeadersResponse{}
	}
	if rh.ResponseHeaders.Response == nil {
		rh.ResponseHeaders.Response = &extprocv3.CommonResponse{}
	}
	common := rh.ResponseHeaders.Response
	if common.HeaderMutation == nil {
		common.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, extproc.SetHeader(ScoresHeader, s.explain))
	return true
}
