package sidecar

import (
	"errors"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/statelog"
)

// DefaultStrippedHeaders are the request headers that never go to a remote
// EPP: the client's credentials, which the remote EPP does not need to
// pick an endpoint (ServerConfig.StrippedHeaders adds to them).
var DefaultStrippedHeaders = []string{"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}

// remoteAnswers keeps remote EPPs to what routing needs: the request's
// credentials are stripped before it goes to them (forRemote), and their
// answers are filtered (eppanswer) before they go to the gateway; a
// refused answer is counted, and logged once per change per cluster.
type remoteAnswers struct {
	policy eppanswer.Policy
	// strip are the lower-case names of the headers stripped.
	strip   map[string]bool
	metrics *Metrics
	logger  logr.Logger
	// refusals are the clusters whose EPP's last answer was refused, by
	// reason.
	refusals statelog.Log[string]
}

func newRemoteAnswers(policy eppanswer.Policy, stripped []string, metrics *Metrics, logger logr.Logger) *remoteAnswers {
	r := &remoteAnswers{policy: policy, strip: map[string]bool{}, metrics: metrics, logger: logger}
	for _, h := range slices.Concat(DefaultStrippedHeaders, stripped) {
		r.strip[strings.ToLower(h)] = true
	}
	metrics.remotePolicy(policy)
	if policy.AllowLoopback {
		logger.Info("Remote EPPs may name loopback destinations: only for a ClusterSet on one machine, never in a cluster (mci_sidecar_remote_destinations_loopback_allowed is 1)")
	}
	if len(policy.Denied) == 0 {
		logger.Info("No denied destination ranges are set: remote EPPs may name addresses of this cluster's Services and Pods as destinations; set --service-cluster-ip-range and --cluster-cidr")
	}
	return r
}

// filter returns the answer the gateway gets for resps, the answer of the
// EPP of remote cluster c to req, or a *eppanswer.Refusal (counted and
// logged).
func (r *remoteAnswers) filter(c *routetable.Cluster, req *extproc.Request, resps []*extprocv3.ProcessingResponse) ([]*extprocv3.ProcessingResponse, error) {
	out, err := r.policy.Filter(req, resps, eppanswer.Published{Port: c.TargetPort}, c.Name)
	if err != nil {
		r.refused(c, err)
		return nil, err
	}
	if was, lasted := r.refusals.Clear(c.Name); was {
		r.logger.Info("A remote EPP's answer is accepted again", "cluster", c.Name, "pool", c.Pool, "epp", c.EPP, "after", lasted)
	}
	return out, nil
}

// parent checks the parent gateway address of remote cluster c as a
// destination: the exporter published it, but it must not be an address
// no remote cluster may name.
func (r *remoteAnswers) parent(c *routetable.Cluster) error {
	if err := r.policy.CheckEndpoint(c.Parent, 0); err != nil {
		r.refused(c, err)
		return err
	}
	return nil
}

// refused counts and logs, once per change of reason per cluster, an
// answer of c's EPP that was refused (err, a *eppanswer.Refusal).
func (r *remoteAnswers) refused(c *routetable.Cluster, err error) {
	reason := eppanswer.ReasonProtocol
	var ref *eppanswer.Refusal
	if errors.As(err, &ref) {
		reason = ref.Reason
	}
	r.metrics.answerRefused(c.Name, reason)
	if r.refusals.Observe(c.Name, reason, "").Loud() {
		r.logger.Info("Refused a remote EPP's answer; the request goes to the next cluster or follows its failure mode (counted in mci_sidecar_epp_answers_refused_total; logged again when the reason changes)",
			"cluster", c.Name, "pool", c.Pool, "epp", c.EPP, "mode", c.Mode, "reason", reason, "err", err)
	}
}

// stripHeaders returns headers without those r strips; the same slice
// when there are none.
func (r *remoteAnswers) stripHeaders(headers []*corev3.HeaderValue) []*corev3.HeaderValue {
	i := slices.IndexFunc(headers, r.stripped)
	if i < 0 {
		return headers
	}
	out := make([]*corev3.HeaderValue, i, len(headers))
	copy(out, headers[:i])
	for _, h := range headers[i+1:] {
		if !r.stripped(h) {
			out = append(out, h)
		}
	}
	return out
}

func (r *remoteAnswers) stripped(h *corev3.HeaderValue) bool {
	return r.strip[strings.ToLower(h.GetKey())]
}
