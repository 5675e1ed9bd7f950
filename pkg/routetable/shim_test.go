package routetable

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/routingpolicy"
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
				assert.Equal(t, routingpolicy.HealthBased, be.Policy.Name)
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
				assert.Equal(t, routingpolicy.Weighted, be.Policy.Name, "the pool's policy annotation")
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
			name: "two shim pools behind one sidecar Service on different ports are not ambiguous, and name the ports the sidecar listens on",
			in: Inputs{
				EndpointPickerServices: shims,
				Pools:                  []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9011), onPort(shimPool("code", "", ""), 0)},
				Imports:                []*v1alphaImport{twoClusters, importOf("chat", imported{name: "cluster-a", addr: "127.0.2.2"})},
			},
			wantReasons: []string{ReasonNoShimClusters},
			check: func(t *testing.T, tbl *Table) {
				assert.Equal(t, []int32{9010, 9011}, tbl.ShimPorts(), "a pool without a port uses the main listener")
				assert.EqualValues(t, 9011, tbl.Shim(types.NamespacedName{Namespace: ns, Name: "chat"}).ShimPort)
			},
		},
		{
			name: "a sidecar Service port that does not reach the sidecar on the port the pool names is reported",
			in: Inputs{
				EndpointPickerServices: shims,
				Pools:                  []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9011), onPort(shimPool("code", "", ""), 9012)},
				Services: []*corev1.Service{{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sidecarService.Name},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
						{Name: "llm", Port: 9010},
						{Name: "chat", Port: 9011, TargetPort: intstr.FromInt32(9002)},
						{Name: "code", Port: 9013, TargetPort: intstr.FromInt32(9012)},
					}},
				}},
				Imports: []*v1alphaImport{twoClusters, importOf("chat", imported{name: "cluster-a", addr: "127.0.2.2"}), importOf("code", imported{name: "cluster-a", addr: "127.0.2.3"})},
			},
			wantReasons: []string{ReasonShimPortMismatch, ReasonShimPortMismatch},
			check: func(t *testing.T, tbl *Table) {
				assert.Equal(t, []int32{9010, 9011, 9012}, tbl.ShimPorts(), "the pools are served all the same")
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

// TestShimPoolPolicy: the policy and cluster weights of a request for a
// shim pool follow the rule every backendRef follows: the annotation of
// the request's HTTPRoute when its rule names the pool, else the pool's,
// else the default; however the pool was found (the only shim pool, the
// gateway's metadata, the rule).
func TestShimPoolPolicy(t *testing.T) {
	imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}, imported{name: "cluster-c", addr: "127.0.3.1"})
	poolSays := func(p *poolv1.InferencePool) *poolv1.InferencePool {
		return annotate(p, PolicyAnnotation, "LocalFirst", ClusterWeightsAnnotation, "cluster-a=2")
	}
	routeTo := func(pool string, kv ...string) *gatewayv1.HTTPRoute {
		return annotate(route("r-"+pool, 0, []string{pool + ".example.com"}, rule(nil, poolRef(pool, nil))), kv...)
	}
	request := func(host string) *RequestAttrs { return &RequestAttrs{Host: host, Path: "/v1/completions"} }
	tests := []struct {
		name        string
		pools       []*poolv1.InferencePool
		routes      []*gatewayv1.HTTPRoute
		metadata    string
		req         *RequestAttrs
		wantPolicy  string
		wantWeights []int64
	}{
		{
			name:  "the route's annotation wins over the pool's for the only shim pool",
			pools: []*poolv1.InferencePool{poolSays(shimPool("llm", "", ""))},
			routes: []*gatewayv1.HTTPRoute{routeTo("llm", PolicyAnnotation, "PrefixAffinity",
				ClusterWeightsAnnotation, "cluster-c=3")},
			req:        request("llm.example.com"),
			wantPolicy: routingpolicy.PrefixAffinity, wantWeights: []int64{1, 3},
		},
		{
			name:       "a route without the annotation leaves the pool's",
			pools:      []*poolv1.InferencePool{poolSays(shimPool("llm", "", ""))},
			routes:     []*gatewayv1.HTTPRoute{routeTo("llm")},
			req:        request("llm.example.com"),
			wantPolicy: routingpolicy.LocalFirst, wantWeights: []int64{2, 1},
		},
		{
			name:       "neither annotation: the default",
			pools:      []*poolv1.InferencePool{shimPool("llm", "", "")},
			routes:     []*gatewayv1.HTTPRoute{routeTo("llm")},
			req:        request("llm.example.com"),
			wantPolicy: routingpolicy.HealthBased, wantWeights: []int64{1, 1},
		},
		{
			name:       "a request no route matches gets the pool's",
			pools:      []*poolv1.InferencePool{poolSays(shimPool("llm", "", ""))},
			routes:     []*gatewayv1.HTTPRoute{routeTo("llm", PolicyAnnotation, "PrefixAffinity")},
			req:        request("other.example.com"),
			wantPolicy: routingpolicy.LocalFirst, wantWeights: []int64{2, 1},
		},
		{
			name:       "no HTTPRoute at all: the pool's",
			pools:      []*poolv1.InferencePool{poolSays(shimPool("llm", "", ""))},
			req:        request("llm.example.com"),
			wantPolicy: routingpolicy.LocalFirst, wantWeights: []int64{2, 1},
		},
		{
			name:       "the pool the gateway's metadata names takes its route's annotation",
			pools:      []*poolv1.InferencePool{shimPool("llm", "", ""), shimPool("chat", "", "")},
			routes:     []*gatewayv1.HTTPRoute{routeTo("llm", PolicyAnnotation, "Weighted")},
			metadata:   ns + "/llm",
			req:        request("llm.example.com"),
			wantPolicy: routingpolicy.Weighted, wantWeights: []int64{1, 1},
		},
		{
			name:       "a route to another shim pool does not decide for the one the metadata names",
			pools:      []*poolv1.InferencePool{poolSays(shimPool("llm", "", "")), shimPool("chat", "", "")},
			routes:     []*gatewayv1.HTTPRoute{routeTo("chat", PolicyAnnotation, "Weighted")},
			metadata:   ns + "/llm",
			req:        request("chat.example.com"),
			wantPolicy: routingpolicy.LocalFirst, wantWeights: []int64{2, 1},
		},
		{
			name:       "the shim pool the rule names among several takes the route's annotation",
			pools:      []*poolv1.InferencePool{poolSays(shimPool("llm", "", "")), shimPool("chat", "", "")},
			routes:     []*gatewayv1.HTTPRoute{routeTo("llm", PolicyAnnotation, "MetricsBased")},
			req:        request("llm.example.com"),
			wantPolicy: routingpolicy.MetricsBased, wantWeights: []int64{2, 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, _ := Build(Inputs{
				EndpointPickerServices: []types.NamespacedName{sidecarService},
				Routes:                 tt.routes,
				Pools:                  tt.pools,
				Imports:                []*v1alphaImport{imp, importOf("chat", imported{name: "cluster-a", addr: "127.0.2.2"})},
			})
			be, code, msg := tbl.ShimFor(tt.metadata, Arrival{Port: 9002, Main: true}, tt.req)
			require.NotNil(t, be, "%d %s", code, msg)
			assert.Equal(t, "llm", be.Name)
			assert.Equal(t, tt.wantPolicy, be.Policy.Name)
			var weights []int64
			for _, c := range be.Clusters {
				weights = append(weights, c.Weight)
			}
			assert.Equal(t, tt.wantWeights, weights, "cluster weights")
		})
	}
}

