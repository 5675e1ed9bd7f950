package sidecar

import (
	"context"
	"errors"
	"net/http"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Defaults of ServerConfig.
const (
	DefaultMaxRequestBodyBytes = requestmodel.DefaultMaxRequestBodyBytes
	// DefaultAttemptTimeout bounds one EPP's answer. Keep it well below the
	// gateway's ext_proc message timeout, so that the next cluster can still
	// be tried in time.
	DefaultAttemptTimeout = 2 * time.Second
	// DefaultEPPDrainTimeout bounds how long a stream keeps the EPP that
	// routed it once that EPP left the routing table: long enough for a
	// long generation to end.
	DefaultEPPDrainTimeout = 10 * time.Minute
)

// ServerConfig configures the ext_proc server.
type ServerConfig struct {
	// MaxRequestBodyBytes bounds a buffered request body (413 past it);
	// <= 0: DefaultMaxRequestBodyBytes.
	MaxRequestBodyBytes int64
	// AttemptTimeout bounds the wait for one EPP's answer; <= 0:
	// DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// EPPDrainTimeout bounds how long the requests in flight on an EPP
	// that left the routing table (an export withdrawn, a cluster gone,
	// new credentials) keep their stream to it: its connection closes when
	// the last of them ends, or then. <= 0: DefaultEPPDrainTimeout.
	EPPDrainTimeout time.Duration
	// Scheduling configures the MetricsBased policy's filter chain; zero:
	// scheduling.DefaultConfig().
	Scheduling scheduling.Config
	// Dial is how EPPs are connected to, by the relay and the health
	// prober alike; zero fields: epptransport.DefaultDialPolicy.
	Dial epptransport.DialPolicy
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
	// RemoteDestinations is what remote EPPs' destinations are checked
	// against beyond what their exporters published (eppanswer); zero:
	// no denied range, no loopback.
	RemoteDestinations eppanswer.Policy
	// StrippedHeaders are request headers that never go to a remote EPP,
	// beyond DefaultStrippedHeaders.
	StrippedHeaders []string
	// ForwardedMetadataNamespaces are the filter metadata namespaces of the
	// gateway's metadata_context that a remote EPP gets; of the others it
	// gets only the endpoint that served the request, as the EPP protocol
	// reports it in the response phase. The subset hint
	// (extproc.SubsetHintNamespace) never goes: it names local endpoints.
	ForwardedMetadataNamespaces []string
	// MaxStreams bounds the gateway's streams served at once, and
	// MaxInflightBodyBytes the request body bytes they buffer (counted
	// twice); beyond either, a stream is answered 503. <= 0: the
	// defaults.
	MaxStreams           int64
	MaxInflightBodyBytes int64
	// Outlier configures outlier detection: clusters whose responses fail
	// are taken out of the choice of new requests for a while. nil: none.
	Outlier *OutlierConfig
}

// withDefaults fills the zero fields with their defaults.
func (cfg ServerConfig) withDefaults() ServerConfig {
	if cfg.MaxRequestBodyBytes <= 0 {
		cfg.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.EPPDrainTimeout <= 0 {
		cfg.EPPDrainTimeout = DefaultEPPDrainTimeout
	}
	if cfg.Scheduling == (scheduling.Config{}) {
		// Zero thresholds would leave no cluster with capacity for a
		// sheddable request.
		cfg.Scheduling = scheduling.DefaultConfig()
	}
	if cfg.Memory == (clusterscore.MemoryOptions{}) {
		cfg.Memory = clusterscore.DefaultMemoryOptions()
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.MaxInflightBodyBytes <= 0 {
		cfg.MaxInflightBodyBytes = DefaultMaxInflightBodyBytes
	}
	return cfg
}

// Clusters is what the server knows and learns of the clusters: the State
// its policies read, and the EPPs that failed a request (FailureRecorder,
// passive health).
type Clusters interface {
	State
	FailureRecorder
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

	router *routetable.Router
	// mem is what the policies the router compiles learn from the
	// requests routed.
	mem *clusterscore.Memory
	// decider decides where each request goes (its policies, and what they
	// know of the clusters).
	decider
	relay *relayer
	// remote keeps remote EPPs to what routing needs; admit bounds the
	// streams and bytes held at once.
	remote *remoteAnswers
	admit  *admission
	// obs learn what becomes of each request.
	obs     *observers
	metrics *Metrics
	maxBody int64
	logger  logr.Logger
	// keepEPP: the EPP's stream is kept for the response phase;
	// bodyAhead: a streamed response body goes to the gateway without
	// waiting for the EPP's answers (ResponsePhaseRelay).
	keepEPP, bodyAhead bool
	explain            bool
	// ports are the listeners of the shim pools' ports, which tell where a
	// stream arrived; phases says whether the gateway sends the response
	// phase. Either may be nil (tests): every stream then arrives at the
	// main listener, and nothing is said of response phases.
	ports  *shimPorts
	phases *responsePhaseWatch
	// workers run each response phase's pump.
	workers *workers
}

// newServer returns the ext_proc service: it routes by router's table,
// tells its policies what clusters knows of each cluster (and clusters of
// the EPPs that failed), and reaches the EPPs through relay. metrics may be
// nil. The router compiles the policies of the tables it publishes with
// cfg's thresholds and a memory of cfg's size, which the server's
// observers feed.
func newServer(router *routetable.Router, clusters Clusters, relay *relayer, cfg ServerConfig, metrics *Metrics, logger logr.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	mem := clusterscore.NewMemory(cfg.Memory)
	if err := router.SetScoring(routetable.Scoring{Thresholds: cfg.Scheduling, Memory: mem}); err != nil {
		return nil, err
	}
	outliers := newOutlierWatch(cfg.Outlier, metrics, logger)
	var state State = clusters
	if outliers != nil {
		state = ejectingState{State: clusters, w: outliers}
	}
	obs := newObservers(mem, clusters, metrics, logger)
	obs.outliers = outliers
	return &Server{
		router:    router,
		mem:       mem,
		decider:   decider{session: cfg.Session, state: state},
		relay:     relay,
		remote:    newRemoteAnswers(cfg.RemoteDestinations, cfg.StrippedHeaders, cfg.ForwardedMetadataNamespaces, metrics, logger),
		admit:     newAdmission(cfg.MaxStreams, cfg.MaxInflightBodyBytes, metrics, logger),
		obs:       obs,
		metrics:   metrics,
		maxBody:   cfg.MaxRequestBodyBytes,
		logger:    logger,
		keepEPP:   cfg.ResponsePhase != ResponsePhaseSkip,
		bodyAhead: cfg.ResponsePhase == "" || cfg.ResponsePhase == ResponsePhaseRelay,
		explain:   cfg.ExplainDecisions,
		workers:   newWorkers(),
	}, nil
}

// Close closes the connections to EPPs, and lets the workers go once the
// streams they serve have ended.
func (s *Server) Close() {
	s.relay.close()
	s.workers.stop()
}

// Retain keeps connections to the EPPs of t and lets the others go, and
// the observations of t's pools and clusters.
func (s *Server) Retain(t *routetable.Table) {
	s.retainObserved(t)
	s.obs.retain(t)
	s.obs.outliers.retain(t)
	keep := map[string]bool{}
	for _, c := range t.Clusters() {
		if c.EPP != "" {
			keep[c.EPP] = true
		}
	}
	s.relay.retain(keep)
}

// retainObserved forgets the observations and shares of the pools and
// clusters t no longer has.
func (s *Server) retainObserved(t *routetable.Table) {
	clusters, scopes := map[[2]string]bool{}, map[string]bool{}
	for b := range t.Backends {
		scopes[b.Scope()] = true
		for _, c := range b.Clusters {
			clusters[[2]string{b.Scope(), c.Name}] = true
		}
		if b.Local != nil {
			clusters[[2]string{b.Scope(), b.Local.Name}] = true
		}
	}
	s.mem.Observed.Retain(func(scope, cluster string) bool { return clusters[[2]string{scope, cluster}] })
	s.mem.Shares.Retain(func(scope string) bool { return scopes[scope] })
}

// Process serves one request's stream, step by step: read the request
// whole, decide where it goes, deliver it (the attempts of its clusters, or
// the sidecar's own answer), send the answer, and see the response phase
// through.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	if s.metrics != nil {
		s.metrics.streams.Inc()
		defer s.metrics.streams.Dec()
	}
	if !s.admit.enter() {
		return s.overLimit(stream, LimitStreams)
	}
	defer s.admit.leave()
	rec := newRecorder(stream, s.admit)
	defer rec.release()
	req, err := extproc.ReadRequest(rec, s.maxBody)
	start := time.Now()
	if err != nil {
		return s.unread(ctx, stream, err)
	}
	s.admit.admitted()

	d := s.decide(s.router.Table(), req, s.arrival(ctx), start, s.explain || s.logger.V(4).Enabled())
	t := s.obs.track(&d, start, s.explain)
	failed := true
	defer func() { t.finish(failed) }()
	resps := s.deliver(ctx, req, outbound{msgs: rec.msgs, raw: rec.raw}, t)
	if ctx.Err() != nil {
		t.abandon(nil)
		return status.FromContextError(ctx.Err()).Err()
	}
	if f := d.filters(t.outcome); f != nil {
		applyFilters(f, resps, req.Header, d.pathPrefix)
	}
	if err := extproc.SendAll(stream, resps); err != nil {
		t.abandon(err)
		return err
	}
	t.sent(req)
	err = s.respond(stream, req, resps, t)
	failed = err != nil && ctx.Err() == nil
	return err
}

// unread answers a request that could not be read whole: 413 for a body
// too large, else the stream's error.
func (s *Server) unread(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, err error) error {
	switch {
	case errors.Is(err, errOverBudget):
		return s.overLimit(stream, LimitBodyBytes)
	case errors.Is(err, extproc.ErrBodyTooLarge):
		s.metrics.request("", OutcomeError, http.StatusRequestEntityTooLarge)
		return stream.Send(extproc.ErrorResponse(http.StatusRequestEntityTooLarge, err.Error()))
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, extproc.ErrProtocol):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return err
}

// overLimit answers a stream beyond the sidecar's limit (admission) with
// 503. A stream refused before anything was read is answered once its
// request headers are in, as the protocol has the gateway wait for an
// answer to them.
func (s *Server) overLimit(stream extprocv3.ExternalProcessor_ProcessServer, limit string) error {
	s.metrics.request("", OutcomeOverLimit, http.StatusServiceUnavailable)
	if limit == LimitStreams {
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
	return stream.Send(extproc.ErrorResponse(http.StatusServiceUnavailable, "mci-sidecar is at its limit of "+limitText[limit]+"; retry"))
}

var limitText = map[string]string{
	LimitStreams:   "streams served at once",
	LimitBodyBytes: "request bytes buffered at once",
}

// respond sees the response phase through: relayed to the EPP that routed
// the request, or let through by the sidecar itself. It goes through the
// gateway's own stream (not the recorder, which would keep every response
// message), observed.
func (s *Server) respond(stream extprocv3.ExternalProcessor_ProcessServer, req *extproc.Request, resps []*extprocv3.ProcessingResponse, t *tracker) error {
	ps := &phaseStream{gatewayStream: stream}
	defer func() {
		if sent, known := ps.outcome(); known && (t.outcome == OutcomeRouted || t.outcome == OutcomeParent) {
			s.phases.ended(sent, req.ProtocolConfig)
		}
	}()
	gw := t.observe(ps)
	if t.live != nil {
		// The EPP that routed the request sees its response phase; the
		// request itself is not kept for it.
		return s.relayResponse(gw, t, req.ProtocolConfig, resps)
	}
	return req.PassThroughResponse(gw)
}

// arrival is where the connection of the stream of ctx arrived.
func (s *Server) arrival(ctx context.Context) routetable.Arrival {
	if s.ports == nil {
		return routetable.Arrival{Main: true}
	}
	return s.ports.arrival(ctx)
}

// serverOptions are the options of a gRPC server that serves Server: the
// frame codec and its buffers.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(extproc.FrameCodec{}), extproc.ServerBuffers()}
}

// gatewayStream is the gateway's stream in the response phase, whose
// messages are read and sent as frames.
type gatewayStream = extproc.FrameStream
