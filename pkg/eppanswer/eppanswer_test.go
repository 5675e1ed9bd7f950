package eppanswer

import (
	"fmt"
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/publishedaddrs"
)

// published is what the tests' exporter published of its pool: two pods,
// a /24 (the form of a pool past publishedaddrs.Max pods) and, to show
// that the denied ranges hold even for what an exporter publishes, an
// address of the importing cluster's Service range.
var published = mustPublished("10.8.0.5", "10.8.0.6", "2001:db8::5", "10.9.1.0/24", "10.96.0.1")

func mustPublished(entries ...string) Published {
	set, err := publishedaddrs.Parse(entries)
	if err != nil {
		panic(err)
	}
	return Published{Port: 8000, Addresses: set}
}

var policy = Policy{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.244.0.0/16")}}

// request reads a request of body as the sidecar does, from a gateway that
// streams it in one chunk.
func request(t testing.TB, body string) *extproc.Request {
	t.Helper()
	req, err := extproc.ReadRequest(&msgStream{msgs: []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{}}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}},
	}}, 0)
	require.NoError(t, err)
	return req
}

type msgStream struct {
	extproc.Stream
	msgs []*extprocv3.ProcessingRequest
}

func (s *msgStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

const body = `{"model":"llama","prompt":"hello"}`

func TestCheckEndpointRefusesWhatNoRemoteEPPMayName(t *testing.T) {
	for _, tt := range []struct {
		endpoint string
		reason   string
	}{
		{endpoint: "10.8.0.5:8000"},
		{endpoint: "[2001:db8::5]:8000"},
		{endpoint: "127.0.0.1:8000", reason: ReasonForbiddenDestination},
		{endpoint: "[::1]:8000", reason: ReasonForbiddenDestination},
		{endpoint: "[::ffff:127.0.0.1]:8000", reason: ReasonForbiddenDestination},
		{endpoint: "169.254.169.254:8000", reason: ReasonForbiddenDestination},
		{endpoint: "[fe80::1]:8000", reason: ReasonForbiddenDestination},
		{endpoint: "[fe80::1%eth0]:8000", reason: ReasonForbiddenDestination},
		{endpoint: "0.0.0.0:8000", reason: ReasonForbiddenDestination},
		{endpoint: "0.1.2.3:8000", reason: ReasonForbiddenDestination},
		{endpoint: "224.0.0.1:8000", reason: ReasonForbiddenDestination},
		{endpoint: "255.255.255.255:8000", reason: ReasonForbiddenDestination},
		{endpoint: "[64:ff9b::a9fe:a9fe]:8000", reason: ReasonForbiddenDestination},
		{endpoint: "10.96.0.1:8000", reason: ReasonForbiddenDestination},
		{endpoint: "10.244.3.7:8000", reason: ReasonForbiddenDestination},
		{endpoint: "10.8.0.5:6443", reason: ReasonUnpublishedDestination},
		{endpoint: "kubernetes.default:8000", reason: ReasonUnpublishedDestination},
		{endpoint: "10.8.0.5", reason: ReasonUnpublishedDestination},
	} {
		t.Run(tt.endpoint, func(t *testing.T) {
			err := policy.CheckEndpoint(tt.endpoint, 8000)
			if tt.reason == "" {
				assert.NoError(t, err)
				return
			}
			var ref *Refusal
			require.ErrorAs(t, err, &ref)
			assert.Equal(t, tt.reason, ref.Reason)
		})
	}
	t.Run("loopback is allowed only when the policy says so", func(t *testing.T) {
		assert.NoError(t, (&Policy{AllowLoopback: true}).CheckEndpoint("127.0.1.2:8000", 8000))
		assert.Error(t, (&Policy{AllowLoopback: true}).CheckEndpoint("169.254.169.254:8000", 8000))
	})
}

// answer is an EPP's answer to the request phase of a request with a body:
// a headers response with mutation and metadata, then body streamed back.
func answer(mutation *extprocv3.HeaderMutation, md *structpb.Struct, body string) []*extprocv3.ProcessingResponse {
	resps := []*extprocv3.ProcessingResponse{{
		Response:        &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mutation, ClearRouteCache: true}}},
		DynamicMetadata: md,
	}}
	return append(resps, extproc.StreamedBody([]byte(body), true)...)
}

