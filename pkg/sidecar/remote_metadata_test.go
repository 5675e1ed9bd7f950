package sidecar

import (
	"net"
	"net/http"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// snoopingEPP is a fakeEPP, a real ext_proc server, that also keeps every
// message it gets, in both phases: what a remote EPP learns of a request.
type snoopingEPP struct {
	*fakeEPP
	mu   sync.Mutex
	msgs []*extprocv3.ProcessingRequest
}

func startSnoopingEPP(t *testing.T, dest string) *snoopingEPP {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &snoopingEPP{fakeEPP: &fakeEPP{name: "snooper", dest: dest, addr: lis.Addr().String(), srv: grpc.NewServer()}}
	extprocv3.RegisterExternalProcessorServer(s.srv, s)
	go func() { _ = s.srv.Serve(lis) }()
	t.Cleanup(s.srv.Stop)
	return s
}

func (s *snoopingEPP) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return s.fakeEPP.Process(&snoopedStream{ExternalProcessor_ProcessServer: stream, s: s})
}

func (s *snoopingEPP) got() []*extprocv3.ProcessingRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), s.msgs...)
}

type snoopedStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	s *snoopingEPP
}

func (st *snoopedStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m, err := st.ExternalProcessor_ProcessServer.Recv()
	if m != nil {
		st.s.mu.Lock()
		st.s.msgs = append(st.s.msgs, proto.Clone(m).(*extprocv3.ProcessingRequest))
		st.s.mu.Unlock()
	}
	return m, err
}

// TestRemoteEPPGetsNoneOfTheGatewaysMetadata sends a request whose gateway
// forwards metadata of its other filters (a token's claims, the tenant)
// and the client's connection attributes, with a subset hint of local
// endpoints, through a remote cluster's EPP, a real ext_proc server that
// keeps every message it gets. In neither phase does it get the attributes
// or a metadata namespace the operator did not forward; of the EPP
// protocol's metadata it gets only the endpoint that served, in the
// response phase, and the request is routed and answered as before.
func TestRemoteEPPGetsNoneOfTheGatewaysMetadata(t *testing.T) {
	claims := func() *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"sub": structpb.NewStringValue("alice"), "tenant": structpb.NewStringValue("team-a")}}
	}
	gatewayMetadata := func() *corev3.Metadata {
		md := extproc.SubsetHintMetadata("10.9.0.1:8000")
		md.FilterMetadata["envoy.filters.http.jwt_authn"] = claims()
		md.FilterMetadata["example.tenant"] = claims()
		return md
	}
	attributes := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"source.address": structpb.NewStringValue("192.0.2.7:51234"), "connection.uri_san_peer_certificate": structpb.NewStringValue("spiffe://tenant/alice"),
	}}}

	for _, tt := range []struct {
		name      string
		forwarded []string
		// want are the metadata namespaces the remote EPP may get in
		// each phase.
		wantRequest, wantResponse []string
	}{
		{name: "by default", wantResponse: []string{extproc.DestinationEndpointNamespace}},
		{name: "with a namespace the operator forwards", forwarded: []string{"example.tenant"},
			wantRequest: []string{"example.tenant"}, wantResponse: []string{extproc.DestinationEndpointNamespace, "example.tenant"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			remote := startSnoopingEPP(t, "10.1.0.1:8000")
			ah, ap := hostPort(t, remote.addr)
			h := startServerWith(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
				Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: ah, Port: ap})},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}}, ServerConfig{ForwardedMetadataNamespaces: tt.forwarded})

			res := h.do(t, envoyclient.Request{
				Path: "/v1/completions", Body: chatBody, ChunkSize: 8,
				Metadata: gatewayMetadata(), Attributes: attributes,
				Headers:  http.Header{"Authorization": {"Bearer client-secret"}},
				Response: &envoyclient.Response{Body: []byte("some tokens"), ChunkSize: 4, Metadata: gatewayMetadata()},
			})
			require.Nil(t, res.Immediate)
			assert.Equal(t, "10.1.0.1:8000", res.Destination, "the remote EPP still routes")
			assert.Equal(t, chatBody, res.Body)
			require.NotNil(t, res.Response)
			assert.Equal(t, "some tokens", string(res.Response.Body))

			msgs := remote.got()
			require.NotEmpty(t, msgs)
			var sawServed bool
			for i, m := range msgs {
				assert.Empty(t, m.GetAttributes(), "message %d carries the client's connection attributes", i)
				assert.Empty(t, m.GetRequestHeaders().GetAttributes(), "message %d carries the client's connection attributes", i)
				assert.Empty(t, m.GetMetadataContext().GetTypedFilterMetadata(), "message %d", i)
				assert.Empty(t, m.GetMetadataContext().ProtoReflect().GetUnknown(), "message %d", i)
				want := tt.wantRequest
				if isResponsePhase(m) {
					want = tt.wantResponse
				}
				if m.GetRequestHeaders() != nil || m.GetResponseHeaders() != nil {
					assert.ElementsMatch(t, want, keys(m.GetMetadataContext().GetFilterMetadata()), "message %d: what the remote EPP gets", i)
				}
				for ns, v := range m.GetMetadataContext().GetFilterMetadata() {
					assert.Contains(t, want, ns, "message %d carries metadata the remote EPP is not to get", i)
					if ns == extproc.DestinationEndpointNamespace {
						assert.Equal(t, []string{extproc.DestinationEndpointServedKey}, keys(v.GetFields()), "of the EPP protocol's metadata, only the endpoint that served")
						assert.Equal(t, "10.1.0.1:8000", extproc.ServedEndpoint(m.GetMetadataContext()))
						sawServed = true
					}
				}
			}
			assert.True(t, sawServed, "the remote EPP learns which of its endpoints served")
		})
	}
}

func isResponsePhase(m *extprocv3.ProcessingRequest) bool {
	return m.GetResponseHeaders() != nil || m.GetResponseBody() != nil || m.GetResponseTrailers() != nil
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
