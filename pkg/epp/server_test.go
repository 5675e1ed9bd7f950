package epp_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	"github.com/mci-dev/mci/pkg/epp"
	mciextproc "github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/test/envoyclient"
)

// modelServer is a stand-in for a vLLM pod on 127.0.0.1: /metrics with
// pinned values, and an OpenAI endpoint that says who served the request and
// for which model.
type modelServer struct {
	name    string
	queue   int
	kv      float64
	loras   []string
	maxLoRA int
	// running, when set, is exposed as vllm:num_requests_running.
	running *int
	srv     *httptest.Server
}

func (m *modelServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		fmt.Fprintf(w, `# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="base"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="base"} %g
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="%d",running_lora_adapters="%s",waiting_lora_adapters=""} 1.7435e+09
`, m.queue, m.kv, m.maxLoRA, strings.Join(m.loras, ","))
		if m.running != nil {
			fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"base\"} %d\n", *m.running)
		}
		return
	}
	var body struct {
		Model string `json:"model"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"served_by": m.name, "model": body.Model, "path": r.URL.Path})
}

func startModelServers(t testing.TB, servers ...*modelServer) []epp.Endpoint {
	t.Helper()
	var eps []epp.Endpoint
	for _, m := range servers {
		m.srv = httptest.NewServer(m)
		t.Cleanup(m.srv.Close)
		eps = append(eps, epp.Endpoint{Name: m.name, Address: m.srv.Listener.Addr().String()})
	}
	return eps
}

func pod(name string, queue int, kv float64, loras ...string) *modelServer {
	return &modelServer{name: name, queue: queue, kv: kv, loras: loras, maxLoRA: 2}
}

// The InferenceModels of the tests: seed 001's examples need a critical
// request for LoRA-X, a sheddable request for the base model and a critical
// request for LoRA-Y.
var testModels = []*v1alpha2.InferenceModel{
	inferenceModel("assistant-x", v1alpha2.Critical, "lora-x"),
	inferenceModel("batch", v1alpha2.Sheddable, "base"),
	inferenceModel("assistant-y", v1alpha2.Critical, "lora-y"),
}

func inferenceModel(name string, crit v1alpha2.Criticality, target string) *v1alpha2.InferenceModel {
	im := &v1alpha2.InferenceModel{}
	im.Name, im.Namespace = name, "default"
	im.Spec = v1alpha2.InferenceModelSpec{
		ModelName:    name,
		Criticality:  ptr.To(crit),
		TargetModels: []v1alpha2.TargetModel{{Name: target}},
		PoolRef:      v1alpha2.PoolObjectReference{Name: "pool"},
	}
	return im
}

type testEPP struct {
	*epp.EPP
	client *envoyclient.Client
}

// startEPP runs an EPP on 127.0.0.1 over eps and waits until it is ready
// and has scraped every endpoint.
func startEPP(t testing.TB, cfg epp.Config, eps []epp.Endpoint) *testEPP {
	t.Helper()
	e, err := newTestEPP(cfg, eps)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	require.Eventually(t, func() bool {
		// Ready first: before, the pool may not have its endpoints yet.
		if healthStatus(t, e.HealthAddr(), epp.ReadinessService) != healthpb.HealthCheckResponse_SERVING {
			return false
		}
		for _, ep := range e.Pool().Endpoints() {
			if e.Pool().Metrics(ep) == nil {
				return false
			}
		}
		return len(e.Pool().Endpoints()) == len(eps)
	}, 10*time.Second, 10*time.Millisecond)
	client, err := envoyclient.Dial(e.GRPCAddr(), envoyclient.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	return &testEPP{EPP: e, client: client}
}

// newTestEPP builds an EPP on 127.0.0.1 over eps and testModels, with the
// defaults of the tests filled into cfg.
func newTestEPP(cfg epp.Config, eps []epp.Endpoint) (*epp.EPP, error) {
	cfg.BindAddress = "127.0.0.1"
	cfg.PoolName = "pool"
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = 20 * time.Millisecond
	}
	if cfg.Picker.Scheduling == (scheduling.Config{}) {
		cfg.Picker.Scheduling = scheduling.DefaultConfig()
	}
	cfg.Picker.BaseModels = []string{"base"}
	if cfg.Rand == nil {
		cfg.Rand = rand.NewPCG(1, 2)
	}
	return epp.New(cfg, epp.StaticSource{Endpoints: eps, Config: requestmodel.ModelConfig{Models: testModels}})
}

func healthStatus(t testing.TB, addr, service string) healthpb.HealthCheckResponse_ServingStatus {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.GetStatus()
}

func completion(model string) []byte {
	return []byte(`{"model":"` + model + `","prompt":"Write a haiku about GPUs.","max_tokens":32}`)
}

func (e *testEPP) do(t *testing.T, req envoyclient.Request) *envoyclient.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if req.Path == "" {
		req.Path = "/v1/completions"
	}
	res, err := e.client.Do(ctx, req)
	require.NoError(t, err)
	return res
}

// nameOf maps a destination back to the model server's name.
func nameOf(eps []epp.Endpoint, addr string) string {
	for _, e := range eps {
		if e.Address == addr {
			return e.Name
		}
	}
	return "unknown " + addr
}

func TestSeedExamples(t *testing.T) {
	chatBody := func(model string) []byte {
		return []byte(`{"model":"` + model + `","messages":[{"role":"user","content":"Hello"}]}`)
	}
	tests := []struct {
		name       string
		pods       []*modelServer
		body       []byte
		want       string
		wantTarget string
	}{
		{
			name:       "example 1: a critical request for LoRA-X goes to the low-queue pod with LoRA-X loaded",
			pods:       []*modelServer{pod("A", 10, 0.30, "lora-x"), pod("B", 5, 0.70), pod("C", 60, 0.20, "lora-x")},
			body:       completion("assistant-x"),
			want:       "A",
			wantTarget: "lora-x",
		},
		{
			name:       "example 2: a sheddable request goes to the only pod with capacity",
			pods:       []*modelServer{pod("A", 6, 0.85), pod("B", 4, 0.75), pod("C", 7, 0.60)},
			body:       chatBody("batch"),
			want:       "B",
			wantTarget: "base",
		},
		{
			name:       "example 3: a critical request for LoRA-Y with high queues everywhere goes to the least-queued pod with LoRA-Y",
			pods:       []*modelServer{pod("A", 70, 0.40, "lora-y"), pod("B", 80, 0.60, "lora-y"), pod("C", 65, 0.70)},
			body:       chatBody("assistant-y"),
			want:       "A",
			wantTarget: "lora-y",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eps := startModelServers(t, tt.pods...)
			e := startEPP(t, epp.Config{}, eps)
			for range 20 {
				res := e.do(t, envoyclient.Request{Body: tt.body, ChunkSize: 16})
				require.Nil(t, res.Immediate, "immediate response %+v", res.Immediate)
				if !assert.Equal(t, tt.want, nameOf(eps, res.Destination)) {
					for _, ep := range eps {
						t.Logf("%s %s %+v", ep.Name, ep.Address, e.Pool().Metrics(ep))
					}
				}
				assert.Empty(t, res.Fallbacks)
				assert.Equal(t, res.Destination, mciextproc.DestinationFromMetadata(res.DynamicMetadata))
				b, err := requestmodel.ParseBody(res.Body)
				require.NoError(t, err)
				assert.Equal(t, tt.wantTarget, b.Model(), "the body is rewritten to the target model")
				assert.Equal(t, strconv.Itoa(len(res.Body)), res.Headers.Get("content-length"))
			}
		})
	}
}

func TestErrors(t *testing.T) {
	saturated := startModelServers(t, pod("A", 30, 0.95), pod("B", 6, 0.50))
	e := startEPP(t, epp.Config{MaxRequestBodyBytes: 1024}, saturated)
	empty := startEPP(t, epp.Config{}, nil)

	tests := []struct {
		name     string
		epp      *testEPP
		req      envoyclient.Request
		wantCode int
	}{
		{name: "a sheddable request with every pod saturated is dropped: 429", epp: e, req: envoyclient.Request{Body: completion("batch")}, wantCode: 429},
		{name: "no endpoints: 503", epp: empty, req: envoyclient.Request{Body: completion("assistant-x")}, wantCode: 503},
		{name: "a body that is not JSON: 400", epp: e, req: envoyclient.Request{Body: []byte("model=batch"), Headers: http.Header{"Content-Type": {"text/plain"}}}, wantCode: 400},
		{name: "a body without a model: 400", epp: e, req: envoyclient.Request{Body: []byte(`{"prompt":"hi"}`)}, wantCode: 400},
		{name: "a request without a body: 400", epp: e, req: envoyclient.Request{Method: http.MethodGet}, wantCode: 400},
		{name: "a body past the limit: 413", epp: e, req: envoyclient.Request{Body: completion(strings.Repeat("x", 2048)), ChunkSize: 256}, wantCode: 413},
		{name: "a subset hint naming no endpoint of the pool: 503", epp: e, req: envoyclient.Request{Body: completion("assistant-x"), Metadata: mciextproc.SubsetHintMetadata("192.0.2.1:8000")}, wantCode: 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := tt.epp.do(t, tt.req)
			require.NotNil(t, res.Immediate)
			assert.Equal(t, tt.wantCode, res.Immediate.StatusCode)
			assert.Equal(t, "application/json", res.Immediate.Headers.Get("content-type"))
			var body mciextproc.ErrorBody
			require.NoError(t, json.Unmarshal(res.Immediate.Body, &body))
			assert.Equal(t, tt.wantCode, body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
		})
	}

	t.Run("a critical request still goes through when every pod is saturated", func(t *testing.T) {
		res := e.do(t, envoyclient.Request{Body: completion("assistant-x")})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "B", nameOf(saturated, res.Destination))
	})
}

func TestSubsetHintAndFallbacks(t *testing.T) {
	eps := startModelServers(t, pod("A", 1, 0.1), pod("B", 1, 0.1), pod("C", 1, 0.1))
	e := startEPP(t, epp.Config{Picker: epp.PickerConfig{MaxFallbacks: 2}}, eps)

	t.Run("the subset hint restricts the destination and its fallbacks", func(t *testing.T) {
		for range 20 {
			res := e.do(t, envoyclient.Request{Body: completion("batch"), Metadata: mciextproc.SubsetHintMetadata(eps[1].Address, eps[2].Address)})
			require.Nil(t, res.Immediate)
			assert.Contains(t, []string{"B", "C"}, nameOf(eps, res.Destination))
			require.Len(t, res.Fallbacks, 1)
			assert.Contains(t, []string{"B", "C"}, nameOf(eps, res.Fallbacks[0]))
			assert.NotEqual(t, res.Destination, res.Fallbacks[0])
		}
	})
	t.Run("without a hint the destination lists the primary and two fallbacks, in the header and the metadata alike", func(t *testing.T) {
		res := e.do(t, envoyclient.Request{Body: completion("batch")})
		require.Nil(t, res.Immediate)
		require.Len(t, res.Fallbacks, 2)
		all := append([]string{res.Destination}, res.Fallbacks...)
		assert.ElementsMatch(t, []string{eps[0].Address, eps[1].Address, eps[2].Address}, all)
		assert.Equal(t, strings.Join(all, ","), res.Headers.Get(mciextproc.DestinationEndpointHeader))
		assert.Equal(t, strings.Join(all, ","), mciextproc.DestinationFromMetadata(res.DynamicMetadata))
	})
	t.Run("an unlisted model goes on unchanged", func(t *testing.T) {
		body := completion("somebody/else")
		res := e.do(t, envoyclient.Request{Body: body})
		require.Nil(t, res.Immediate)
		assert.Equal(t, string(body), string(res.Body))
	})
}

// noKeepAlive does not leave idle connections (and their goroutines) behind.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// metricValue reads one series of the EPP's /metrics.
func metricValue(t *testing.T, metricsAddr, series string) string {
	t.Helper()
	resp, err := noKeepAlive.Get("http://" + metricsAddr + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v
		}
	}
	return ""
}

// TestRoutedRequestsAreCountedByTheClusterThatRelayedThem sends requests
// from this cluster's gateway, from two importing clusters' sidecars
// (extproc.RelayedHeader) and from callers naming no valid cluster, and
// checks that each routed request is counted under its relaying cluster,
// the invalid names under one value that no cluster has, and that this
// cluster's count is published before any request.
func TestRoutedRequestsAreCountedByTheClusterThatRelayedThem(t *testing.T) {
	eps := startModelServers(t, pod("A", 1, 0.1))
	e := startEPP(t, epp.Config{}, eps)
	routed := func(from string) string {
		return metricValue(t, e.MetricsAddr(), `mci_epp_pool_routed_requests_total{name="pool",relayed_from="`+from+`"}`)
	}
	assert.Equal(t, "0", routed(""), "published before any request, so that a reader knows the EPP counts")
	for _, from := range []string{"", "cluster-b", "cluster-b", "cluster-d", "Not_A_Cluster", strings.Repeat("a", 300)} {
		headers := http.Header{}
		if from != "" {
			headers.Set(mciextproc.RelayedHeader, from)
		}
		e.do(t, envoyclient.Request{Body: completion("batch"), Headers: headers})
	}
	for from, n := range map[string]string{"": "1", "cluster-b": "2", "cluster-d": "1", metrics.RelayedElsewhere: "2"} {
		assert.Equal(t, n, routed(from), "routed for %q", from)
	}
	assert.Empty(t, routed("Not_A_Cluster"), "an invalid name is no label value")

	// Callers may name any cluster: beyond 128 counted apart, the rest
	// are counted together.
	for i := range 140 {
		e.do(t, envoyclient.Request{Body: completion("batch"), Headers: http.Header{mciextproc.RelayedHeader: {fmt.Sprintf("cluster-%d", i)}}})
	}
	assert.Equal(t, "1", routed("cluster-125"))
	assert.Empty(t, routed("cluster-127"), "the 129th relaying cluster is not counted apart")
	assert.Equal(t, "16", routed(metrics.RelayedElsewhere), "2 invalid names and 14 beyond the bound")
}

func TestClientCancelMidStream(t *testing.T) {
	eps := startModelServers(t, pod("A", 1, 0.1))
	e := startEPP(t, epp.Config{}, eps)
	// Warm up the connection so that its goroutines are in the baseline.
	e.do(t, envoyclient.Request{Body: completion("batch")})
	baseline := runtime.NumGoroutine()

	for range 5 {
		pr, pw := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := e.client.Do(ctx, envoyclient.Request{Path: "/v1/completions", BodyReader: pr, ChunkSize: 8})
			done <- err
		}()
		_, err := pw.Write([]byte(`{"model":"batch","prompt":"never fini`))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return metricValue(t, e.MetricsAddr(), "mci_epp_ext_proc_streams") == "1" },
			5*time.Second, 5*time.Millisecond, "the stream is open in the EPP")
		cancel()
		require.Error(t, <-done)
		_ = pw.CloseWithError(context.Canceled)
	}

	require.Eventually(t, func() bool { return metricValue(t, e.MetricsAddr(), "mci_epp_ext_proc_streams") == "0" },
		5*time.Second, 5*time.Millisecond, "every stream ended in the EPP")
	if !assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= baseline }, 5*time.Second, 10*time.Millisecond) {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines left behind: %d, baseline %d\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
	}
	// And the EPP still serves.
	res := e.do(t, envoyclient.Request{Body: completion("batch")})
	assert.Nil(t, res.Immediate)
}