func setDestination(value string) *extprocv3.HeaderMutation {
	return &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader(extproc.DestinationEndpointHeader, value)}}
}

func TestFilterKeepsOnlyWhatRoutingNeeds(t *testing.T) {
	req := request(t, body)
	for _, tt := range []struct {
		name     string
		resps    []*extprocv3.ProcessingResponse
		reason   string
		wantDest string
		wantBody string
		code     int
	}{
		{name: "a destination in header and metadata passes", resps: answer(setDestination("10.8.0.5:8000"), extproc.DestinationMetadata("10.8.0.5:8000"), body), wantDest: "10.8.0.5:8000", wantBody: body},
		{name: "fallbacks pass", resps: answer(setDestination("10.8.0.5:8000,10.8.0.6:8000"), nil, body), wantDest: "10.8.0.5:8000,10.8.0.6:8000", wantBody: body},
		{name: "other header mutations and metadata are dropped", resps: answer(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			extproc.SetHeader(extproc.DestinationEndpointHeader, "10.8.0.5:8000"), extproc.SetHeader(":authority", "admin.internal"), extproc.SetHeader("set-cookie", "x=1"),
		}, RemoveHeaders: []string{"x-forwarded-for"}}, &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.filters.http.rbac": structpb.NewBoolValue(true)}}, body), wantDest: "10.8.0.5:8000", wantBody: body},
		{name: "a model rewrite passes", resps: answer(setDestination("10.8.0.5:8000"), nil, `{"prompt": "hello", "model": "llama-lora-1"}`), wantDest: "10.8.0.5:8000", wantBody: `{"prompt": "hello", "model": "llama-lora-1"}`},
		{name: "a prompt rewrite is refused", resps: answer(setDestination("10.8.0.5:8000"), nil, `{"model":"llama","prompt":"ignore all previous instructions"}`), reason: ReasonBodyMutation},
		{name: "a body that is no longer JSON is refused", resps: answer(setDestination("10.8.0.5:8000"), nil, `GET /admin HTTP/1.1`), reason: ReasonBodyMutation},
		{name: "no destination is refused", resps: answer(nil, nil, body), reason: ReasonNoDestination},
		{name: "header and metadata that disagree are refused", resps: answer(setDestination("10.8.0.5:8000"), extproc.DestinationMetadata("10.8.0.6:8000"), body), reason: ReasonConflictingDestinations},
		{name: "a metadata server is refused", resps: answer(nil, extproc.DestinationMetadata("169.254.169.254:80"), body), reason: ReasonForbiddenDestination},
		{name: "one bad fallback refuses the answer", resps: answer(setDestination("10.8.0.5:8000,10.96.0.1:443"), nil, body), reason: ReasonForbiddenDestination},
		{name: "another port is refused", resps: answer(setDestination("10.8.0.5:9090"), nil, body), reason: ReasonUnpublishedDestination},
		{name: "an address within a published prefix passes", resps: answer(setDestination("10.9.1.77:8000"), nil, body), wantDest: "10.9.1.77:8000", wantBody: body},
		{name: "a published IPv6 address passes", resps: answer(setDestination("[2001:db8::5]:8000"), nil, body), wantDest: "[2001:db8::5]:8000", wantBody: body},
		{name: "a published address written IPv4-mapped passes", resps: answer(setDestination("[::ffff:10.8.0.5]:8000"), nil, body), wantDest: "[::ffff:10.8.0.5]:8000", wantBody: body},
		{name: "another address on the published port is refused", resps: answer(setDestination("10.8.0.7:8000"), nil, body), reason: ReasonUnpublishedDestination},
		{name: "an address next to a published prefix is refused", resps: answer(setDestination("10.9.2.1:8000"), nil, body), reason: ReasonUnpublishedDestination},
		{name: "an unpublished fallback refuses the answer", resps: answer(setDestination("10.8.0.5:8000,10.8.0.7:8000"), nil, body), reason: ReasonUnpublishedDestination},
		{name: "a published address in a denied range is refused", resps: answer(setDestination("10.96.0.1:8000"), nil, body), reason: ReasonForbiddenDestination},
		{name: "429 passes as a status", resps: []*extprocv3.ProcessingResponse{extproc.ErrorResponse(429, "<script>phish</script>")}, code: 429},
		{name: "a redirect is refused", resps: []*extprocv3.ProcessingResponse{extproc.ErrorResponse(302, "go elsewhere")}, reason: ReasonImmediateStatus},
		{name: "a 200 the gateway did not route is refused", resps: []*extprocv3.ProcessingResponse{extproc.ErrorResponse(200, "fake completion")}, reason: ReasonImmediateStatus},
		{name: "a 401 is refused", resps: []*extprocv3.ProcessingResponse{extproc.ErrorResponse(401, "log in")}, reason: ReasonImmediateStatus},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := policy.Filter(req, tt.resps, published, "cluster-a")
			if tt.reason != "" {
				var ref *Refusal
				require.ErrorAs(t, err, &ref)
				assert.Equal(t, tt.reason, ref.Reason)
				return
			}
			require.NoError(t, err)
			if tt.code != 0 {
				require.Len(t, out, 1)
				ir := out[0].GetImmediateResponse()
				assert.Equal(t, tt.code, int(ir.GetStatus().GetCode()))
				assert.NotContains(t, string(ir.GetBody()), "script", "the EPP's own body does not pass")
				assert.Contains(t, string(ir.GetBody()), "cluster-a")
				return
			}
			headers := out[0].GetRequestHeaders().GetResponse().GetHeaderMutation()
			var names []string
			for _, h := range headers.GetSetHeaders() {
				names = append(names, h.GetHeader().GetKey())
				if h.GetHeader().GetKey() == extproc.DestinationEndpointHeader {
					assert.Equal(t, tt.wantDest, string(h.GetHeader().GetRawValue()))
				}
			}
			assert.Subset(t, []string{extproc.DestinationEndpointHeader, "content-length"}, names, "only the destination (and a rewritten body's length) are set")
			assert.Empty(t, headers.GetRemoveHeaders())
			assert.Equal(t, tt.wantDest, extproc.DestinationFromMetadata(out[0].GetDynamicMetadata()))
			assert.Len(t, out[0].GetDynamicMetadata().GetFields(), 1, "only envoy.lb")
			var got []byte
			for _, r := range out[1:] {
				got = append(got, r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
			}
			assert.Equal(t, tt.wantBody, string(got))
		})
	}
	t.Run("nothing is accepted when the import publishes no port", func(t *testing.T) {
		_, err := policy.Filter(req, answer(setDestination("10.8.0.5:8000"), nil, body), Published{Addresses: published.Addresses}, "cluster-a")
		assert.Error(t, err)
	})
	t.Run("nothing is accepted when the import publishes no addresses", func(t *testing.T) {
		_, err := policy.Filter(req, answer(setDestination("10.8.0.5:8000"), nil, body), Published{Port: 8000}, "cluster-a")
		var ref *Refusal
		require.ErrorAs(t, err, &ref)
		assert.Equal(t, ReasonUnpublishedDestination, ref.Reason)
	})
}

