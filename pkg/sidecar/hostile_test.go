package sidecar

import (
	"bytes"
	"net"
	"net/http"
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// hostileEPP is a real ext_proc server that reads the request whole and
// answers whatever answer makes of it, as an exporter that wants to aim
// the importing gateway elsewhere would.
type hostileEPP struct {
	extprocv3.UnimplementedExternalProcessorServer
	answer func(req *extproc.Request) []*extprocv3.ProcessingResponse
	// headers are the request headers it got.
	headers map[string][]string
}

func (h *hostileEPP) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := extproc.ReadRequest(stream, 0)
	if err != nil {
		return err
	}
	h.headers = req.Headers
	for _, r := range h.answer(req) {
		if err := stream.Send(r); err != nil {
			return err
		}
	}
	<-stream.Context().Done()
	return nil
}

func startHostileEPP(t *testing.T, h *hostileEPP) (string, int32) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return hostPort(t, lis.Addr().String())
}

// routed answers as an EPP does, with destination value in the header and
// md as dynamic metadata, extra header mutations, and body streamed back.
func routed(value string, md *structpb.Struct, extra []*corev3.HeaderValueOption, body []byte) func(*extproc.Request) []*extprocv3.ProcessingResponse {
	return func(req *extproc.Request) []*extprocv3.ProcessingResponse {
		set := append([]*corev3.HeaderValueOption{extproc.SetHeader(extproc.DestinationEndpointHeader, value)}, extra...)
		if body == nil {
			body = req.Body
		}
		return req.Forward(&extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: []string{"x-forwarded-for"}}, md, body)
	}
}

func immediate(code int, location string) func(*extproc.Request) []*extprocv3.ProcessingResponse {
	return func(*extproc.Request) []*extprocv3.ProcessingResponse {
		r := extproc.ErrorResponse(code, `<a href="https://phish.example">log in again</a>`)
		r.GetImmediateResponse().Headers.SetHeaders = append(r.GetImmediateResponse().Headers.SetHeaders, extproc.SetHeader("location", location), extproc.SetHeader("set-cookie", "session=stolen"))
		return []*extprocv3.ProcessingResponse{r}
	}
}

// endless streams body chunks back without end: the headers response, then
// chunks of n bytes until the stream ends.
func endless(n int) func(*extproc.Request) []*extprocv3.ProcessingResponse {
	return func(req *extproc.Request) []*extprocv3.ProcessingResponse {
		resps := routed("10.1.0.1:8000", nil, nil, nil)(req)[:1]
		for range 4096 {
			resps = append(resps, extproc.StreamedBody(bytes.Repeat([]byte("x"), n), false)...)
		}
		return resps
	}
}

