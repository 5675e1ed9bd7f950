package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// RelayedHeader marks a request a sidecar relays to another cluster's EPP;
// its value is the relaying sidecar's cluster. A shim-mode sidecar serves
// such a request with its local EPP only, so that two clusters that both
// export a shim pool never send a request back and forth.
const RelayedHeader = "x-mci-relayed-from"

// Defaults of ServerConfig.
const (
	DefaultMaxRequestBodyBytes = requestmodel.DefaultMaxRequestBodyBytes
	// DefaultAttemptTimeout bounds one EPP's answer. Keep it well below the
	// gateway's ext_proc message timeout, so that the next cluster can still
	// be tried in time.
	DefaultAttemptTimeout = 2 * time.Second
)

// ServerConfig configures the ext_proc server.
type ServerConfig struct {
	// MaxRequestBodyBytes bounds a buffered request body (413 past it);
	// <= 0: DefaultMaxRequestBodyBytes.
	MaxRequestBodyBytes int64
	// AttemptTimeout bounds the wait for one EPP's answer; <= 0:
	// DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// Scheduling configures the MetricsBased policy's filter chain; zero:
	// scheduling.DefaultConfig().
	Scheduling scheduling.Config
	// Dial is how EPPs are connected to, by the relay and the health
	// prober alike; zero fields: DefaultDialPolicy.
	Dial DialPolicy
	// ResponsePhase says whether the EPP that routed a request sees its
	// response phase; "": ResponsePhaseRelay.
	ResponsePhase ResponsePhase
	// Session says where a request's session key is, for the session
	// scorer; zero: no sessions.
	Session clusterscore.SessionSpec
	// Memory sizes what the policies learn (prefix index, sessions);
	// zero: clusterscore.DefaultMemoryOptions.
	Memory clusterscore.MemoryOptions
	// ExplainDecisions adds ScoresHeader, the scores of the cluster
	// decision, to every routed response. At log level 4 the decisions
	// are logged whatever it says.
	ExplainDecisions bool
}

// FailureRecorder learns of EPPs that failed a request (passive health).
type FailureRecorder interface {
	Failed(c *routetable.Cluster)
}

// Server is the sidecar's ext_proc service. For each request stream of the
// gateway it reads the request whole, matches its HTTPRoute rule, picks a
// backendRef by weight and orders the backend's clusters by policy; then it
// answers with the first cluster that takes the request: a cluster's EPP
// (EndpointMode), to which the request is relayed and whose answer — the
// model server's address as destination, the possibly rewritten body, or
// an error of its own — goes back to the gateway; or a remote parent
// gateway (ParentMode), given as the destination with the request's host
// and path unchanged.
//
// Everything happens on the stream's goroutine (plus one sender per EPP
// stream), so a stream the gateway abandons leaves nothing behind.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	router   *routetable.Router
	state    State
	policies *PolicySet
	relay    *relayer
	metrics  *Metrics
	maxBody  int64
	logger   logr.Logger
	// keepEPP: the EPP's stream is kept for the response phase.
	keepEPP bool
	explain bool
	// unparseable counts, and prompts logs, bodies whose prompt cannot
	// be read.
	unparseable prometheus.Counter
	prompts     promptLog

	// lastTakeover is when an EPP of each cluster was last logged at level
	// 0 for not finishing a response phase.
	logMu        sync.Mutex
	lastTakeover map[string]time.Time
}

