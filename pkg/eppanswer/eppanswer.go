// Package eppanswer decides what of the answer of another cluster's
// Endpoint Picker reaches the gateway. An exporter is untrusted (a tenant
// that exports a pool, a compromised member, anyone on the path of a
// plaintext link), while the gateway dials whatever destination an answer
// names and applies every mutation in it. So of a remote EPP's answer the
// sidecar keeps only what routing needs, checks it, and builds the answer
// the gateway gets itself:
//
//   - the destination (header x-gateway-destination-endpoint and dynamic
//     metadata envoy.lb/x-gateway-destination-endpoint, which must agree):
//     IP literals on the port the exporter published for the pool, whose
//     address is one the exporter published of the pool's endpoints (an
//     address of the import's endpointAddresses for that cluster, or in a
//     /24 or /64 prefix it lists: pkg/publishedaddrs), never loopback,
//     link-local, unspecified, multicast, a NAT64 translation or a denied
//     range (the importing cluster's own Service and Pod ranges). The
//     published addresses bound what a hostile exporter can aim the
//     gateway at to its own pool's pods; the ranges keep even those away
//     from what no remote cluster may name, should an exporter publish
//     them;
//   - a rewritten request body only when it differs from the request's in
//     its top-level "model" string alone (an exporter's model rewrite);
//   - an immediate response only as a status the protocol and the sidecar
//     give meaning to (400, 404, 413, 429, 503), with the sidecar's own
//     body.
//
// Everything else (other header mutations, other dynamic metadata, mode
// overrides, trailers, a response's headers and body) is dropped. It is a
// pure package: the sidecar counts and logs what it refuses.
//
// The exporter publishes the address of every pod its pool selects, ready
// or not, so a pod its EPP picks the moment it becomes ready is already
// published. A pod newer than what the importing sidecar holds (created
// since the import last changed there, typically a second or two) is
// refused as unpublished_destination like any other: the sidecar counts
// and logs the refusal and tries the request on the next cluster the
// decision holds; with none left, FailClose answers 503 and FailOpen lets
// the request go on without a destination (for a remote pool the gateway
// then answers 503 itself). The destination never reaches the gateway.
package eppanswer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/publishedaddrs"
)

// Reasons an answer is refused: the reason label of
// mci_sidecar_epp_answers_refused_total.
const (
	// ReasonNoDestination: the answer routes the request but names no
	// destination.
	ReasonNoDestination = "no_destination"
	// ReasonConflictingDestinations: the header and the metadata name
	// different destinations, which the protocol forbids.
	ReasonConflictingDestinations = "conflicting_destinations"
	// ReasonUnpublishedDestination: a destination is not an IP literal on
	// the pool's published port, or its address is not among those the
	// exporter published of the pool's endpoints.
	ReasonUnpublishedDestination = "unpublished_destination"
	// ReasonForbiddenDestination: a destination is in a range no remote
	// EPP may name (loopback, link-local, the local cluster's ranges...).
	ReasonForbiddenDestination = "forbidden_destination"
	// ReasonBodyMutation: the request body was changed beyond its model.
	ReasonBodyMutation = "body_mutation"
	// ReasonImmediateStatus: an immediate response of a status that does
	// not pass.
	ReasonImmediateStatus = "immediate_status"
	// ReasonProtocol: an answer the protocol does not allow where it came
	// (a request phase's answer in the response phase), or too large.
	ReasonProtocol = "protocol_violation"
)

// Reasons lists every reason, for metrics that start at zero.
var Reasons = []string{ReasonNoDestination, ReasonConflictingDestinations, ReasonUnpublishedDestination, ReasonForbiddenDestination, ReasonBodyMutation, ReasonImmediateStatus, ReasonProtocol}

// MaxDestinations bounds the endpoints of one destination (the primary and
// its fallbacks).
const MaxDestinations = 16

// maxDestinationLen bounds the destination value read: MaxDestinations
// IPv6 endpoints with brackets and ports fit.
const maxDestinationLen = MaxDestinations * 56

// MaxBodyGrowth is how much longer than the request's body a remote EPP's
// rewritten body may be beyond twice its length (a JSON encoder may escape
// what the client did not): RelayLimit.
const MaxBodyGrowth = 64 << 10

