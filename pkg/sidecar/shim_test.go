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

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	extproctest "github.com/mci-dev/mci/test/extproc"
)

// sidecarService is the sidecar's own Service in the fixtures' namespace.
var sidecarService = types.NamespacedName{Namespace: ns, Name: "mci-sidecar"}

// shimPool builds a local InferencePool whose EPP is the sidecar; local, when
// set, is the annotation naming its real EPP.
func shimPool(name string, mode poolv1.EndpointPickerFailureMode, local string) *poolv1.InferencePool {
	p := pool(name, mode)
	p.Spec.EndpointPickerRef.Name = sidecarService.Name
	if local != "" {
		p.Annotations = map[string]string{LocalEndpointPickerAnnotation: local}
	}
	return p
}

func clusterNames(cs []*Cluster) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name+"="+c.EPP)
	}
	return out
}

func TestBuildShimPools(t *testing.T) {
	shims := []types.NamespacedName{sidecarService}
	twoClusters := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}, imported{name: "cluster-c", addr: "127.0.3.1"})
	tests := []struct {
		name        string
		in          Inputs
		wantReasons []string
		check       func(t *testing.T, tbl *Table)
	}{
		{
			name: "a pool whose EPP is the sidecar is its real local EPP plus the import's clusters",
			in: Inputs{
				EndpointPickerServices: shims, LocalCluster: "cluster-b",
				Pools:    []*poolv1.InferencePool{shimPool("llm", poolv1.FailOpen, "llm-epp")},
				Services: []*corev1.Service{eppService("llm", "127.0.1.1")},
				Imports:  []*v1alphaImport{twoClusters},
			},
			check: func(t *testing.T, tbl *Table) {
				assert.True(t, tbl.ShimMode())
				require.Len(t, tbl.Shims(), 1)
				be := tbl.Shim(types.NamespacedName{Namespace: ns, Name: "llm"})
				require.NotNil(t, be)
				assert.True(t, be.Shim)
				assert.Equal(t, []string{"cluster-b=127.0.1.1:9002", "cluster-a=127.0.2.1:9002", "cluster-c=127.0.3.1:9002"}, clusterNames(be.Clusters))
				assert.Same(t, be.Clusters[0], be.Local, "the local EPP is the pool's own cluster")
				assert.True(t, be.Local.Local)
				assert.Equal(t, poolv1.FailOpen, be.FailureMode, "the pool's failure mode")
				assert.Equal(t, PolicyHealthBased, be.Policy)
				assert.Len(t, tbl.Clusters(), 3, "the prober sees every cluster of the shim pool")
			},
		},
		{
			name: "without the local-endpoint-picker annotation the pool is its import",
			in: Inputs{
				EndpointPickerServices: shims,
				Pools:                  []*poolv1.InferencePool{annotate(shimPool("llm", "", ""), PolicyAnnotation, "Weighted", ClusterWeightsAnnotation, "cluster-a=3")},
				Imports:                []*v1alphaImport{twoClusters},
			},
			check: func(t *testing.T, tbl *Table) {
				be := tbl.Shims()[0]
				assert.Nil(t, be.Local)
				assert.Equal(t, []string{"cluster-a=127.0.2.1:9002", "cluster-c=127.0.3.1:9002"}, clusterNames(be.Clusters))
				assert.Equal(t, PolicyWeighted, be.Policy, "the pool's policy annotation")
				assert.Equal(t, []int64{3, 1}, []int64{be.Clusters[0].Weight, be.Clusters[1].Weight}, "the pool's cluster weights")
				assert.Equal(t, poolv1.FailClose, be.FailureMode)
			},
		},
		{
			name: "a shim pool with neither a local EPP nor an import is reported",
			in: Inputs{
				EndpointPickerServices: shims,
				Pools:                  []*poolv1.InferencePool{shimPool("llm", "", "")},
			},
			wantReasons: []string{ReasonNoShimClusters},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, tbl.Shims(), 1)
				assert.Empty(t, tbl.Shims()[0].Clusters)
			},
		},
		{
			name: "a bad local-endpoint-picker annotation is reported and the import still serves",
			in: Inputs{
				EndpointPickerServices: shims,
				Pools:                  []*poolv1.InferencePool{shimPool("llm", "", "llm-epp:http")},
				Imports:                []*v1alphaImport{twoClusters},
			},
			wantReasons: []string{ReasonInvalidAnnotation},
			check: func(t *testing.T, tbl *Table) {
				assert.Len(t, tbl.Shims()[0].Clusters, 2)
			},
		},
		{
			name: "pools whose EPP is another Service are no shim pools",
			in: Inputs{
				EndpointPickerServices: shims,
				Pools:                  []*poolv1.InferencePool{pool("llm", "")},
				Services:               []*corev1.Service{eppService("llm", "127.0.1.1")},
			},
			check: func(t *testing.T, tbl *Table) {
				assert.True(t, tbl.ShimMode())
				assert.Empty(t, tbl.Shims())
			},
		},
		{
			name: "two shim pools behind one sidecar Service are reported as ambiguous",
			in: Inputs{
				EndpointPickerServices: shims,
				Pools:                  []*poolv1.InferencePool{shimPool("llm", "", ""), shimPool("chat", "", "")},
				Imports:                []*v1alphaImport{twoClusters, importOf("chat", imported{name: "cluster-a", addr: "127.0.2.2"})},
			},
			wantReasons: []string{ReasonAmbiguousShimPool},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, tbl.Shims(), 2)
				assert.Equal(t, "chat", tbl.Shims()[0].Name, "by namespace/name")
			},
		},
		{
			name: "an HTTPRoute backendRef to a shim pool gets the shim's clusters, never the sidecar itself",
			in: Inputs{
				EndpointPickerServices: shims,
				Routes:                 []*gatewayv1.HTTPRoute{annotate(route("r", 0, nil, rule(nil, poolRef("llm", nil))), ClusterWeightsAnnotation, "cluster-c=5")},
				Pools:                  []*poolv1.InferencePool{shimPool("llm", "", "llm-epp")},
				Services:               []*corev1.Service{eppService("llm", "127.0.1.1")},
				Imports:                []*v1alphaImport{twoClusters},
				LocalCluster:           "cluster-b",
			},
			check: func(t *testing.T, tbl *Table) {
				be := only(t, tbl)
				assert.True(t, be.Shim)
				assert.Equal(t, []string{"cluster-b=127.0.1.1:9002", "cluster-a=127.0.2.1:9002", "cluster-c=127.0.3.1:9002"}, clusterNames(be.Clusters))
				assert.EqualValues(t, 5, be.Clusters[2].Weight, "the route's cluster weights")
			},
		},
		{
			name: "an import backendRef's local pool that is a shim pool is its real local EPP (LocalFirst)",
			in: Inputs{
				EndpointPickerServices: shims,
				Routes:                 []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))},
				Pools:                  []*poolv1.InferencePool{shimPool("llm", "", "llm-epp")},
				Services:               []*corev1.Service{eppService("llm", "127.0.1.1")},
				Imports:                []*v1alphaImport{twoClusters},
			},
			check: func(t *testing.T, tbl *Table) {
				be := only(t, tbl)
				require.NotNil(t, be.Local)
				assert.Equal(t, "127.0.1.1:9002", be.Local.EPP)
				assert.Len(t, be.Clusters, 2)
			},
		},
		{
			name: "without sidecar Services the table is not in shim mode",
			in: Inputs{
				Pools:   []*poolv1.InferencePool{shimPool("llm", "", "")},
				Imports: []*v1alphaImport{twoClusters},
			},
			check: func(t *testing.T, tbl *Table) {
				assert.False(t, tbl.ShimMode())
				assert.Empty(t, tbl.Shims())
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, errs := Build(tt.in)
			assert.Equal(t, tt.wantReasons, reasons(errs), "%v", errs)
			tt.check(t, tbl)
		})
	}
}