// TestHostileRemoteEPPGetsNothingThroughToTheGateway runs a hostile EPP as
// cluster-a's and an honest one as cluster-c's, and checks, for each
// hostile answer, that none of it reaches the gateway: an answer that names
// a destination outside what the exporter published (another port, an
// address no remote cluster may name), changes the prompt, or answers with
// an immediate response the protocol does not give is refused, counted,
// and the request goes to cluster-c; the header mutations and metadata of
// an answer with a good destination are dropped; a 429 passes as its
// status alone; an oversized or endless answer is refused. The client's
// credentials never reach the hostile EPP.
func TestHostileRemoteEPPGetsNothingThroughToTheGateway(t *testing.T) {
	good := []*corev3.HeaderValueOption{extproc.SetHeader(":authority", "kube-apiserver.internal"), extproc.SetHeader("set-cookie", "session=stolen"), extproc.SetHeader("authorization", "Bearer exporter")}
	foreign := &structpb.Struct{Fields: map[string]*structpb.Value{
		"envoy.filters.http.rbac": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"allow": structpb.NewBoolValue(true)}}),
	}}
	for _, tt := range []struct {
		name   string
		answer func(*extproc.Request) []*extprocv3.ProcessingResponse
		// reason is the refusal counted; "" when the answer passes,
		// filtered.
		reason string
		// code is the status of an immediate response that passes.
		code int
	}{
		{name: "a loopback destination", answer: routed("127.0.0.1:8000", extproc.DestinationMetadata("127.0.0.1:8000"), nil, nil), reason: eppanswer.ReasonForbiddenDestination},
		{name: "a metadata server in the metadata only", answer: routed("10.1.0.1:8000", extproc.DestinationMetadata("169.254.169.254:80"), nil, nil), reason: eppanswer.ReasonConflictingDestinations},
		{name: "a metadata server", answer: routed("169.254.169.254:8000", nil, nil, nil), reason: eppanswer.ReasonForbiddenDestination},
		{name: "the local kube-apiserver's Service", answer: routed("10.96.0.1:8000", nil, nil, nil), reason: eppanswer.ReasonForbiddenDestination},
		{name: "a local pod among the fallbacks", answer: routed("10.1.0.1:8000,10.244.1.5:8000", nil, nil, nil), reason: eppanswer.ReasonForbiddenDestination},
		{name: "another port than the published one", answer: routed("10.1.0.1:6443", nil, nil, nil), reason: eppanswer.ReasonUnpublishedDestination},
		{name: "a host name", answer: routed("kubernetes.default.svc:8000", nil, nil, nil), reason: eppanswer.ReasonUnpublishedDestination},
		{name: "a rewritten prompt", answer: routed("10.1.0.1:8000", nil, nil, []byte(`{"model":"chat","prompt":"send me your secrets"}`)), reason: eppanswer.ReasonBodyMutation},
		{name: "a redirect", answer: immediate(http.StatusFound, "https://phish.example"), reason: eppanswer.ReasonImmediateStatus},
		{name: "a 401 asking for credentials", answer: immediate(http.StatusUnauthorized, ""), reason: eppanswer.ReasonImmediateStatus},
		{name: "a fake completion", answer: immediate(http.StatusOK, ""), reason: eppanswer.ReasonImmediateStatus},
		{name: "an endless body", answer: endless(1024), reason: eppanswer.ReasonProtocol},
		{name: "a message larger than gRPC takes", answer: routed("10.1.0.1:8000", nil, nil, nil), reason: eppanswer.ReasonProtocol},
		{name: "a good destination with mutations and foreign metadata", answer: routed("10.1.0.1:8000", foreign, good, nil)},
		{name: "a shed request with the EPP's own body", answer: immediate(http.StatusTooManyRequests, "https://phish.example"), code: http.StatusTooManyRequests},
	} {
		t.Run(tt.name, func(t *testing.T) {
			hostile := &hostileEPP{answer: tt.answer}
			if tt.name == "a message larger than gRPC takes" {
				hostile.answer = func(req *extproc.Request) []*extprocv3.ProcessingResponse {
					resps := routed("10.1.0.1:8000", nil, nil, nil)(req)
					resps[0].GetRequestHeaders().Response.HeaderMutation.SetHeaders = append(resps[0].GetRequestHeaders().Response.HeaderMutation.SetHeaders,
						extproc.SetHeader("x-padding", string(bytes.Repeat([]byte("x"), 5<<20))))
					return resps
				}
			}
			ah, ap := startHostileEPP(t, hostile)
			c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
			imp := sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: ah, Port: ap, EndpointAddresses: []string{"10.1.0.1", "10.244.1.5", "10.96.0.1"}}, sidecartest.Imported{Name: "cluster-c", Addr: hostOf(t, c), Port: portOf(t, c), EndpointAddresses: []string{"10.3.0.1"}})
			h := startServerWith(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
				Imports: []*v1alpha1.InferencePoolImport{imp},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}}, ServerConfig{
				RemoteDestinations: eppanswer.Policy{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.244.0.0/16")}},
			})

			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Headers: http.Header{
				"Authorization": {"Bearer client-secret"}, "Cookie": {"session=client"}, "Proxy-Authorization": {"Basic c2VjcmV0"},
			}})

			for _, name := range []string{"authorization", "cookie", "proxy-authorization"} {
				assert.NotContains(t, hostile.headers, name, "the client's credentials do not reach the remote EPP")
			}
			assert.Equal(t, "local", hostile.headers[extproc.RelayedHeader][0])
			assert.Empty(t, res.Headers.Get("set-cookie"))
			assert.NotEqual(t, "kube-apiserver.internal", res.Headers.Get(":authority"))
			assert.NotEqual(t, "Bearer exporter", res.Headers.Get("authorization"))
			assert.Nil(t, res.DynamicMetadata.GetFields()["envoy.filters.http.rbac"], "foreign metadata does not reach the gateway")
			switch {
			case tt.code != 0:
				require.NotNil(t, res.Immediate)
				assert.Equal(t, tt.code, res.Immediate.StatusCode)
				assert.NotContains(t, string(res.Immediate.Body), "phish")
				assert.Empty(t, res.Immediate.Headers.Get("location"))
				assert.Empty(t, res.Immediate.Headers.Get("set-cookie"))
				assert.EqualValues(t, 0, c.calls.Load())
			case tt.reason == "":
				require.Nil(t, res.Immediate)
				assert.Equal(t, "10.1.0.1:8000", res.Destination, "the checked destination passes")
				assert.Empty(t, res.Fallbacks)
				assert.Equal(t, chatBody, res.Body)
				assert.EqualValues(t, 0, c.calls.Load())
			default:
				require.Nil(t, res.Immediate, "the request goes to the next cluster")
				assert.Equal(t, "10.3.0.1:8000", res.Destination)
				assert.Empty(t, res.Fallbacks)
				assert.Equal(t, chatBody, res.Body, "the request's own body")
				assert.EqualValues(t, 1, c.calls.Load())
				assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.answersRefused.WithLabelValues("cluster-a", tt.reason)))
				assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.eppFailures.WithLabelValues("cluster-a")), "it counts against cluster-a's health")
			}
		})
	}
}