// BodyLimit is the most body bytes a remote EPP's answer to a request body
// of n bytes may stream back; the relay stops reading past it.
func BodyLimit(n int) int { return 2*n + MaxBodyGrowth }

// Refusal is why an answer was refused.
type Refusal struct {
	// Reason is one of the Reason constants.
	Reason string
	// Detail says what was refused, for a person.
	Detail string
}

func (r *Refusal) Error() string { return fmt.Sprintf("%s: %s", r.Reason, r.Detail) }

func refuse(reason, format string, args ...any) *Refusal {
	return &Refusal{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Policy is what a remote EPP's destinations are checked against, beyond
// what its exporter published.
type Policy struct {
	// ServiceRanges and PodRanges are the importing cluster's own Service
	// and Pod ranges, and Denied what other ranges the operator names (the
	// nodes' network, say): no remote destination may be in any of them.
	ServiceRanges, PodRanges, Denied []netip.Prefix
	// AllowLoopback accepts loopback destinations. Only for a ClusterSet
	// on one machine, where every pod has a loopback address
	// (test/localclusterset); a real cluster never routes to a remote
	// cluster's pod through loopback.
	AllowLoopback bool
}

// Published is what the exporter published of the pool, in the import,
// that a destination must match. Built once per routing table, never per
// request.
type Published struct {
	// Port is the pool's target port (targetPortNumber); 0 when the
	// import carries none, and then no destination is accepted.
	Port int32
	// Addresses are the addresses of the pool's endpoints (the import's
	// endpointAddresses); empty when the import carries none (an exporter
	// that publishes none, or a list that did not parse), and then no
	// destination is accepted.
	Addresses publishedaddrs.Set
}

// nat64 are the translation prefixes (RFC 6052, RFC 8215): their
// addresses name IPv4 hosts, never a remote pod.
var nat64 = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48")}

var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// CheckEndpoint checks one endpoint "ip:port": an IP literal the policy
// allows, on port (any port when port is 0: a parent gateway's address,
// which the import carries whole).
func (p *Policy) CheckEndpoint(endpoint string, port int32) error {
	_, err := p.checkEndpoint(endpoint, port)
	return err
}

// checkEndpoint is CheckEndpoint, which also returns the endpoint's
// address (IPv4-mapped IPv6 as IPv4).
func (p *Policy) checkEndpoint(endpoint string, port int32) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(endpoint)
	if err != nil {
		return netip.Addr{}, refuse(ReasonUnpublishedDestination, "%q is not an ip:port", endpoint)
	}
	a := ap.Addr()
	if a.Zone() != "" {
		return netip.Addr{}, refuse(ReasonForbiddenDestination, "%s has an IPv6 zone", endpoint)
	}
	// An IPv4-mapped IPv6 address reaches the IPv4 host.
	a = a.Unmap()
	switch {
	case a.IsUnspecified(), a.IsMulticast(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast(), a == broadcast:
		return netip.Addr{}, refuse(ReasonForbiddenDestination, "%s is an unspecified, multicast, link-local or broadcast address", endpoint)
	case a.IsLoopback() && !p.AllowLoopback:
		return netip.Addr{}, refuse(ReasonForbiddenDestination, "%s is a loopback address", endpoint)
	case a.Is4() && a.As4()[0] == 0:
		return netip.Addr{}, refuse(ReasonForbiddenDestination, "%s is in 0.0.0.0/8", endpoint)
	}
	for _, n := range nat64 {
		if n.Contains(a) {
			return netip.Addr{}, refuse(ReasonForbiddenDestination, "%s is a NAT64 address", endpoint)
		}
	}
	for _, ranges := range [...][]netip.Prefix{p.ServiceRanges, p.PodRanges, p.Denied} {
		for _, d := range ranges {
			if d.Contains(a) {
				return netip.Addr{}, refuse(ReasonForbiddenDestination, "%s is in the denied range %s", endpoint, d)
			}
		}
	}
	if ap.Port() == 0 || (port != 0 && int32(ap.Port()) != port) {
		return netip.Addr{}, refuse(ReasonUnpublishedDestination, "%s is not on the pool's published port %d", endpoint, port)
	}
	return a, nil
}

// Destinations checks a destination value "ip:port[,ip:port...]" against
// pub and returns its endpoints.
func (p *Policy) Destinations(value string, pub Published) ([]string, error) {
	if len(value) > maxDestinationLen {
		return nil, refuse(ReasonUnpublishedDestination, "the destination is %d bytes long", len(value))
	}
	if pub.Port <= 0 {
		return nil, refuse(ReasonUnpublishedDestination, "the import publishes no target port for the pool")
	}
	endpoints := extproc.SplitEndpoints(value)
	switch {
	case len(endpoints) == 0:
		return nil, refuse(ReasonNoDestination, "the destination is empty")
	case len(endpoints) > MaxDestinations:
		return nil, refuse(ReasonUnpublishedDestination, "%d endpoints, at most %d", len(endpoints), MaxDestinations)
	}
	for _, e := range endpoints {
		a, err := p.checkEndpoint(e, pub.Port)
		if err != nil {
			return nil, err
		}
		if !pub.Addresses.Contains(a) {
			return nil, refuse(ReasonUnpublishedDestination, "%s is not an address the exporter published of the pool's endpoints (%d published)", e, pub.Addresses.Len())
		}
	}
	return endpoints, nil
}

// Filter returns the answer the gateway gets for resps, a remote EPP's
// whole answer to the request phase of req (as the relay collected it: a
// headers response, the body streamed back, a trailers response; or one
// immediate response), or a *Refusal. The answer is built by the sidecar,
// never the EPP's own messages.
func (p *Policy) Filter(req *extproc.Request, resps []*extprocv3.ProcessingResponse, pub Published, cluster string) ([]*extprocv3.ProcessingResponse, error) {
	if len(resps) == 0 {
		return nil, refuse(ReasonNoDestination, "no answer")
	}
	if ir := resps[0].GetImmediateResponse(); ir != nil {
		code := int(ir.GetStatus().GetCode())
		if !PassingStatus(code) {
			return nil, refuse(ReasonImmediateStatus, "an immediate response with status %d", code)
		}
		return []*extprocv3.ProcessingResponse{Immediate(code, cluster)}, nil
	}
	value, err := destination(resps)
	if err != nil {
		return nil, err
	}
	endpoints, err := p.Destinations(value, pub)
	if err != nil {
		return nil, err
	}
	body, err := rewrittenBody(req.Body, resps)
	if err != nil {
		return nil, err
	}
	return req.Route(endpoints, body), nil
}

// PassingStatus says whether a remote EPP's immediate response of status
// code passes (as the status only): 503 (no endpoint: the next cluster is
// tried), 429 (shed), and the statuses that describe the request itself,
// which any cluster would answer alike (400, 404 for a model no server
// serves, 413). A redirect, a 401 or 407 (which make clients ask for or
// send credentials), a success the gateway did not route, or another
// error is not the protocol's, and is refused.
func PassingStatus(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// Immediate is the sidecar's immediate response for a remote EPP's
// immediate response of status code: the status, with a body of the
// sidecar's that says which cluster answered it.
func Immediate(code int, cluster string) *extprocv3.ProcessingResponse {
	return extproc.ErrorResponse(code, fmt.Sprintf("the endpoint picker of cluster %s answered %d %s", cluster, code, http.StatusText(code)))
}

// destination is the destination the answer names: its header and its
// dynamic metadata, which must agree where both are set.
func destination(resps []*extprocv3.ProcessingResponse) (string, error) {
	value, found := "", false
	see := func(v string) error {
		if found && v != value {
			return refuse(ReasonConflictingDestinations, "the answer names %.100q and %.100q", value, v)
		}
		value, found = v, true
		return nil
	}
	for _, r := range resps {
		for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if strings.EqualFold(h.GetHeader().GetKey(), extproc.DestinationEndpointHeader) {
				if err := see(extproc.HeaderValue(h.GetHeader())); err != nil {
					return "", err
				}
			}
		}
		if md := r.GetDynamicMetadata(); md != nil {
			if v := extproc.DestinationFromMetadata(md); v != "" {
				if err := see(v); err != nil {
					return "", err
				}
			}
		}
	}
	if !found || strings.TrimSpace(value) == "" {
		return "", refuse(ReasonNoDestination, "the answer names no destination")
	}
	return value, nil
}

// rewrittenBody is the body the answer sends upstream when it differs from
// the request's own (nil when it does not): accepted only when it differs
// in its top-level "model" string alone.
func rewrittenBody(orig []byte, resps []*extprocv3.ProcessingResponse) ([]byte, error) {
	var parts [][]byte
	replaced := false
	for _, r := range resps {
		rb := r.GetRequestBody()
		if rb == nil {
			continue
		}
		switch m := rb.GetResponse().GetBodyMutation().GetMutation().(type) {
		case *extprocv3.BodyMutation_StreamedResponse:
			parts = append(parts, m.StreamedResponse.GetBody())
		case *extprocv3.BodyMutation_Body:
			parts, replaced = [][]byte{m.Body}, true
		case *extprocv3.BodyMutation_ClearBody:
			parts, replaced = nil, m.ClearBody
		}
	}
	if !replaced && len(parts) == 0 {
		// The body goes on as the gateway has it.
		return nil, nil
	}
	if sameBytes(orig, parts) {
		return nil, nil
	}
	body := bytes.Join(parts, nil)
	if len(body) > BodyLimit(len(orig)) {
		return nil, refuse(ReasonBodyMutation, "a body of %d bytes for a request body of %d", len(body), len(orig))
	}
	if !onlyModelDiffers(orig, body) {
		return nil, refuse(ReasonBodyMutation, "the body was changed beyond its model")
	}
	return body, nil
}

// sameBytes says whether parts, joined, are b, without joining them.
func sameBytes(b []byte, parts [][]byte) bool {
	for _, p := range parts {
		if len(p) > len(b) || !bytes.Equal(p, b[:len(p)]) {
			return false
		}
		b = b[len(p):]
	}
	return len(b) == 0
}

// onlyModelDiffers says whether rewritten is orig with another top-level
// "model" string: both JSON objects, equal once their models are removed.
func onlyModelDiffers(orig, rewritten []byte) bool {
	var a, b map[string]any
	if json.Unmarshal(orig, &a) != nil || json.Unmarshal(rewritten, &b) != nil || a == nil || b == nil {
		return false
	}
	if _, ok := b["model"].(string); !ok {
		return false
	}
	delete(a, "model")
	delete(b, "model")
	return reflect.DeepEqual(a, b)
}

// ResponsePhase returns the answer the gateway gets for a remote EPP's
// answer r to a message of the response phase: letting the message
// through unchanged. A response's headers, body and trailers are the
// exporter's model server's, but the client's response is the importing
// gateway's: a remote EPP neither sets its headers or cookies nor
// rewrites its body. An immediate response (replacing the client's
// response) is refused; the sidecar then answers the rest of the response
// phase itself. Only the answers the gateway waits for are asked: a body
// chunk that went ahead is not.
func ResponsePhase(r *extprocv3.ProcessingResponse) (*extprocv3.ProcessingResponse, error) {
	if err := CheckResponsePhase(r); err != nil {
		return nil, err
	}
	switch r.Response.(type) {
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}, nil
	case *extprocv3.ProcessingResponse_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}, nil
	default:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}, nil
	}
}

// CheckResponsePhase returns the error ResponsePhase returns for r, without
// building the answer: for an answer checked that does not go to the
// gateway.
func CheckResponsePhase(r *extprocv3.ProcessingResponse) error {
	switch r.Response.(type) {
	case *extprocv3.ProcessingResponse_ResponseHeaders, *extprocv3.ProcessingResponse_ResponseBody, *extprocv3.ProcessingResponse_ResponseTrailers:
		return nil
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		return refuse(ReasonImmediateStatus, "an immediate response with status %d in the response phase", r.GetImmediateResponse().GetStatus().GetCode())
	}
	return refuse(ReasonProtocol, "a %T in the response phase", r.Response)
}
