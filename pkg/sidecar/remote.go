package sidecar

import (
	"errors"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/statelog"
)

// DefaultStrippedHeaders are the request headers that never go to a remote
// EPP: the client's credentials, which the remote EPP does not need to
// pick an endpoint (ServerConfig.StrippedHeaders adds to them).
var DefaultStrippedHeaders = []string{"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}

// The ranges label of mci_sidecar_remote_destination_denied_ranges: what
// the ranges no remote destination may be in are.
const (
	RangesServices = "services"
	RangesPods     = "pods"
	RangesOther    = "other"
)

// remoteAnswers keeps remote EPPs to what routing needs: the request's
// credentials and the gateway's metadata are stripped before it goes to
// them (forRemote, message), and their answers are filtered (eppanswer)
// before they go to the gateway; a refused answer is counted, and logged
// once per change per cluster.
type remoteAnswers struct {
	policy eppanswer.Policy
	// strip are the lower-case names of the headers stripped.
	strip map[string]bool
	// forward are the filter metadata namespaces of the gateway's
	// metadata_context that remote EPPs get.
	forward map[string]bool
	metrics *Metrics
	logger  logr.Logger
	// refusals are the clusters whose EPP's last answer was refused, by
	// reason.
	refusals statelog.Log[string]
}

func newRemoteAnswers(policy eppanswer.Policy, stripped, forwarded []string, metrics *Metrics, logger logr.Logger) *remoteAnswers {
	r := &remoteAnswers{policy: policy, strip: map[string]bool{}, forward: map[string]bool{}, metrics: metrics, logger: logger}
	for _, h := range slices.Concat(DefaultStrippedHeaders, stripped) {
		r.strip[strings.ToLower(h)] = true
	}
	for _, ns := range forwarded {
		// The subset hint lists this cluster's endpoints, which a remote
		// EPP does not have (ServerConfig.ForwardedMetadataNamespaces).
		if ns != extproc.SubsetHintNamespace {
			r.forward[ns] = true
		}
	}
	metrics.remotePolicy(policy)
	if policy.AllowLoopback {
		logger.Info("Remote EPPs may name loopback destinations: only for a ClusterSet on one machine, never in a cluster (mci_sidecar_remote_destinations_loopback_allowed is 1)")
	}
	var unset []string
	if len(policy.ServiceRanges) == 0 {
		unset = append(unset, "--service-cluster-ip-range")
	}
	if len(policy.PodRanges) == 0 {
		unset = append(unset, "--cluster-cidr")
	}
	if len(unset) > 0 {
		logger.Info("This cluster's own ranges are not all set: remote EPPs may name its addresses in the missing ones as destinations (mci_sidecar_remote_destination_denied_ranges is 0 for them)", "unset", unset)
	}
	return r
}

// filter returns the answer the gateway gets for resps, the answer of the
// EPP of remote cluster c to req, or a *eppanswer.Refusal (counted and
// logged).
func (r *remoteAnswers) filter(c *routetable.Cluster, req *extproc.Request, resps []*extprocv3.ProcessingResponse) ([]*extprocv3.ProcessingResponse, error) {
	out, err := r.policy.Filter(req, resps, c.Published, c.Name)
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

// message returns m as a remote EPP gets it: without the attributes the
// gateway sends (they describe the client's connection to this gateway)
// and with only the metadata the EPP protocol and the operator give a
// remote EPP (metadata); m itself when it carries nothing else.
func (r *remoteAnswers) message(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest {
	md := r.metadata(m.GetMetadataContext())
	h := m.GetRequestHeaders()
	if md == m.GetMetadataContext() && len(m.GetAttributes()) == 0 && len(h.GetAttributes()) == 0 {
		return m
	}
	out := &extprocv3.ProcessingRequest{
		Request:            m.Request,
		MetadataContext:    md,
		ObservabilityMode:  m.ObservabilityMode,
		ProtocolConfig:     m.ProtocolConfig,
		FlowControlInit:    m.FlowControlInit,
		ClientWindowUpdate: m.ClientWindowUpdate,
	}
	keepUnknown(out, m)
	if len(h.GetAttributes()) > 0 {
		headers := &extprocv3.HttpHeaders{Headers: h.Headers, EndOfStream: h.EndOfStream}
		keepUnknown(headers, h)
		out.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers}
	}
	return out
}

// metadata returns the gateway's metadata_context md as a remote EPP gets
// it: the filter metadata namespaces r forwards and, of the EPP protocol's
// own namespace, the endpoint that served the request (the response
// phase's report of the destination that EPP picked); nothing else, since
// a gateway's metadata may carry what its other filters learnt of the
// client (a token's claims, a tenant), and the subset hint names endpoints
// of this cluster. md itself when it carries nothing else; nil when
// nothing is left.
func (r *remoteAnswers) metadata(md *corev3.Metadata) *corev3.Metadata {
	if md == nil || r.forwardsWhole(md) {
		return md
	}
	out := &corev3.Metadata{}
	for ns, v := range md.GetFilterMetadata() {
		switch {
		case r.forward[ns]:
		case ns == extproc.DestinationEndpointNamespace && v.GetFields()[extproc.DestinationEndpointServedKey] != nil:
			v = &structpb.Struct{Fields: map[string]*structpb.Value{extproc.DestinationEndpointServedKey: v.GetFields()[extproc.DestinationEndpointServedKey]}}
		default:
			continue
		}
		if out.FilterMetadata == nil {
			out.FilterMetadata = map[string]*structpb.Struct{}
		}
		out.FilterMetadata[ns] = v
	}
	for ns, v := range md.GetTypedFilterMetadata() {
		if r.forward[ns] {
			if out.TypedFilterMetadata == nil {
				out.TypedFilterMetadata = map[string]*anypb.Any{}
			}
			out.TypedFilterMetadata[ns] = v
		}
	}
	if out.FilterMetadata == nil && out.TypedFilterMetadata == nil {
		return nil
	}
	return out
}

// forwardsWhole says whether md holds nothing that metadata removes.
func (r *remoteAnswers) forwardsWhole(md *corev3.Metadata) bool {
	if len(md.ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	for ns, v := range md.GetFilterMetadata() {
		if !r.forward[ns] && (ns != extproc.DestinationEndpointNamespace || len(v.GetFields()) != 1 || v.GetFields()[extproc.DestinationEndpointServedKey] == nil) {
			return false
		}
	}
	for ns := range md.GetTypedFilterMetadata() {
		if !r.forward[ns] {
			return false
		}
	}
	return true
}