// onPort sets the port of a pool's endpointPickerRef; 0 removes it.
func onPort(p *poolv1.InferencePool, port int32) *poolv1.InferencePool {
	p.Spec.EndpointPickerRef.Port = nil
	if port != 0 {
		p.Spec.EndpointPickerRef.Port = &poolv1.Port{Number: port}
	}
	return p
}

// TestShimPoolFromPort: a gateway that sends nothing naming a route or
// pool (NGINX Gateway Fabric) connects to the port of the pool's
// endpointPickerRef; that port tells the pool apart from the others that
// share the sidecar's Service.
func TestShimPoolFromPort(t *testing.T) {
	imports := []*v1alphaImport{
		importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}),
		importOf("chat", imported{name: "cluster-a", addr: "127.0.2.2"}),
		importOf("code", imported{name: "cluster-a", addr: "127.0.2.3"}),
	}
	routeTo := func(pool string) *gatewayv1.HTTPRoute {
		return route("r-"+pool, 0, []string{pool + ".example.com"}, rule(nil, poolRef(pool, nil)))
	}
	noRoute := &RequestAttrs{}
	tests := []struct {
		name     string
		pools    []*poolv1.InferencePool
		routes   []*gatewayv1.HTTPRoute
		metadata string
		at       Arrival
		req      *RequestAttrs
		want     string
		wantCode int
		wantMsg  string
	}{
		{
			name:  "the pool whose port the connection arrived on",
			pools: []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9011)},
			at:    Arrival{Port: 9011}, req: noRoute,
			want: "chat",
		},
		{
			name:  "a pool without a port is the main listener's",
			pools: []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 0), onPort(shimPool("chat", "", ""), 9011)},
			at:    Arrival{Port: 9002, Main: true}, req: noRoute,
			want: "llm",
		},
		{
			name:  "a pool naming the main listener's port is the main listener's too",
			pools: []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9002), onPort(shimPool("chat", "", ""), 9011)},
			at:    Arrival{Port: 9002, Main: true}, req: noRoute,
			want: "llm",
		},
		{
			name:     "the gateway's metadata wins over the port",
			pools:    []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9011)},
			metadata: ns + "/llm",
			at:       Arrival{Port: 9011}, req: noRoute,
			want: "llm",
		},
		{
			name:   "two pools on the arrival port: the route's rule tells them apart",
			pools:  []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9010), onPort(shimPool("code", "", ""), 9011)},
			routes: []*gatewayv1.HTTPRoute{routeTo("chat")},
			at:     Arrival{Port: 9010}, req: &RequestAttrs{Host: "chat.example.com", Path: "/"},
			want: "chat",
		},
		{
			name:   "a rule naming a pool of another port does not choose among those of the arrival port",
			pools:  []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9010), onPort(shimPool("code", "", ""), 9011)},
			routes: []*gatewayv1.HTTPRoute{routeTo("code")},
			at:     Arrival{Port: 9010}, req: &RequestAttrs{Host: "code.example.com", Path: "/"},
			wantCode: 500, wantMsg: "InferencePools " + ns + "/chat, " + ns + "/llm name port 9010 of mci-sidecar's Service",
		},
		{
			name:  "two pools on the arrival port and nothing else: 500 that says why",
			pools: []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9010)},
			at:    Arrival{Port: 9010}, req: noRoute,
			wantCode: 500, wantMsg: "InferencePools " + ns + "/chat, " + ns + "/llm name port 9010 of mci-sidecar's Service as their endpoint picker and neither the gateway's metadata",
		},
		{
			name:  "a port no pool names: the only shim pool",
			pools: []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010)},
			at:    Arrival{Port: 9002, Main: true}, req: noRoute,
			want: "llm",
		},
		{
			name:  "a port no pool names, several pools: 500",
			pools: []*poolv1.InferencePool{onPort(shimPool("llm", "", ""), 9010), onPort(shimPool("chat", "", ""), 9011)},
			at:    Arrival{Port: 9002, Main: true}, req: noRoute,
			wantCode: 500, wantMsg: "2 InferencePools use mci-sidecar as their endpoint picker and neither",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, _ := Build(Inputs{EndpointPickerServices: []types.NamespacedName{sidecarService}, Routes: tt.routes, Pools: tt.pools, Imports: imports})
			be, code, msg := tbl.ShimFor(tt.metadata, tt.at, tt.req)
			if tt.want == "" {
				require.Nil(t, be)
				assert.Equal(t, tt.wantCode, code)
				assert.Contains(t, msg, tt.wantMsg)
				return
			}
			require.NotNil(t, be, "%d %s", code, msg)
			assert.Equal(t, tt.want, be.Name)
		})
	}
}