// NewServer returns the ext_proc service. state tells the policies what is
// known of the clusters; if it is also a FailureRecorder it learns of
// failed EPPs. creds say how each EPP address is reached (nil: every one
// in plaintext). metrics may be nil.
func NewServer(router *routetable.Router, state State, creds *epptransport.Credentials, cfg ServerConfig, metrics *Metrics, logger logr.Logger) *Server {
	if cfg.MaxRequestBodyBytes <= 0 {
		cfg.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.Scheduling == (scheduling.Config{}) {
		// Zero thresholds would leave no cluster with capacity for a
		// sheddable request.
		cfg.Scheduling = scheduling.DefaultConfig()
	}
	if cfg.Memory == (clusterscore.MemoryOptions{}) {
		cfg.Memory = clusterscore.DefaultMemoryOptions()
	}
	relay := newRelayer(cfg.AttemptTimeout, cfg.Dial, creds)
	if metrics != nil {
		relay.dial = append(relay.dial, grpc.WithStatsHandler(streamGauge{open: metrics.eppStreams}))
	}
	return &Server{
		router:      router,
		state:       state,
		policies:    NewPolicySet(cfg.Scheduling, clusterscore.NewMemory(cfg.Memory), cfg.Session),
		explain:     cfg.ExplainDecisions,
		unparseable: newUnparseableCounter(),
		relay:       relay,
		metrics:     metrics,
		maxBody:     cfg.MaxRequestBodyBytes,
		logger:      logger,
		keepEPP:     cfg.ResponsePhase != ResponsePhaseSkip,

		lastTakeover: map[string]time.Time{},
	}
}

// Close closes the connections to EPPs.
func (s *Server) Close() { s.relay.close() }

// Retain keeps connections to the EPPs of t and lets the others go, and
// the policies and observations of t.
func (s *Server) Retain(t *routetable.Table) {
	s.policies.Retain(t)
	keep := map[string]bool{}
	for _, c := range t.Clusters() {
		if c.EPP != "" {
			keep[c.EPP] = true
		}
	}
	s.relay.retain(keep)
}

// reconnect follows an EPP health address that turned SERVING: the relay's
// connections to the ext_proc addresses of the clusters probed there retry
// at once, so that active probing and the relay agree that the EPP is back.
func (s *Server) reconnect(healthAddr string) {
	for _, c := range s.router.Table().Clusters() {
		if c.Health == healthAddr && c.EPP != "" {
			s.relay.reconnect(c.EPP)
		}
	}
}

// Process serves one request's stream.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	if s.metrics != nil {
		s.metrics.streams.Inc()
		defer s.metrics.streams.Dec()
	}
	rec := newRecorder(stream)
	req, err := extproc.ReadRequest(rec, s.maxBody)
	start := time.Now()
	switch {
	case errors.Is(err, extproc.ErrBodyTooLarge):
		s.metrics.request("", OutcomeError, http.StatusRequestEntityTooLarge)
		return stream.Send(extproc.ErrorResponse(http.StatusRequestEntityTooLarge, err.Error()))
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, extproc.ErrProtocol):
		return status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return err
	}

	resps, a := s.answer(ctx, req, rec.msgs, start)
	failed := true
	if a.attempt != nil {
		defer func() { a.attempt.finish(failed) }()
	}
	if ctx.Err() != nil {
		if a.live != nil {
			a.live.cancel(nil)
		}
		return status.FromContextError(ctx.Err()).Err()
	}
	if f := a.filters(); f != nil {
		applyFilters(f, resps, req.Header, a.pathPrefix)
	}
	if err := extproc.SendAll(stream, resps); err != nil {
		if a.live != nil {
			a.live.cancel(err)
		}
		return err
	}
	s.metrics.answered(time.Since(start))
	s.metrics.request(a.cluster, a.outcome, a.code)
	if log := s.logger.V(4); log.Enabled() {
		log.Info("Answered request", "host", req.Header(":authority"), "path", req.Header(":path"),
			"route", a.routeName(), "backend", a.backendName(), "cluster", a.cluster, "outcome", a.outcome, "code", a.code, "tried", a.tried)
	}

	// The response phase goes through the gateway's own stream (not the
	// recorder, which would keep every response message), observed.
	gw := gatewayStream(stream)
	if a.attempt != nil || a.explanation != "" {
		gw = &observedStream{gatewayStream: stream, at: a.attempt, explain: a.explanation}
	}
	if a.live != nil {
		// The EPP that routed the request sees its response phase; the
		// request itself is not kept for it.
		err = s.relayResponse(gw, a.live, req.ProtocolConfig, resps, a.liveCluster)
	} else {
		err = req.PassThroughResponse(gw)
	}
	failed = err != nil && ctx.Err() == nil
	return err
}

// answered is what became of a request, for metrics and logs.
type answered struct {
	// rule and backend are named only when logged, which few requests are.
	rule             *routetable.Rule
	backend          *routetable.Backend
	cluster, outcome string
	code             int
	tried            []string
	// pathPrefix is what the rule's PathPrefix match matched.
	pathPrefix string
	// live is the stream of the EPP of liveCluster that routed the
	// request, kept open for the response phase.
	live        *eppStream
	liveCluster *routetable.Cluster
	// attempt observes the request sent to the cluster that took it
	// (nil when the policy observes nothing or none took it).
	attempt *attempt
	// explanation is the decision's, when explained.
	explanation string
}