func TestMetricsAndHealth(t *testing.T) {
	eps := startModelServers(t, pod("A", 2, 0.2), pod("B", 4, 0.6))
	e := startEPP(t, epp.Config{}, eps)
	e.do(t, envoyclient.Request{Body: completion("batch")})

	assert.Equal(t, "2", metricValue(t, e.MetricsAddr(), `inference_pool_ready_pods{name="pool"}`))
	assert.Equal(t, "3", metricValue(t, e.MetricsAddr(), `inference_pool_average_queue_size{name="pool"}`))
	assert.Equal(t, "0.4", metricValue(t, e.MetricsAddr(), `inference_pool_average_kv_cache_utilization{name="pool"}`))
	assert.Equal(t, "1", metricValue(t, e.MetricsAddr(), `mci_epp_requests_total{code="200",model_name="batch",target_model_name="base"}`))
	for _, svc := range []string{"", epp.LivenessService, epp.ReadinessService, "envoy.service.ext_proc.v3.ExternalProcessor"} {
		assert.Equal(t, healthpb.HealthCheckResponse_SERVING, healthStatus(t, e.HealthAddr(), svc), "service %q", svc)
	}
}

func TestPoolBatchGauges(t *testing.T) {
	running := func(m *modelServer, n int) *modelServer { m.running = &n; return m }
	tests := []struct {
		name       string
		servers    []*modelServer
		maxNumSeqs int
		// want are the gauges' values ("" for absent).
		wantRunning, wantCapacity, wantKnown string
	}{
		{
			name:        "servers exposing their running requests, with their batch places set",
			servers:     []*modelServer{running(pod("A", 0, 0.1), 2), running(pod("B", 1, 0.2), 3)},
			maxNumSeqs:  4,
			wantRunning: "2.5", wantCapacity: "4", wantKnown: "1",
		},
		{
			name:        "servers exposing their running requests, without batch places: no capacity",
			servers:     []*modelServer{running(pod("A", 0, 0.1), 2)},
			wantRunning: "2", wantCapacity: "", wantKnown: "0",
		},
		{
			name:        "servers exposing no running requests: neither, as before",
			servers:     []*modelServer{pod("A", 0, 0.1), pod("B", 1, 0.2)},
			maxNumSeqs:  4,
			wantRunning: "", wantCapacity: "", wantKnown: "0",
		},
		{
			name:        "the average is over the servers that expose it",
			servers:     []*modelServer{running(pod("A", 0, 0.1), 4), pod("B", 1, 0.2)},
			maxNumSeqs:  4,
			wantRunning: "4", wantCapacity: "4", wantKnown: "1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startEPP(t, epp.Config{MaxNumSeqs: tt.maxNumSeqs}, startModelServers(t, tt.servers...))
			e.do(t, envoyclient.Request{Body: completion("batch")})
			addr := e.MetricsAddr()
			assert.Equal(t, tt.wantRunning, metricValue(t, addr, `inference_pool_average_running_requests{name="pool"}`))
			assert.Equal(t, tt.wantCapacity, metricValue(t, addr, `mci_epp_pool_average_batch_capacity{name="pool"}`))
			assert.Equal(t, tt.wantKnown, metricValue(t, addr, `mci_epp_pool_batch_occupancy_known{name="pool"}`))
		})
	}
}

