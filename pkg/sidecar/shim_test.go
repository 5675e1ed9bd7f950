package sidecar

import (
	"net/http"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// sidecarService is the sidecar's own Service in the fixtures' namespace.
var sidecarService = types.NamespacedName{Namespace: ns, Name: "mci-sidecar"}

// shimPool builds a local InferencePool whose EPP is the sidecar; local, when
// set, is the annotation naming its real EPP.
func shimPool(name string, local string) *poolv1.InferencePool {
	p := sidecartest.Pool(name, "")
	p.Spec.EndpointPickerRef.Name = sidecarService.Name
	if local != "" {
		p.Annotations = map[string]string{routetable.LocalEndpointPickerAnnotation: local}
	}
	return p
}

func poolMetadata(pool string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		routetable.ShimMetadataNamespace: {Fields: map[string]*structpb.Value{routetable.ShimPoolKey: structpb.NewStringValue(pool)}},
	}}
}

func TestServerAsEPPShim(t *testing.T) {
	local := startFakeEPP(t, "epp-b", "10.2.0.1:8000")
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	lh, lp := hostPort(t, local.addr)
	localSvc := sidecartest.EPPService("llm", lh)
	localSvc.Spec.Ports[0].Port = lp
	weighted := func(p *poolv1.InferencePool) *poolv1.InferencePool {
		return sidecartest.Annotate(p, routetable.PolicyAnnotation, routingpolicy.Weighted, routetable.LocalEndpointPickerAnnotation, p.Annotations[routetable.LocalEndpointPickerAnnotation])
	}
	in := routetable.Inputs{
		EndpointPickerServices: []types.NamespacedName{sidecarService},
		LocalCluster:           "cluster-b",
		Pools:                  []*poolv1.InferencePool{weighted(shimPool("llm", "llm-epp"))},
		Services:               []*corev1.Service{localSvc},
		Imports:                []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
	}
	h := startServer(t, in, &fakeState{})

	t.Run("a request without an HTTPRoute goes to the pool's local EPP and the import's clusters by weight", func(t *testing.T) {
		got := map[string]int{}
		for range 30 {
			res := h.do(t, envoyclient.Request{Authority: "anything", Path: "/v1/completions", Body: chatBody})
			require.Nil(t, res.Immediate, "%+v", res.Immediate)
			got[res.Destination]++
		}
		assert.Equal(t, map[string]int{"10.2.0.1:8000": 10, "10.1.0.1:8000": 10, "10.3.0.1:8000": 10}, got)
	})

	t.Run("requests relayed to remote EPPs are marked, those to the local EPP are not", func(t *testing.T) {
		a.mu.Lock()
		defer a.mu.Unlock()
		local.mu.Lock()
		defer local.mu.Unlock()
		require.NotEmpty(t, a.relayed)
		assert.Equal(t, "cluster-b", a.relayed[0])
		require.NotEmpty(t, local.relayed)
		assert.Equal(t, "", local.relayed[0])
	})

	t.Run("a request another cluster's sidecar relayed is served by the local EPP only", func(t *testing.T) {
		before := a.calls.Load() + c.calls.Load()
		for range 6 {
			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Headers: http.Header{extproc.RelayedHeader: {"cluster-a"}}})
			require.Nil(t, res.Immediate)
			assert.Equal(t, "10.2.0.1:8000", res.Destination)
		}
		assert.Equal(t, before, a.calls.Load()+c.calls.Load(), "no request goes back to another cluster")

		local.mode.Store(eppFail)
		defer local.mode.Store(eppRoute)
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Headers: http.Header{extproc.RelayedHeader: {"cluster-a"}}})
		require.NotNil(t, res.Immediate, "a relayed request fails closed when the local EPP fails")
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
	})

	t.Run("the gateway's metadata chooses among several shim pools", func(t *testing.T) {
		in := in
		in.Pools = append([]*poolv1.InferencePool{shimPool("chat", "")}, in.Pools...)
		ch, cp := hostPort(t, c.addr)
		in.Imports = append([]*v1alpha1.InferencePoolImport{sidecartest.Import("chat", sidecartest.Imported{Name: "cluster-c", Addr: ch, Port: cp})}, in.Imports...)
		h := startServer(t, in, &fakeState{})

		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Metadata: poolMetadata(ns + "/chat")})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.3.0.1:8000", res.Destination)

		res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
		require.NotNil(t, res.Immediate, "without metadata or a route the pool is unknown")
		assert.Equal(t, http.StatusInternalServerError, res.Immediate.StatusCode)

		res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Metadata: poolMetadata(ns + "/nope")})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)

		res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Metadata: poolMetadata("nope")})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusBadRequest, res.Immediate.StatusCode)
	})

	t.Run("a request whose shim pool cannot be told is logged once per reason", func(t *testing.T) {
		in := in
		in.Pools = append([]*poolv1.InferencePool{shimPool("chat", "")}, in.Pools...)
		h := startServer(t, in, &fakeState{})
		var logs logLines
		h.server.obs.logger = logs.logger()
		for range 3 {
			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
			require.NotNil(t, res.Immediate)
			assert.Equal(t, http.StatusInternalServerError, res.Immediate.StatusCode)
		}
		require.Equal(t, 1, logs.count(), "%v", logs.lines)
		assert.Contains(t, logs.lines[0], "2 InferencePools use mci-sidecar as their endpoint picker and neither")
		h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Metadata: poolMetadata(ns + "/nope")})
		assert.Equal(t, 2, logs.count(), "another reason")
	})

	t.Run("the HTTPRoute rule chooses among several shim pools when it names one of them", func(t *testing.T) {
		in := in
		in.Pools = append([]*poolv1.InferencePool{shimPool("chat", "")}, in.Pools...)
		ch, cp := hostPort(t, c.addr)
		in.Imports = append([]*v1alpha1.InferencePoolImport{sidecartest.Import("chat", sidecartest.Imported{Name: "cluster-c", Addr: ch, Port: cp})}, in.Imports...)
		in.Routes = []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, []string{"chat.example.com"}, sidecartest.Rule(nil, sidecartest.PoolRef("chat", nil)))}
		h := startServer(t, in, &fakeState{})

		res := h.do(t, envoyclient.Request{Authority: "chat.example.com", Path: "/v1/completions", Body: chatBody})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.3.0.1:8000", res.Destination)
	})

	t.Run("no shim pool answers 503", func(t *testing.T) {
		in := in
		in.Pools = nil
		h := startServer(t, in, &fakeState{})
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
	})
}