// filters are the HTTPRoute filters the request goes through: those of its
// backend when it goes on upstream (not in shim mode, where the gateway
// applies the route's filters itself).
func (a *answered) filters() *routetable.Filters {
	if a.rule == nil || a.backend == nil || a.backend.Filters() == nil {
		return nil
	}
	switch a.outcome {
	case OutcomeRouted, OutcomeParent, OutcomeFailOpen:
		return a.backend.Filters()
	}
	return nil
}

func (a *answered) routeName() string {
	if a.rule == nil {
		return ""
	}
	return fmt.Sprintf("%s#%d", a.rule.Route, a.rule.Index)
}

func (a *answered) backendName() string {
	if a.backend == nil {
		return ""
	}
	return a.backend.String()
}

// answer decides where the request goes and returns the responses for the
// gateway.
func (s *Server) answer(ctx context.Context, req *extproc.Request, msgs []*extprocv3.ProcessingRequest, start time.Time) ([]*extprocv3.ProcessingResponse, answered) {
	var a answered
	refuse := func(code int, outcome, format string, args ...any) ([]*extprocv3.ProcessingResponse, answered) {
		a.code, a.outcome = code, outcome
		return []*extprocv3.ProcessingResponse{extproc.ErrorResponse(code, fmt.Sprintf(format, args...))}, a
	}

	attrs := attrsFromRequest(req)
	tbl := s.router.Table()
	var be *routetable.Backend
	if tbl.ShimMode() {
		var code int
		var msg string
		be, code, msg = tbl.ShimFor(shimPoolOf(req), &attrs)
		if be == nil {
			s.metrics.picked(time.Since(start))
			return refuse(code, OutcomeNoRoute, "%s", msg)
		}
		if relayer := req.Header(RelayedHeader); relayer != "" {
			// Another cluster's sidecar chose this cluster: only the
			// pool's local EPP may answer, and a refusal is better than
			// FailOpen, so that the relaying sidecar tries its next
			// cluster.
			be = be.LocalOnly()
		}
	} else {
		rule, prefix := tbl.Match(&attrs)
		if rule == nil {
			s.metrics.picked(time.Since(start))
			return refuse(http.StatusNotFound, OutcomeNoRoute, "no HTTPRoute rule matches host %q path %q", attrs.Host, attrs.Path)
		}
		a.rule, a.pathPrefix = rule, prefix
		switch {
		case rule.Invalid != "":
			s.metrics.picked(time.Since(start))
			return refuse(http.StatusInternalServerError, OutcomeInvalidBackend, "HTTPRoute %s: %s", rule.Route, rule.Invalid)
		case rule.Redirect() != nil:
			s.metrics.picked(time.Since(start))
			a.outcome, a.code = OutcomeRedirected, rule.Redirect().RedirectStatus()
			return []*extprocv3.ProcessingResponse{redirectResponse(rule.Redirect(), req.Header, prefix)}, a
		}
		be = rule.PickBackend()
		if be == nil {
			s.metrics.picked(time.Since(start))
			return refuse(http.StatusInternalServerError, OutcomeInvalidBackend, "HTTPRoute %s rule %d has no backendRef with a weight", rule.Route, rule.Index)
		}
		if be.Invalid != "" {
			a.backend = be
			s.metrics.picked(time.Since(start))
			return refuse(http.StatusInternalServerError, OutcomeInvalidBackend, "HTTPRoute %s: %s", rule.Route, be.Invalid)
		}
	}
	a.backend = be
	if f := be.Filters(); f.RedirectStatus() != 0 && !tbl.ShimMode() {
		s.metrics.picked(time.Since(start))
		a.outcome, a.code = OutcomeRedirected, f.RedirectStatus()
		return []*extprocv3.ProcessingResponse{redirectResponse(f, req.Header, a.pathPrefix)}, a
	}
	policy, perr := s.policies.Get(be.Policy)
	if perr != nil {
		s.logger.Error(perr, "Cluster policy does not compile", "backend", be.String())
	}
	needs := policy.Needs()
	pr := PickRequest{Now: start, Header: req.Header, Body: req.Body}
	if needs.Criticality {
		model := ""
		if body, err := requestmodel.ParseBody(req.Body); err == nil {
			model = body.Model()
		}
		pr.Criticality = be.Criticality(model, requestmodel.ReadRequestHeaders(req.Header).Objective)
	}
	var ex *clusterscore.Explanation
	logExplained := s.logger.V(4)
	if s.explain || logExplained.Enabled() {
		ex = &clusterscore.Explanation{}
	}
	d, err := policy.decide(be, pr, s.state, ex)
	order := d.order
	s.metrics.picked(time.Since(start))
	if d.promptErr != nil {
		s.unparseable.Inc()
		s.prompts.failed(s.logger, be, d.promptErr)
	}
	if ex != nil {
		logExplained.Info("Cluster decision", "backend", be.String(), "scores", ex.String())
		if s.explain {
			a.explanation = ex.String()
		}
	}
	if errors.Is(err, ErrShed) {
		return refuse(http.StatusTooManyRequests, OutcomeShed, "%s: %v", be, err)
	}

	var last *refusal
	// What remote clusters' EPPs get, made once for every remote cluster
	// tried.
	var remote []*extprocv3.ProcessingRequest
	mem := s.policies.Memory()
	took := func(c *routetable.Cluster, sent time.Time) {
		if d.req.Blocks != nil || d.req.Session != "" {
			mem.Served(&d.req, c.Name)
		}
		if needs.Observed {
			a.attempt = &attempt{obs: mem.Observed, scope: d.req.Scope, cluster: c.Name, started: sent, answered: time.Now()}
		}
	}
	try := func(c *routetable.Cluster) []*extprocv3.ProcessingResponse {
		a.tried = append(a.tried, c.Name)
		sent := time.Now()
		if needs.Observed {
			mem.Observed.Started(d.req.Scope, c.Name)
		}
		if c.Mode == v1alpha1.RoutingModeParent {
			a.cluster, a.outcome, a.code = c.Name, OutcomeParent, http.StatusOK
			took(c, sent)
			return req.Route([]string{c.Parent}, nil)
		}
		send := msgs
		if !c.Local {
			if remote == nil {
				remote = forRemote(msgs, tbl.LocalCluster())
			}
			send = remote
		}
		resps, live, err := s.relay.relay(ctx, c.EPP, send, s.keepEPP)
		if err == nil {
			a.cluster, a.outcome, a.code = c.Name, OutcomeRouted, http.StatusOK
			a.live, a.liveCluster = live, c
			if ir := resps[0].GetImmediateResponse(); ir != nil {
				a.outcome, a.code = OutcomeRefused, int(ir.GetStatus().GetCode())
				if needs.Observed {
					mem.Observed.Finished(d.req.Scope, c.Name, a.code >= 500 || a.code == http.StatusTooManyRequests)
				}
				return resps
			}
			took(c, sent)
			return resps
		}
		if needs.Observed {
			mem.Observed.Finished(d.req.Scope, c.Name, ctx.Err() == nil)
		}
		if ctx.Err() != nil {
			return nil
		}
		var r *refusal
		if errors.As(err, &r) {
			last = r
		} else {
			s.metrics.eppFailure(c.Name)
			if fr, ok := s.state.(FailureRecorder); ok {
				fr.Failed(c)
			}
		}
		s.logger.V(2).Info("EPP did not take the request; trying the next cluster", "backend", be.String(), "cluster", c.Name, "epp", c.EPP, "err", err)
		return nil
	}

	for _, c := range order {
		if resps := try(c); resps != nil || ctx.Err() != nil {
			return resps, a
		}
	}

	if be.FailureMode == poolv1.FailOpen {
		// FailOpen: the clusters the policy left out (known unhealthy, or
		// without capacity) are better than nothing; the health they were
		// left out for may be stale.
		for _, c := range policy.FailOpen(be) {
			if slices.Contains(order, c) {
				continue
			}
			if resps := try(c); resps != nil || ctx.Err() != nil {
				return resps, a
			}
		}
		// Nothing can pick an endpoint: let the request go on unchanged,
		// without a destination, to whatever the gateway does on its own
		// (for a local pool, its own load balancing over the pool, which is
		// what FailOpen means for a single cluster; for a remote one there
		// is nothing, and the gateway answers 503 itself).
		a.outcome, a.code = OutcomeFailOpen, http.StatusOK
		return req.Forward(nil, nil, req.Body), a
	}
	if last != nil {
		a.outcome, a.code = OutcomeUnavailable, http.StatusServiceUnavailable
		return []*extprocv3.ProcessingResponse{last.resp}, a
	}
	if len(a.tried) == 0 {
		return refuse(http.StatusServiceUnavailable, OutcomeUnavailable, "%s has no cluster available", be)
	}
	return refuse(http.StatusServiceUnavailable, OutcomeUnavailable, "%s: no cluster's EPP answered (tried %v)", be, a.tried)
}
