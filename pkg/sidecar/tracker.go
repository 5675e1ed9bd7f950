package sidecar

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/responserelay"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/statelog"
)

// ScoresHeader is the response header that explains the cluster decision
// of a request (clusterscore.Explanation) when ServerConfig.ExplainDecisions
// is on.
const ScoresHeader = "x-mci-cluster-scores"

// FailureRecorder learns of EPPs that failed a request (passive health).
type FailureRecorder interface {
	Failed(c *routetable.Cluster)
}

// takeoverLog is when an EPP the sidecar replaced in the response phase is
// logged at level 0: once a minute per cluster, the others at level 2.
var takeoverLog = statelog.Rule{Interval: time.Minute, Repeat: true}

// observers are what learns what becomes of the requests, shared by their
// trackers: the policies' memory (Memory.Served, clusterscore.Observer),
// passive health (FailureRecorder), outlier detection (nil: none), the
// metrics and the logs.
type observers struct {
	mem      *clusterscore.Memory
	failures FailureRecorder
	outliers *outlierWatch
	metrics  *Metrics
	logger   logr.Logger
	// prompts are the reasons of unparseable prompts, by backend, logged
	// once per change so that a client sending many does not flood the
	// log; takeovers the response phases the sidecar took over, by
	// cluster (takeoverLog); shims why the shim pool of requests could not
	// be told, by status, logged once per change; homes the backends whose
	// clusters' capacities were unknown at their last home decision;
	// lateBody the clusters whose EPP asks to change body chunks that went
	// ahead, by what it asks, once per change; lastResort the backends
	// whose last request went to ejected clusters, no other being kept.
	prompts, takeovers, shims, homes, lateBody, lastResort statelog.Log[string]
}

func newObservers(mem *clusterscore.Memory, failures FailureRecorder, metrics *Metrics, logger logr.Logger) *observers {
	return &observers{mem: mem, failures: failures, metrics: metrics, logger: logger, takeovers: statelog.Log[string]{Rule: takeoverLog}}
}

// retain forgets the backends and clusters t no longer has.
func (o *observers) retain(t *routetable.Table) {
	backends, clusters := map[string]bool{}, map[string]bool{}
	for b := range t.Backends {
		backends[b.String()] = true
	}
	for _, c := range t.Clusters() {
		clusters[c.Name] = true
	}
	o.prompts.Retain(func(b string) bool { return backends[b] })
	o.lastResort.Retain(func(b string) bool { return backends[b] })
	o.takeovers.Retain(func(c string) bool { return clusters[c] })
	o.lateBody.Retain(func(c string) bool { return clusters[c] })
}

// track starts following a request decided by d at start (the end of its
// body), and tells what the decision found: the time it took, an
// unparseable prompt, the explanation (at level
// 4). With explain, the explanation goes in the response's ScoresHeader.
func (o *observers) track(d *decision, start time.Time, explain bool) *tracker {
	o.metrics.picked(time.Since(start))
	if d.promptErr != nil {
		o.metrics.unparseablePrompt()
		if o.prompts.Observe(d.backendName(), "", d.promptErr.Error()).Loud() {
			o.logger.Info("Cannot read the prompt of a request body; it is routed without prefix affinity (counted in mci_sidecar_unparseable_prompts_total; logged again when the reason changes)", "backend", d.backendName(), "err", d.promptErr)
		}
	}
	if d.explanation != "" {
		o.logger.V(4).Info("Cluster decision", "backend", d.backendName(), "homeOutcome", d.req.Home.Outcome, "scores", d.explanation)
	}
	o.homeDecision(d)
	o.lastResortDecision(d)
	if d.shimUnresolved && o.shims.Observe(strconv.Itoa(d.code), "", d.details).Loud() {
		o.logger.Info("Cannot tell which shim pool a request is for; it is answered with an error (counted in mci_sidecar_requests_total{outcome=\"no_route\"}; logged again when the reason changes)", "code", d.code, "reason", d.details)
	}
	t := &tracker{observers: o, d: d, start: start}
	if explain {
		t.explanation = d.explanation
	}
	return t
}

// tracker follows one request from its decision to the end of its stream:
// the one place that tells the observers what became of it (each attempt,
// the answer, the response phase).
type tracker struct {
	*observers
	d     *decision
	start time.Time
	// explanation goes in the response's ScoresHeader; "" for none.
	explanation string

	// cluster is the cluster that took the request ("" when none did),
	// outcome and code what the gateway was answered, tried the clusters
	// tried.
	cluster, outcome string
	code             int
	tried            []string
	// live is the stream of the EPP of liveCluster that routed the
	// request, kept open for the response phase.
	live        *responserelay.EPPStream
	liveCluster *routetable.Cluster
	// took observes the attempt of the cluster that took the request (nil
	// when neither the policy nor outlier detection observes anything, or
	// none took it).
	took *attempt
}

