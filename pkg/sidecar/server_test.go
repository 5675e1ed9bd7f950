package sidecar

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// harness is a sidecar ext_proc Server on 127.0.0.1 with a table built from
// its inputs, and a gateway-like client.
type harness struct {
	router  *routetable.Router
	state   *fakeState
	server  *Server
	client  *envoyclient.Client
	metrics *Metrics
	// addr is the server's address.
	addr string
}

func startServer(t *testing.T, in routetable.Inputs, st *fakeState) *harness {
	t.Helper()
	return startServerWith(t, in, st, ServerConfig{})
}

func startServerWith(t *testing.T, in routetable.Inputs, st *fakeState, cfg ServerConfig) *harness {
	t.Helper()
	return startServerOpts(t, in, st, cfg, serverOptions()...)
}

// startServerOpts serves the Server with the gRPC server options opts (the
// sidecar's own are serverOptions).
func startServerOpts(t *testing.T, in routetable.Inputs, st *fakeState, cfg ServerConfig, opts ...grpc.ServerOption) *harness {
	t.Helper()
	h := &harness{router: routetable.NewRouter(), state: st}
	h.metrics = NewMetrics(prometheus.NewRegistry())
	if cfg.AttemptTimeout <= 0 {
		cfg.AttemptTimeout = 300 * time.Millisecond
	}
	cfg.Scheduling = scheduling.DefaultConfig()
	var err error
	h.server, err = newServer(h.router, st, newRelayer(cfg, nil, h.metrics), cfg, h.metrics, logr.Discard())
	require.NoError(t, err)
	tbl, _ := buildTable(in)
	h.router.Publish(tbl)
	t.Cleanup(h.server.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(srv, h.server)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c, err := envoyclient.Dial(lis.Addr().String(), envoyclient.Options{MessageTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	h.client, h.addr = c, lis.Addr().String()
	return h
}

func (h *harness) do(t *testing.T, req envoyclient.Request) *envoyclient.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.client.Do(ctx, req)
	require.NoError(t, err)
	return res
}

var chatBody = []byte(`{"model":"chat","prompt":"hello"}`)

// twoClusterImport is an import of clusters a and c whose EPPs are a and c.
func twoClusterImport(t *testing.T, a, c *fakeEPP) *v1alpha1.InferencePoolImport {
	ah, ap := hostPort(t, a.addr)
	ch, cp := hostPort(t, c.addr)
	return sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: ah, Port: ap}, sidecartest.Imported{Name: "cluster-c", Addr: ch, Port: cp})
}

func TestServerRelaysToTheChosenEPP(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	h := startServer(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, []string{"my.model.com"}, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/v1")}, sidecartest.ImportRef("llm", nil)))},
		Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
	}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}})

	res := h.do(t, envoyclient.Request{Authority: "my.model.com", Path: "/v1/completions", Body: chatBody})
	require.Nil(t, res.Immediate)
	assert.Equal(t, "10.1.0.1:8000", res.Destination, "the EPP's destination reaches the gateway")
	assert.Empty(t, res.Headers.Get("x-picked-by"), "a remote EPP's other header mutations do not reach the gateway")
	assert.Equal(t, chatBody, res.Body, "the body streams back")
	assert.Equal(t, "my.model.com", res.Headers.Get(":authority"))
	assert.Equal(t, chatBody, a.lastBody, "the EPP got the whole body")
	assert.EqualValues(t, 0, c.calls.Load())
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues("cluster-a", OutcomeRouted, "200")))

	t.Run("a request without a body", func(t *testing.T) {
		res := h.do(t, envoyclient.Request{Method: "GET", Authority: "my.model.com", Path: "/v1/models"})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.1.0.1:8000", res.Destination)
	})

	t.Run("a large body in many chunks", func(t *testing.T) {
		big := make([]byte, 300<<10)
		for i := range big {
			big[i] = 'x'
		}
		copy(big, `{"model":"chat","prompt":"`)
		big[len(big)-2], big[len(big)-1] = '"', '}'
		res := h.do(t, envoyclient.Request{Authority: "my.model.com", Path: "/v1/completions", Body: big, ChunkSize: 7000})
		require.Nil(t, res.Immediate)
		assert.Equal(t, big, res.Body)
	})

	t.Run("no matching rule is 404", func(t *testing.T) {
		res := h.do(t, envoyclient.Request{Authority: "other.com", Path: "/v1/completions", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusNotFound, res.Immediate.StatusCode)
	})
}

