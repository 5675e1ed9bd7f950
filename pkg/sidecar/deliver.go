package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/responserelay"
	"github.com/mci-dev/mci/pkg/routetable"
)

// deliver carries out t's decision and returns the answer for the gateway
// (nil when the gateway went away): the sidecar's own answer, or the
// attempts of the decision's clusters in turn until one takes the request.
// When none does, a FailOpen backend lets the request go on without a
// destination, a FailClose one answers 503 (the last EPP's own 503 when
// there is one).
func (s *Server) deliver(ctx context.Context, req *extproc.Request, msgs outbound, t *tracker) []*extprocv3.ProcessingResponse {
	d := t.d
	if d.answers() {
		t.answered(d.outcome, d.code)
		return d.answer(req)
	}
	var last *refusal
	r := &replay{sent: msgs, local: d.local, filter: s.remote}
	for _, c := range d.attempts() {
		resps, err := s.attempt(ctx, req, c, r, t)
		if resps != nil || ctx.Err() != nil {
			return resps
		}
		var ref *refusal
		if errors.As(err, &ref) {
			last = ref
		}
	}
	fail := func(format string, args ...any) []*extprocv3.ProcessingResponse {
		t.answered(OutcomeUnavailable, http.StatusServiceUnavailable)
		return []*extprocv3.ProcessingResponse{extproc.ErrorResponse(http.StatusServiceUnavailable, fmt.Sprintf(format, args...))}
	}
	switch refusal, filtered := filterRefusal(d.backend, t.tried); {
	case d.failOpen && filtered:
		// FailOpen has tried the clusters the policy left out.
		return fail("%s", refusal)
	case d.failOpen:
		// Nothing can pick an endpoint: let the request go on unchanged,
		// without a destination, to whatever the gateway does on its own
		// (for a local pool, its own load balancing over the pool, which
		// is what FailOpen means for a single cluster; for a remote one
		// there is nothing, and the gateway answers 503 itself).
		t.answered(OutcomeFailOpen, http.StatusOK)
		return req.Forward(nil, nil, req.Body)
	case last != nil:
		t.answered(OutcomeUnavailable, http.StatusServiceUnavailable)
		return []*extprocv3.ProcessingResponse{last.resp}
	case len(t.tried) == 0:
		return fail("%s has no cluster available", d.backend)
	}
	return fail("%s: no cluster's EPP answered (tried %v)", d.backend, t.tried)
}

// attempt sends the request to cluster c, and returns the answer when c
// took it: its EPP's whole answer (EndpointMode), a destination or an
// error of its own, or, in ParentMode, its parent gateway as the
// destination. Without an answer, the error says why c did not take it.
func (s *Server) attempt(ctx context.Context, req *extproc.Request, c *routetable.Cluster, r *replay, t *tracker) ([]*extprocv3.ProcessingResponse, error) {
	sent := t.attempting(c)
	if c.Mode == v1alpha1.RoutingModeParent {
		if err := s.remote.parent(c); err != nil {
			t.failed(ctx, c, err)
			return nil, err
		}
		t.routed(c, OutcomeParent, sent, nil)
		return req.Route([]string{c.Parent}, nil), nil
	}
	limit := 0
	if !c.Local {
		limit = eppanswer.BodyLimit(len(req.Body))
	}
	resps, live, err := s.relay.relay(ctx, c.EPP, r.to(c), s.keepEPP, limit)
	if !c.Local {
		resps, err = s.fromRemote(c, req, resps, live, err)
	}
	switch {
	case err != nil:
		t.failed(ctx, c, err)
		return nil, err
	case resps[0].GetImmediateResponse() != nil:
		t.refused(c, int(resps[0].GetImmediateResponse().GetStatus().GetCode()))
	default:
		t.routed(c, OutcomeRouted, sent, live)
	}
	return resps, nil
}

// fromRemote is what the gateway may get of the answer of remote cluster
// c's EPP (resps and live, or err): the answer eppanswer builds, or a
// refusal, which resets the EPP's stream. A 503 (a *refusal) keeps only
// its status, in the sidecar's own words.
func (s *Server) fromRemote(c *routetable.Cluster, req *extproc.Request, resps []*extprocv3.ProcessingResponse, live *responserelay.EPPStream, err error) ([]*extprocv3.ProcessingResponse, error) {
	var ref *refusal
	switch {
	case errors.As(err, &ref):
		return nil, &refusal{resp: eppanswer.Immediate(http.StatusServiceUnavailable, c.Name)}
	case err != nil:
		var refused *eppanswer.Refusal
		if errors.As(err, &refused) || status.Code(err) == codes.ResourceExhausted {
			// An answer too large to read (past the relay's bounds, or a
			// message past what gRPC receives) is refused as any other.
			s.remote.refused(c, err)
		}
		return nil, err
	}
	out, err := s.remote.filter(c, req, resps)
	if err != nil && live != nil {
		live.Reset(err)
	}
	return out, err
}