// answered notes the sidecar's own answer.
func (t *tracker) answered(outcome string, code int) { t.outcome, t.code = outcome, code }

// attempting notes an attempt of c about to be sent, and returns when.
func (t *tracker) attempting(c *routetable.Cluster) time.Time {
	t.tried = append(t.tried, c.Name)
	now := time.Now()
	if t.d.needs.Observed {
		t.mem.Observed.Started(t.d.req.Scope, c.Name, now)
	}
	return now
}

// routed notes that c, sent the request at sent, took it (outcome routed or
// parent): the policies learn where it was served, as soon as it was;
// live, when set, is its EPP's stream kept for the response phase.
func (t *tracker) routed(c *routetable.Cluster, outcome string, sent time.Time, live *responserelay.EPPStream) {
	t.cluster, t.outcome, t.code = c.Name, outcome, http.StatusOK
	if live != nil {
		t.live, t.liveCluster = live, c
	}
	if t.d.req.Blocks != nil || t.d.req.Session != "" {
		t.mem.Served(&t.d.req, c.Name)
	}
	if t.d.needs.Observed || t.outliers != nil {
		t.took = &attempt{scope: t.d.req.Scope, cluster: c.Name, started: sent, answered: time.Now(), out: t.outliers.routed(c)}
		if t.d.needs.Observed {
			t.took.obs = t.mem.Observed
		}
	}
}

// refused notes that c's EPP answered with an error of its own (not 503),
// which goes to the gateway: an error of c when it is 429 or 5xx.
func (t *tracker) refused(c *routetable.Cluster, code int) {
	t.cluster, t.outcome, t.code = c.Name, OutcomeRefused, code
	if t.d.needs.Observed {
		t.mem.Observed.Finished(t.d.req.Scope, c.Name, code >= 500 || code == http.StatusTooManyRequests)
	}
}

// failed notes that c's EPP did not take the request (err): it failed,
// and counts as failed for its health, or refused it (503, a *refusal).
// Nothing counts against it when the gateway went away (ctx).
func (t *tracker) failed(ctx context.Context, c *routetable.Cluster, err error) {
	if t.d.needs.Observed {
		t.mem.Observed.Finished(t.d.req.Scope, c.Name, ctx.Err() == nil)
	}
	if ctx.Err() != nil {
		return
	}
	var r *refusal
	if !errors.As(err, &r) {
		t.metrics.eppFailure(c.Name)
		t.failures.Failed(c)
	}
	t.logger.V(2).Info("EPP did not take the request; trying the next cluster", "backend", t.d.backendName(), "cluster", c.Name, "epp", c.EPP, "err", err)
}

// sent notes the answer sent to the gateway: counted, and logged at level
// 4.
func (t *tracker) sent(req *extproc.Request) {
	t.metrics.answered(time.Since(t.start))
	t.metrics.request(t.cluster, t.outcome, t.code)
	if log := t.logger.V(4); log.Enabled() {
		log.Info("Answered request", "host", req.Header(":authority"), "path", req.Header(":path"),
			"route", t.d.routeName(), "backend", t.d.backendName(), "cluster", t.cluster, "outcome", t.outcome, "code", t.code, "tried", t.tried)
	}
}

// abandon resets the EPP stream kept for a request whose answer did not
// reach the gateway, with cause.
func (t *tracker) abandon(cause error) {
	if t.live != nil {
		t.live.Reset(cause)
	}
}

// observe is the gateway's stream for the response phase: observed when
// an attempt is, or the decision explained.
func (t *tracker) observe(stream gatewayStream) gatewayStream {
	if t.took == nil && t.explanation == "" {
		return stream
	}
	return &observedStream{gatewayStream: stream, at: t.took, explain: t.explanation}
}

// responsePhase notes how the response phase relayed to the EPP of
// liveCluster ended (ResponseCompleted, ...), and the EPP's answers to
// body chunks that went ahead of them which the gateway could not apply
// any more (n, the first asking for what): counted, and logged once per
// change per cluster (when a cluster's EPP starts asking for them, and
// once a response it completed had none again).
func (t *tracker) responsePhase(outcome string, n int, what string) {
	c := t.liveCluster
	t.metrics.responsePhase(c.Name, outcome)
	if n == 0 {
		if outcome != ResponseCompleted {
			return
		}
		if was, lasted := t.lateBody.Clear(c.Name); was {
			t.logger.Info("EPP answers response body chunks without changes again", "cluster", c.Name, "epp", c.EPP, "after", lasted.Round(time.Second))
		}
		return
	}
	t.metrics.lateBodyAnswers(c.Name, n)
	if t.lateBody.Observe(c.Name, what, "").Loud() {
		t.logger.Info("EPP asked to change response body chunks that had gone to the gateway already; they went on unchanged (counted in mci_sidecar_epp_late_body_answers_total; --epp-response-phase=Intercept makes every chunk wait for the EPP)",
			"cluster", c.Name, "epp", c.EPP, "asked", what, "answers", n)
	}
}