func TestServerFailsOverToTheNextCluster(t *testing.T) {
	tests := []struct {
		name string
		// break the first EPP
		breakA func(a *fakeEPP)
		// whether the failure counts against the EPP's health
		wantFailed bool
	}{
		{name: "the first EPP ends the stream with an error", breakA: func(a *fakeEPP) { a.mode.Store(eppFail) }, wantFailed: true},
		{name: "the first EPP does not answer in time", breakA: func(a *fakeEPP) { a.mode.Store(eppHang) }, wantFailed: true},
		{name: "the first EPP is down", breakA: func(a *fakeEPP) { a.srv.Stop() }, wantFailed: true},
		{name: "the first EPP's pool has no endpoint (503)", breakA: func(a *fakeEPP) { a.mode.Store(eppUnavailable) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
			c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
			st := &fakeState{health: map[string]Health{"cluster-a": HealthServing}}
			h := startServer(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
				Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
			}, st)
			tt.breakA(a)

			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
			require.Nil(t, res.Immediate, "%+v", res.Immediate)
			assert.Equal(t, "10.3.0.1:8000", res.Destination, "the next cluster answered")
			assert.Equal(t, chatBody, res.Body)
			assert.EqualValues(t, 1, c.calls.Load())
			assert.Eventually(t, func() bool { return testutil.ToFloat64(h.metrics.eppStreams) == 0 }, 5*time.Second, 10*time.Millisecond,
				"the failed EPP's stream and the served one are released: %v open", testutil.ToFloat64(h.metrics.eppStreams))
			if tt.wantFailed {
				assert.Equal(t, []string{"cluster-a"}, st.failed, "the failure is recorded against the EPP")
			} else {
				assert.Empty(t, st.failed)
			}
		})
	}
}

func TestServerFailureModes(t *testing.T) {
	setup := func(t *testing.T, annotations ...string) (*harness, *fakeEPP, *fakeEPP) {
		a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
		c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
		h := startServer(t, routetable.Inputs{
			Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), annotations...)},
			Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
		}, &fakeState{health: map[string]Health{"cluster-a": HealthServing, "cluster-c": HealthServing}})
		return h, a, c
	}

	for _, tt := range []struct {
		name, wantDetails string
		mode              int32
	}{
		{name: "FailClose answers 503 when no cluster's EPP answers", mode: eppFail, wantDetails: "no cluster's EPP answered"},
		{name: "FailClose answers the last EPP's 503, in the sidecar's words", mode: eppUnavailable, wantDetails: "answered 503"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, a, c := setup(t)
			a.mode.Store(tt.mode)
			c.mode.Store(tt.mode)
			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
			require.NotNil(t, res.Immediate)
			assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
			assert.Contains(t, res.Immediate.Details, tt.wantDetails)
		})
	}

	t.Run("FailOpen lets the request go on unchanged without a destination", func(t *testing.T) {
		h, a, c := setup(t, routetable.FailureModeAnnotation, "FailOpen")
		a.mode.Store(eppFail)
		c.mode.Store(eppFail)
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
		require.Nil(t, res.Immediate)
		assert.Empty(t, res.Destination)
		assert.Equal(t, chatBody, res.Body)
	})

	t.Run("an EPP's own refusal other than 503 is relayed, not retried", func(t *testing.T) {
		h, a, c := setup(t, routetable.PolicyAnnotation, "Weighted", routetable.ClusterWeightsAnnotation, "cluster-c=0")
		a.mode.Store(eppShed)
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusTooManyRequests, res.Immediate.StatusCode)
		assert.EqualValues(t, 0, c.calls.Load())
	})

	t.Run("FailOpen tries the clusters the policy left out before giving up", func(t *testing.T) {
		a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
		c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
		h := startServer(t, routetable.Inputs{
			Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), routetable.FailureModeAnnotation, "FailOpen")},
			Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
		}, &fakeState{health: map[string]Health{"cluster-a": HealthNotServing, "cluster-c": HealthNotServing}})
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.1.0.1:8000", res.Destination, "a probe said down, the EPP answered")
	})

	t.Run("FailClose does not try clusters known to be down", func(t *testing.T) {
		a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
		c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
		h := startServer(t, routetable.Inputs{
			Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
			Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
		}, &fakeState{health: map[string]Health{"cluster-a": HealthNotServing, "cluster-c": HealthNotServing}})
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
		require.NotNil(t, res.Immediate)
		assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
		assert.Contains(t, res.Immediate.Details, "has no cluster available")
		assert.EqualValues(t, 0, a.calls.Load()+c.calls.Load())
	})
}

func TestServerParentMode(t *testing.T) {
	h := startServer(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, []string{"my.model.com"}, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
		Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Parent: "10.2.0.9"})},
	}, &fakeState{})
	res := h.do(t, envoyclient.Request{Authority: "my.model.com", Path: "/v1/completions?x=1", Body: chatBody})
	require.Nil(t, res.Immediate)
	assert.Equal(t, "10.2.0.9:80", res.Destination, "the remote parent gateway")
	assert.Equal(t, "my.model.com", res.Headers.Get(":authority"), "the host is kept")
	assert.Equal(t, "/v1/completions?x=1", res.Headers.Get(":path"), "the path is kept")
	assert.Equal(t, chatBody, res.Body)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues("cluster-a", OutcomeParent, "200")))
}