func poolMetadata(pool string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		ShimMetadataNamespace: {Fields: map[string]*structpb.Value{ShimPoolKey: structpb.NewStringValue(pool)}},
	}}
}

func TestServerAsEPPShim(t *testing.T) {
	local := startFakeEPP(t, "epp-b", "10.2.0.1:8000")
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	lh, lp := hostPort(t, local.addr)
	localSvc := eppService("llm", lh)
	localSvc.Spec.Ports[0].Port = lp
	weighted := func(p *poolv1.InferencePool) *poolv1.InferencePool {
		return annotate(p, PolicyAnnotation, string(PolicyWeighted), LocalEndpointPickerAnnotation, p.Annotations[LocalEndpointPickerAnnotation])
	}
	in := Inputs{
		EndpointPickerServices: []types.NamespacedName{sidecarService},
		LocalCluster:           "cluster-b",
		Pools:                  []*poolv1.InferencePool{weighted(shimPool("llm", "", "llm-epp"))},
		Services:               []*corev1.Service{localSvc},
		Imports:                []*v1alphaImport{twoClusterImport(t, a, c)},
	}
	h := startServer(t, in, &fakeState{})

	t.Run("a request without an HTTPRoute goes to the pool's local EPP and the import's clusters by weight", func(t *testing.T) {
		got := map[string]int{}
		for range 30 {
			res := h.do(t, extproctest.Request{Authority: "anything", Path: "/v1/completions", Body: chatBody})
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
			res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Headers: http.Header{RelayedHeader: {"cluster-a"}}})
			require.Nil(t, res.Immediate)
			assert.Equal(t, "10.2.0.1:8000", res.Destination)
		}
		assert.Equal(t, before, a.calls.Load()+c.calls.Load(), "no request goes back to another cluster")

		local.mode.Store(eppFail)
		defer local.mode.Store(eppRoute)
		res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Headers: http.Header{RelayedHeader: {"cluster-a"}}})
		require.NotNil(t, res.Immediate, "a relayed request fails closed when the local EPP fails")
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
	})

	t.Run("the gateway's metadata chooses among several shim pools", func(t *testing.T) {
		in := in
		in.Pools = append([]*poolv1.InferencePool{shimPool("chat", "", "")}, in.Pools...)
		ch, cp := hostPort(t, c.addr)
		in.Imports = append([]*v1alphaImport{importOf("chat", imported{name: "cluster-c", addr: ch, port: cp})}, in.Imports...)
		h := startServer(t, in, &fakeState{})

		res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Metadata: poolMetadata(ns + "/chat")})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.3.0.1:8000", res.Destination)

		res = h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody})
		require.NotNil(t, res.Immediate, "without metadata or a route the pool is unknown")
		assert.Equal(t, http.StatusInternalServerError, res.Immediate.StatusCode)

		res = h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Metadata: poolMetadata(ns + "/nope")})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)

		res = h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Metadata: poolMetadata("nope")})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusBadRequest, res.Immediate.StatusCode)
	})

	t.Run("the HTTPRoute rule chooses among several shim pools when it names one of them", func(t *testing.T) {
		in := in
		in.Pools = append([]*poolv1.InferencePool{shimPool("chat", "", "")}, in.Pools...)
		ch, cp := hostPort(t, c.addr)
		in.Imports = append([]*v1alphaImport{importOf("chat", imported{name: "cluster-c", addr: ch, port: cp})}, in.Imports...)
		in.Routes = []*gatewayv1.HTTPRoute{route("r", 0, []string{"chat.example.com"}, rule(nil, poolRef("chat", nil)))}
		h := startServer(t, in, &fakeState{})

		res := h.do(t, extproctest.Request{Authority: "chat.example.com", Path: "/v1/completions", Body: chatBody})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.3.0.1:8000", res.Destination)
	})

	t.Run("no shim pool answers 503", func(t *testing.T) {
		in := in
		in.Pools = nil
		h := startServer(t, in, &fakeState{})
		res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
	})
}