// takenOver notes that the EPP of liveCluster did not see the response
// phase through (outcome, err) and the sidecar answered the rest itself:
// logged at level 0 once a minute per cluster, the others at level 2. An
// EPP that failed or timed out counts as failed for the cluster's health,
// as a failed stream of the request phase does.
func (t *tracker) takenOver(outcome string, err error) {
	c := t.liveCluster
	// A stream cancelled on the sidecar's side (its connection closed after
	// the EPP left the table, or its credentials changed) says nothing of
	// the EPP's health.
	if outcome == ResponseTimeout || (outcome == ResponseFailed && status.Code(err) != codes.Canceled) {
		t.failures.Failed(c)
	}
	log := t.logger.V(2)
	if t.takeovers.Observe(c.Name, "", "").Loud() {
		log = t.logger
	}
	log.Info("EPP did not see the response phase through; the sidecar answered the rest itself and the response went on unchanged",
		"cluster", c.Name, "epp", c.EPP, "outcome", outcome, "err", err)
}

// finish ends the observation of the attempt that took the request, when
// the gateway's stream ends; failed says it failed.
func (t *tracker) finish(failed bool) {
	if t.took != nil {
		t.took.finish(failed)
	}
}

// attempt is the observation of the request sent to the cluster that
// answered it (clusterscore.Observer, nil when the policy observes
// nothing): started when the request was sent to its EPP, answered when
// the EPP answered; its first byte is the response headers coming back
// through the response phase, or, when the gateway's stream ends without
// any (the gateway does not send the response phase), the EPP's answer.
// out follows it for outlier detection (nil: none).
type attempt struct {
	obs      *clusterscore.Observer
	out      *outlierRequest
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
	code, err := strconv.Atoi(extproc.HeaderValue(findHeader(h.GetHeaders(), ":status")))
	if err != nil || code < 100 || code > 999 {
		code = 0
	}
	if at.out != nil {
		at.out.firstByte(code)
	}
	if at.obs == nil {
		return
	}
	at.obs.FirstByte(at.scope, at.cluster, time.Since(at.started))
	if code >= 500 {
		at.failed = true
	}
}

// finish ends the observation; failed adds a failure of the stream.
func (at *attempt) finish(failed bool) {
	at.mu.Lock()
	defer at.mu.Unlock()
	if at.out != nil {
		at.out.end()
	}
	if at.obs == nil {
		return
	}
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
	if f, ok := m.(*extproc.RequestFrame); ok && err == nil {
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
	if f, ok := m.(*extproc.ResponseFrame); ok && s.explainIn(f.ProcessingResponse) {
		f.Raw = nil
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

// lastResortDecision counts a request sent to ejected clusters because
// its backend's policy kept no other, and says once per change when a
// backend's requests start and stop going there.
func (o *observers) lastResortDecision(d *decision) {
	backend := d.backendName()
	if !d.req.LastResort {
		if was, _ := o.lastResort.Clear(backend); was {
			o.logger.Info("Requests go to clusters that are not ejected again", "backend", backend)
		}
		return
	}
	o.metrics.outlierLastResort(backend)
	if o.lastResort.Observe(backend, "ejected", "").Loud() {
		o.logger.Info("Requests go to clusters outlier detection ejected: the policy kept no other cluster of the backend (counted in mci_sidecar_outlier_last_resort_requests_total; said again when it ends)", "backend", backend)
	}
}

// homeDecision counts the home placement's decision of a request, and
// says once per change when a backend's homes are placed without knowing
// its clusters' capacities (a cluster without fresh pool metrics): they
// are then taken as equal, which may give a small cluster a large share
// of the groups.
func (o *observers) homeDecision(d *decision) {
	h := d.req.Home
	if h.Outcome == clusterscore.HomeNone {
		return
	}
	backend := d.backendName()
	o.metrics.prefixHome(backend, h)
	if h.Home == "" {
		return
	}
	if h.Alike {
		if o.homes.Observe(backend, "alike", "").Loud() {
			o.logger.Info("Prefix homes are placed as if the clusters had equal capacities: not every cluster reports its ready pods (no fresh pool metrics); mci_sidecar_prefix_home_capacities_unknown is 1 until they do", "backend", backend)
		}
		return
	}
	if was, _ := o.homes.Clear(backend); was {
		o.logger.Info("Prefix homes are placed by the clusters' ready pods again", "backend", backend)
	}
}