func TestServerGatewayAPIErrors(t *testing.T) {
	h := startServer(t, routetable.Inputs{
		Routes: []*gatewayv1.HTTPRoute{
			sidecartest.Route("missing", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/missing")}, sidecartest.ImportRef("nope", nil))),
			sidecartest.Route("service", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/service")}, sidecartest.BackendRef("", "Service", "svc", nil))),
			sidecartest.Route("none", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/none")})),
			sidecartest.Route("notready", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/notready")}, sidecartest.ImportRef("down", nil))),
		},
		Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("down", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.0.1", Port: 1, Ready: metav1.ConditionFalse})},
	}, &fakeState{})
	for path, code := range map[string]int{"/missing": 500, "/service": 500, "/none": 500, "/notready": 503, "/elsewhere": 404} {
		t.Run(path, func(t *testing.T) {
			res := h.do(t, envoyclient.Request{Path: path, Body: chatBody})
			require.NotNil(t, res.Immediate)
			assert.Equal(t, code, res.Immediate.StatusCode, res.Immediate.Details)
		})
	}
}

func TestServerShedsOnlyWhenEveryClusterIsSaturated(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	models := []*v1alpha2.InferenceModel{{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch"},
		Spec:       v1alpha2.InferenceModelSpec{ModelName: "batch", Criticality: ptr.To(v1alpha2.Sheddable), PoolRef: v1alpha2.PoolObjectReference{Name: "llm"}},
	}}
	now := time.Now()
	saturated := &PoolMetrics{AverageQueue: 20, AverageKVCache: 0.9, ReadyPods: 2, UpdatedAt: now.Add(time.Hour)}
	idle := &PoolMetrics{AverageQueue: 0, AverageKVCache: 0.1, ReadyPods: 2, UpdatedAt: now.Add(time.Hour)}
	st := &fakeState{metrics: map[string]*PoolMetrics{"cluster-a": saturated, "cluster-c": idle}}
	h := startServer(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), routetable.PolicyAnnotation, "MetricsBased")},
		Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
		Models:  models,
		Objectives: []*v1alpha2.InferenceObjective{
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "background"}, Spec: v1alpha2.InferenceObjectiveSpec{Priority: ptr.To[int32](-10), PoolRef: v1alpha2.PoolObjectReference{Name: "llm"}}},
			requestmodel.ObjectiveFromLLMD(&llmdv1alpha2.InferenceObjective{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "interactive"}, Spec: v1alpha2.InferenceObjectiveSpec{Priority: ptr.To[int32](1), PoolRef: v1alpha2.PoolObjectReference{Name: "llm"}}}),
		},
	}, st)
	batch := []byte(`{"model":"batch","prompt":"x"}`)

	res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: batch})
	require.Nil(t, res.Immediate)
	assert.Equal(t, "10.3.0.1:8000", res.Destination, "the cluster with capacity")

	st.metrics["cluster-c"] = saturated
	res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: batch})
	require.NotNil(t, res.Immediate)
	assert.Equal(t, http.StatusTooManyRequests, res.Immediate.StatusCode)

	res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
	require.Nil(t, res.Immediate, "a standard request is never shed")

	// The InferenceObjective a request names decides over the InferenceModel.
	background := http.Header{}
	background.Set(requestmodel.ObjectiveHeader, "background")
	res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Headers: background})
	require.NotNil(t, res.Immediate, "a request naming an objective of priority below 0 is sheddable")
	assert.Equal(t, http.StatusTooManyRequests, res.Immediate.StatusCode)
	interactive := http.Header{}
	interactive.Set(requestmodel.LLMDObjectiveHeader, "interactive")
	res = h.do(t, envoyclient.Request{Path: "/v1/completions", Body: batch, Headers: interactive})
	require.Nil(t, res.Immediate, "a sheddable model named with an objective of priority above 0 is not shed")
}

// localAndRemoteEPPs starts the fake EPPs of the local pool llm
// (destination 10.2.0.1:8000) and of cluster-a of its import (10.1.0.1:8000),
// and returns them with the pool, its EPP Service and the import.
func localAndRemoteEPPs(t *testing.T) (local, remote *fakeEPP, in routetable.Inputs) {
	local = startFakeEPP(t, "epp-local", "10.2.0.1:8000")
	remote = startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	lh, lp := hostPort(t, local.addr)
	rh, rp := hostPort(t, remote.addr)
	p := sidecartest.Pool("llm", "")
	p.Spec.EndpointPickerRef.Port.Number = lp
	return local, remote, routetable.Inputs{
		Pools:    []*poolv1.InferencePool{p},
		Services: []*corev1.Service{sidecartest.EPPService("llm", lh)},
		Imports:  []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: rh, Port: rp})},
	}
}