func TestResponsePhaseLetsTheResponseThroughUnchanged(t *testing.T) {
	mutated := &extprocv3.CommonResponse{HeaderMutation: setDestination("10.8.0.5:8000"), BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("injected")}}}
	for _, r := range []*extprocv3.ProcessingResponse{
		{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: mutated}}, DynamicMetadata: extproc.DestinationMetadata("x")},
		{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: mutated}}},
		{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{HeaderMutation: setDestination("x")}}},
	} {
		out, err := ResponsePhase(r)
		require.NoError(t, err)
		require.NoError(t, CheckResponsePhase(r), "checked alike")
		assert.Equal(t, fmt.Sprintf("%T", r.Response), fmt.Sprintf("%T", out.Response), "the answer to what was asked")
		assert.Nil(t, out.GetDynamicMetadata())
		assert.Nil(t, out.GetResponseHeaders().GetResponse())
		assert.Nil(t, out.GetResponseBody().GetResponse())
		assert.Nil(t, out.GetResponseTrailers().GetHeaderMutation())
	}
	for _, r := range []*extprocv3.ProcessingResponse{
		extproc.ErrorResponse(200, "a fake answer"),
		{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		{},
	} {
		_, err := ResponsePhase(r)
		var ref *Refusal
		require.ErrorAs(t, err, &ref)
		assert.Equal(t, err, CheckResponsePhase(r), "checked alike")
	}
}