func TestSecureServing(t *testing.T) {
	eps := startModelServers(t, pod("A", 1, 0.1))
	e := startEPP(t, epp.Config{SecureServing: true}, eps)
	// The certificate is self-signed: a gateway encrypts without verifying.
	client, err := envoyclient.Dial(e.GRPCAddr(), envoyclient.Options{},
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))) //nolint:gosec // a self-signed test certificate
	require.NoError(t, err)
	defer func() { _ = client.Close() }()
	res, err := client.Do(context.Background(), envoyclient.Request{Body: completion("batch")})
	require.NoError(t, err)
	assert.Equal(t, eps[0].Address, res.Destination)

	_, err = e.client.Do(context.Background(), envoyclient.Request{Body: completion("batch")})
	assert.Error(t, err, "a plaintext client is refused")
}

func TestProxyForwardsToThePickedPod(t *testing.T) {
	eps := startModelServers(t, pod("A", 6, 0.85), pod("B", 4, 0.75), pod("C", 7, 0.60))
	e := startEPP(t, epp.Config{}, eps)
	gw := httptest.NewServer(envoyclient.NewProxy(e.client, nil))
	defer gw.Close()

	resp, err := http.Post(gw.URL+"/v1/chat/completions?x=1", "application/json", strings.NewReader(`{"model":"batch","messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	if !assert.Equal(t, http.StatusOK, resp.StatusCode) {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s", b)
	}
	var got map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	assert.Equal(t, map[string]string{"served_by": "B", "model": "base", "path": "/v1/chat/completions"}, got)

	resp, err = http.Post(gw.URL+"/v1/completions", "text/plain", strings.NewReader("not json"))
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// TestRequestsInFlightFollowTheResponsePhase holds requests in the
// response phase, as a gateway does while a model server streams its
// answer, and checks that the EPP counts them in flight until their
// response ends, whichever way it ends, and counts the served reports.
func TestRequestsInFlightFollowTheResponsePhase(t *testing.T) {
	eps := startModelServers(t, pod("A", 1, 0.1))
	e := startEPP(t, epp.Config{}, eps)
	inFlight := func() string { return metricValue(t, e.MetricsAddr(), "mci_epp_requests_in_flight") }
	served := func(result string) string {
		return metricValue(t, e.MetricsAddr(), `mci_epp_served_reports_total{result="`+result+`"}`)
	}

	// held starts a request whose response is held after its headers, in
	// the middle of its body, until the returned writer is closed.
	held := func(ctx context.Context, served string) (*io.PipeWriter, <-chan error) {
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			res, err := e.client.Do(ctx, envoyclient.Request{Path: "/v1/completions", Body: completion("batch"),
				Response: &envoyclient.Response{BodyReader: pr, Served: served}})
			if err == nil && (res.Response == nil || string(res.Response.Body) != "first second") {
				err = fmt.Errorf("the response did not come through unchanged: %+v", res.Response)
			}
			done <- err
		}()
		_, err := pw.Write([]byte("first "))
		require.NoError(t, err)
		return pw, done
	}

	const n = 3
	var writers []*io.PipeWriter
	var dones []<-chan error
	for range n {
		pw, done := held(context.Background(), eps[0].Address)
		writers, dones = append(writers, pw), append(dones, done)
	}
	require.Eventually(t, func() bool { return inFlight() == strconv.Itoa(n) }, 5*time.Second, 5*time.Millisecond,
		"the held requests are in flight: %s", inFlight())
	for i, pw := range writers {
		_, err := pw.Write([]byte("second"))
		require.NoError(t, err)
		require.NoError(t, pw.Close())
		require.NoError(t, <-dones[i])
	}
	require.Eventually(t, func() bool { return inFlight() == "0" }, 5*time.Second, 5*time.Millisecond, "a finished response is not in flight")
	assert.Equal(t, strconv.Itoa(n), served(epp.ServedPicked), "the gateway reported the picked endpoint")

	t.Run("a request whose gateway goes away is not in flight any more", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		pw, done := held(ctx, "10.9.9.9:8000")
		require.Eventually(t, func() bool { return inFlight() == "1" }, 5*time.Second, 5*time.Millisecond)
		cancel()
		require.Error(t, <-done)
		_ = pw.Close()
		require.Eventually(t, func() bool { return inFlight() == "0" }, 5*time.Second, 5*time.Millisecond)
		assert.Equal(t, "1", served(epp.ServedOther), "an endpoint that was not picked served")
	})

	t.Run("a request without a response phase is in flight until its stream ends", func(t *testing.T) {
		e.do(t, envoyclient.Request{Body: completion("batch")})
		require.Eventually(t, func() bool { return inFlight() == "0" }, 5*time.Second, 5*time.Millisecond)
	})
}