func TestServerSubsetHintGoesToTheLocalEPPOnly(t *testing.T) {
	local, remote, in := localAndRemoteEPPs(t)
	in.Routes = []*gatewayv1.HTTPRoute{
		sidecartest.Route("local", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/local")}, sidecartest.PoolRef("llm", nil))),
		sidecartest.Route("remote", 0, nil, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/remote")}, sidecartest.ImportRef("llm", nil))),
	}
	h := startServer(t, in, &fakeState{})
	hint := extproc.SubsetHintMetadata("10.2.0.1:8000")

	res := h.do(t, envoyclient.Request{Path: "/local", Body: chatBody, Metadata: hint})
	assert.Equal(t, "10.2.0.1:8000", res.Destination)
	res = h.do(t, envoyclient.Request{Path: "/remote", Body: chatBody, Metadata: hint})
	assert.Equal(t, "10.1.0.1:8000", res.Destination)
	assert.Equal(t, []bool{true}, local.subsets)
	assert.Equal(t, []bool{false}, remote.subsets, "the local endpoints mean nothing to a remote EPP")
}

// TestServerSplitsFiftyFifty runs the proposal's 50/50 example through the
// data path: a local InferencePool and an InferencePoolImport, weight 50
// each, and every request relayed to the chosen EPP.
func TestServerSplitsFiftyFifty(t *testing.T) {
	local, remote, in := localAndRemoteEPPs(t)
	in.Routes = []*gatewayv1.HTTPRoute{sidecartest.Route("llm-route", 0, []string{"my.model.com"}, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/completions")},
		sidecartest.PoolRef("llm", ptr.To[int32](50)), sidecartest.ImportRef("llm", ptr.To[int32](50))))}
	h := startServer(t, in, &fakeState{})

	const n = 400
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range n / 4 {
				res := h.do(t, envoyclient.Request{Authority: "my.model.com", Path: "/completions", Body: chatBody})
				assert.NotEmpty(t, res.Destination)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, n/2, local.calls.Load())
	assert.EqualValues(t, n/2, remote.calls.Load())
}

func TestRelayCollectsTheWholeAnswer(t *testing.T) {
	e := startFakeEPP(t, "epp", "10.0.0.1:8000")
	r := newRelayer(ServerConfig{AttemptTimeout: time.Second}, nil, nil)
	defer r.close()
	headers := func(eos bool) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/")}}}, EndOfStream: eos,
		}}}
	}
	chunk := func(s string, eos bool) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(s), EndOfStream: eos}}}
	}
	trailers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}

	tests := []struct {
		name      string
		msgs      []*extprocv3.ProcessingRequest
		wantShape shape
		wantKinds []string
	}{
		{name: "headers only", msgs: []*extprocv3.ProcessingRequest{headers(true)}, wantKinds: []string{"headers"}},
		{
			name: "a body ended by end_of_stream", msgs: []*extprocv3.ProcessingRequest{headers(false), chunk("ab", false), chunk("c", true)},
			wantShape: shape{hasBody: true}, wantKinds: []string{"headers", "body"},
		},
		{
			name: "a body ended by trailers", msgs: []*extprocv3.ProcessingRequest{headers(false), chunk("abc", false), trailers},
			wantShape: shape{hasBody: true, endedByTrailers: true}, wantKinds: []string{"headers", "body", "trailers"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.wantShape, shapeOf(tt.msgs))
			resps, _, err := r.relay(context.Background(), e.addr, outbound{msgs: tt.msgs}, false, 0)
			require.NoError(t, err)
			var kinds []string
			for _, resp := range resps {
				switch {
				case resp.GetRequestHeaders() != nil:
					kinds = append(kinds, "headers")
					assert.Equal(t, "10.0.0.1:8000", extproc.DestinationFromMetadata(resp.GetDynamicMetadata()))
				case resp.GetRequestBody() != nil:
					kinds = append(kinds, "body")
				case resp.GetRequestTrailers() != nil:
					kinds = append(kinds, "trailers")
				}
			}
			assert.Equal(t, tt.wantKinds, kinds)
		})
	}

	t.Run("an EPP that is not there fails fast", func(t *testing.T) {
		dead, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := dead.Addr().String()
		require.NoError(t, dead.Close())
		start := time.Now()
		_, _, err = r.relay(context.Background(), addr, outbound{msgs: []*extprocv3.ProcessingRequest{headers(true)}}, false, 0)
		require.ErrorIs(t, err, errNoAnswer)
		assert.Less(t, time.Since(start), 500*time.Millisecond)
	})
}
