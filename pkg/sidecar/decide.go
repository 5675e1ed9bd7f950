package sidecar

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routetable"
)

// decision is where a request goes, decided before anything is sent:
// either the sidecar's own answer (no route, an invalid backend, a
// redirect, a shed request), or the clusters to try in turn.
type decision struct {
	// rule is the HTTPRoute rule the request matched (nil in shim mode, or
	// when none matched), pathPrefix what its PathPrefix match matched,
	// and backend the backendRef picked (or the shim pool's).
	rule       *routetable.Rule
	pathPrefix string
	backend    *routetable.Backend
	// local names the local cluster of the table, which the request
	// relayed to remote EPPs carries (extproc.RelayedHeader).
	local string

	// outcome is set for the sidecar's own answer: its code and details,
	// or the filters whose redirect answers. Nothing is relayed.
	outcome  string
	code     int
	details  string
	redirect *routetable.Filters
	// shimUnresolved: in shim mode, the pool of the request could not be
	// told (details say why).
	shimUnresolved bool

	// Without an own answer: the clusters of order are tried in turn; a
	// FailOpen backend (failOpen) then tries those of fallback, and
	// then lets the request go on without a destination.
	order    []*routetable.Cluster
	failOpen bool
	fallback []*routetable.Cluster
	// needs are the policy's, and req what it learned of the request, for
	// the observations and Memory.Served.
	needs Needs
	req   clusterscore.Request

	// explanation explains the order, when one was asked for.
	explanation string
	// promptErr says why the prompt could not be read (routed without
	// prefix affinity).
	promptErr error
}

// answers says whether the sidecar answers the request itself.
func (d *decision) answers() bool { return d.outcome != "" }

// answer is the sidecar's own answer to req.
func (d *decision) answer(req *extproc.Request) []*extprocv3.ProcessingResponse {
	if d.redirect != nil {
		return []*extprocv3.ProcessingResponse{redirectResponse(d.redirect, req.Header, d.pathPrefix)}
	}
	return []*extprocv3.ProcessingResponse{extproc.ErrorResponse(d.code, d.details)}
}

// attempts are the clusters to try, in order: the policy's order, then,
// for a FailOpen backend, the fallback.
func (d *decision) attempts() []*routetable.Cluster {
	if !d.failOpen {
		return d.order
	}
	return append(slices.Clip(d.order), d.fallback...)
}

// filters are the HTTPRoute filters of the backend that a request going on
// upstream (outcome) goes through; nil in shim mode, where the gateway
// applies the route's filters itself.
func (d *decision) filters(outcome string) *routetable.Filters {
	if d.rule == nil || d.backend == nil || d.backend.Filters() == nil {
		return nil
	}
	switch outcome {
	case OutcomeRouted, OutcomeParent, OutcomeFailOpen:
		return d.backend.Filters()
	}
	return nil
}

func (d *decision) routeName() string {
	if d.rule == nil {
		return ""
	}
	return fmt.Sprintf("%s#%d", d.rule.Route, d.rule.Index)
}

func (d *decision) backendName() string {
	if d.backend == nil {
		return ""
	}
	return d.backend.String()
}

// decider decides where requests go: by the routing table, with the
// policies of its backends and what they know of the clusters.
type decider struct {
	// session says where a request's session key is.
	session clusterscore.SessionSpec
	state   State
}

// decide decides where req goes by the table tbl at time now, in order:
// the route (the rule that matches, its redirect; in shim mode the pool the
// gateway names, or the port it connected to, at), the backendRef by weight (its redirect), then the order
// of its clusters by its policy (which may shed the request), explained
// when explain is set. It only decides: it sends, logs and counts nothing.
func (dc decider) decide(tbl *routetable.Table, req *extproc.Request, at routetable.Arrival, now time.Time, explain bool) decision {
	d := decision{local: tbl.LocalCluster()}
	if d.route(tbl, req, at) {
		return d
	}
	dc.orderClusters(&d, req, now, explain)
	return d
}

// own makes d the sidecar's own answer.
func (d *decision) own(code int, outcome, format string, args ...any) bool {
	d.code, d.outcome, d.details = code, outcome, fmt.Sprintf(format, args...)
	return true
}

