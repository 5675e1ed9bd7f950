package epp

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// Server is the EPP's ext_proc service: for each request stream it reads the
// headers and the whole body (FULL_DUPLEX_STREAMED), asks the Picker, and
// answers with the destination and the (possibly rewritten) body, or with an
// immediate error response. Everything happens on the stream's own
// goroutine, so a stream the gateway abandons ends with nothing left behind.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	picker  *Picker
	metrics *Metrics
	maxBody int64
	logger  logr.Logger

	// loggedObjectives are the unknown objectives already logged, so that
	// each is logged once; bounded, since callers choose the names.
	mu               sync.Mutex
	loggedObjectives sets.Set[string]
}

// maxLoggedObjectives bounds Server.loggedObjectives.
const maxLoggedObjectives = 100

// NewServer returns the ext_proc service. maxBody bounds request bodies (<=
// 0: DefaultMaxRequestBodyBytes); metrics may be nil.
func NewServer(picker *Picker, metrics *Metrics, maxBody int64, logger logr.Logger) *Server {
	if maxBody <= 0 {
		maxBody = requestmodel.DefaultMaxRequestBodyBytes
	}
	return &Server{picker: picker, metrics: metrics, maxBody: maxBody, logger: logger, loggedObjectives: sets.New[string]()}
}

// unknownObjective counts a request that names an objective the pool does
// not have, and logs each such name once (the first maxLoggedObjectives
// names). Upstream EPPs serve such a request with the default priority, 0,
// and so does mci: the request is served as if it named no objective.
func (s *Server) unknownObjective(name string) {
	if s.metrics != nil {
		s.metrics.unknownObjectives.Inc()
	}
	s.mu.Lock()
	first := !s.loggedObjectives.Has(name) && s.loggedObjectives.Len() < maxLoggedObjectives
	if first {
		s.loggedObjectives.Insert(name)
	}
	s.mu.Unlock()
	if first {
		s.logger.Info("A request names an InferenceObjective the pool does not have; serving it with the default priority (0), as if it named none. Logged once per name; mci_epp_unknown_objective_requests_total counts them all",
			"objective", name, "header", requestmodel.ObjectiveHeader)
	}
}

func objectiveName(d *Decision) string {
	if d.Objective != nil {
		return d.Objective.Name
	}
	return ""
}

// Process serves one request's stream.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	if s.metrics != nil {
		s.metrics.streams.Inc()
		defer s.metrics.streams.Dec()
	}
	req, err := extproc.ReadRequest(stream, s.maxBody)
	start := time.Now()
	switch {
	case errors.Is(err, extproc.ErrBodyTooLarge):
		return s.refuse(stream, nil, &Error{Code: http.StatusRequestEntityTooLarge, Err: err}, start)
	case ctx.Err() != nil:
		// The gateway went away (client cancel, timeout): nothing to answer.
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, extproc.ErrProtocol):
		return status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return err
	}

	subset, hasSubset, err := extproc.SubsetHint(req.Metadata)
	if err != nil {
		// The gateway's hint is broken; picking outside it would break the
		// protocol, so nothing can be picked.
		return s.refuse(stream, nil, &Error{Code: http.StatusServiceUnavailable, Err: err}, start)
	}
	d, err := s.picker.Pick(req.Body, requestmodel.ReadRequestHeaders(req.Header), subset, hasSubset, start)
	if d != nil && d.UnknownObjective != "" {
		s.unknownObjective(d.UnknownObjective)
	}
	if err != nil {
		return s.refuse(stream, d, err, start)
	}
	// The request is in flight from its pick until its response has
	// ended, or the gateway ended the stream without one.
	inFlight := s.metrics.startRequest(req.Header(extproc.RelayedHeader))
	defer inFlight.end()
	if err := extproc.SendAll(stream, req.Route(d.Endpoints, d.Body)); err != nil {
		return err
	}
	if s.metrics != nil {
		s.metrics.observe(d, http.StatusOK, time.Since(start))
	}
	if log := s.logger.V(4); log.Enabled() {
		log.Info("Routed request", "path", req.Header(":path"), "model", d.Model, "targetModel", d.TargetModel, "rewrittenBy", d.RewrittenBy,
			"criticality", d.Criticality, "objective", objectiveName(d), "fairnessID", d.FairnessID, "endpoints", d.Endpoints)
	}
	return s.passResponse(stream, req, d, inFlight)
}

// passResponse answers the response phase, letting the response through
// unchanged, until the gateway ends the stream. The response's last
// message ends the request's time in flight; the first that reports the
// endpoint that served it is counted against the pick.
func (s *Server) passResponse(stream extprocv3.ExternalProcessor_ProcessServer, req *extproc.Request, d *Decision, inFlight *requestInFlight) error {
	reported := false
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if !reported {
			reported = true
			served := extproc.ServedEndpoint(msg.GetMetadataContext())
			s.metrics.served(servedResult(served, d.Endpoints))
			if log := s.logger.V(4); log.Enabled() && served != "" {
				log.Info("Request served", "path", req.Header(":path"), "served", served, "endpoints", d.Endpoints)
			}
		}
		if extproc.EndsResponse(msg) {
			inFlight.end()
		}
		resp, err := extproc.PassThrough(msg, req.ProtocolConfig)
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// servedResult says how the endpoint the gateway reports as having served
// a request relates to the endpoints picked for it.
func servedResult(served string, picked []string) string {
	switch {
	case served == "":
		return ServedUnreported
	case len(picked) > 0 && served == picked[0]:
		return ServedPicked
	case slices.Contains(picked, served):
		return ServedFallback
	}
	return ServedOther
}

// refuse answers with an immediate error response and ends the stream: the
// gateway sends the response to the client and stops processing.
func (s *Server) refuse(stream extprocv3.ExternalProcessor_ProcessServer, d *Decision, err error, start time.Time) error {
	code := StatusCode(err)
	if s.metrics != nil {
		s.metrics.observe(d, code, time.Since(start))
	}
	if log := s.logger.V(3); log.Enabled() {
		args := []any{"code", code, "reason", err.Error()}
		if d != nil {
			args = append(args, "model", d.Model, "criticality", d.Criticality, "objective", objectiveName(d), "fairnessID", d.FairnessID)
		}
		log.Info("Refused request", args...)
	}
	return stream.Send(extproc.ErrorResponse(code, err.Error()))
}