// route finds the backend of the request: its shim pool, or the backendRef
// of the HTTPRoute rule it matches. It reports whether that already
// answers the request (no route, an invalid backend, a redirect).
func (d *decision) route(tbl *routetable.Table, req *extproc.Request, at routetable.Arrival) bool {
	attrs := attrsFromRequest(req)
	if tbl.ShimMode() {
		be, code, msg := tbl.ShimFor(shimPoolOf(req), at, &attrs)
		if be == nil {
			d.shimUnresolved = true
			return d.own(code, OutcomeNoRoute, "%s", msg)
		}
		if req.Header(extproc.RelayedHeader) != "" {
			// Another cluster's sidecar chose this cluster: only the
			// pool's local EPP may answer, and a refusal is better than
			// FailOpen, so that the relaying sidecar tries its next
			// cluster.
			be = be.LocalOnly()
		}
		if be.Invalid != "" {
			return d.own(http.StatusInternalServerError, OutcomeInvalidBackend, "%s: %s", be, be.Invalid)
		}
		d.backend = be
	} else {
		rule, prefix := tbl.Match(&attrs)
		if rule == nil {
			return d.own(http.StatusNotFound, OutcomeNoRoute, "no HTTPRoute rule matches host %q path %q", attrs.Host, attrs.Path)
		}
		d.rule, d.pathPrefix = rule, prefix
		switch {
		case rule.Invalid != "":
			return d.own(http.StatusInternalServerError, OutcomeInvalidBackend, "HTTPRoute %s: %s", rule.Route, rule.Invalid)
		case rule.Redirect() != nil:
			d.redirect = rule.Redirect()
			d.outcome, d.code = OutcomeRedirected, d.redirect.RedirectStatus()
			return true
		}
		d.backend = rule.PickBackend()
		switch be := d.backend; {
		case be == nil:
			return d.own(http.StatusInternalServerError, OutcomeInvalidBackend, "HTTPRoute %s rule %d has no backendRef with a weight", rule.Route, rule.Index)
		case be.Invalid != "":
			return d.own(http.StatusInternalServerError, OutcomeInvalidBackend, "HTTPRoute %s: %s", rule.Route, be.Invalid)
		case be.Filters().RedirectStatus() != 0:
			d.redirect = be.Filters()
			d.outcome, d.code = OutcomeRedirected, d.redirect.RedirectStatus()
			return true
		}
	}

	return false
}

// orderClusters asks the backend's policy for the clusters in order, and
// what FailOpen adds, or sheds the request.
func (dc decider) orderClusters(d *decision, req *extproc.Request, now time.Time, explain bool) {
	be := d.backend
	if outcome, msg, ok := outsideFilter(be); ok {
		d.own(http.StatusServiceUnavailable, outcome, "%s", msg)
		return
	}
	policy := policyOf(be, dc.session)
	d.needs = policy.Needs()
	pr := PickRequest{Now: now, Header: req.Header, Body: req.Body, Cluster: d.local}
	if d.needs.Criticality || d.needs.Prompt {
		// One walk of the body for both the model and the prompt.
		body, err := requestmodel.ReadBody(req.Body)
		if body != nil {
			pr.Prompt, pr.Model = body.Prompt(), body.Model()
		}
		if d.needs.Criticality {
			model := ""
			if err == nil {
				model = body.Model()
			}
			pr.Criticality = be.Criticality(model, requestmodel.ReadRequestHeaders(req.Header).Objective)
		}
	}
	var ex *clusterscore.Explanation
	if explain {
		ex = &clusterscore.Explanation{}
	}
	p, err := policy.pick(be, pr, dc.state, ex)
	d.order, d.req, d.promptErr = p.order, p.req, p.promptErr
	if ex != nil {
		d.explanation = ex.String()
	}
	if errors.Is(err, ErrShed) {
		d.own(http.StatusTooManyRequests, OutcomeShed, "%s: %v", be, err)
		return
	}
	if be.FailureMode == poolv1.FailOpen {
		// The clusters the policy left out (known unhealthy, or without
		// capacity) are better than nothing: the health they were left
		// out for may be stale.
		d.failOpen = true
		d.fallback = withoutOrdered(policy.FailOpen(be), d.order)
	}
}

// withoutOrdered is fallback without the clusters of order: searched in
// order for a handful, else looked up in a set, so that a backend of
// 1,000 clusters does not search 1,000 times through 1,000.
func withoutOrdered(fallback, order []*routetable.Cluster) []*routetable.Cluster {
	if len(order) <= 16 {
		return slices.DeleteFunc(fallback, func(c *routetable.Cluster) bool { return slices.Contains(order, c) })
	}
	in := make(map[*routetable.Cluster]bool, len(order))
	for _, c := range order {
		in[c] = true
	}
	return slices.DeleteFunc(fallback, func(c *routetable.Cluster) bool { return in[c] })
}
