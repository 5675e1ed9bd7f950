package simulator

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/mci-dev/mci/pkg/discovery"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/test/promtext"
)

const base = "meta-llama/Llama-3.1-8B-Instruct"

func start(t *testing.T, opts Options) (*Server, *httptest.Server) {
	t.Helper()
	if opts.Model == "" {
		opts.Model = base
	}
	if opts.InstanceID == "" {
		opts.InstanceID = "sim-a"
	}
	s, err := New(opts)
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

func post(t *testing.T, ctx context.Context, url, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// scrape reads /metrics with the project's parser.
func scrape(t *testing.T, url string) *scheduling.Metrics {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	m, err := metrics.Parse(resp.Body)
	require.NoError(t, err)
	return m
}

func TestCompletions(t *testing.T) {
	_, srv := start(t, Options{LoRAAdapters: []string{"lora-x"}, MaxLoRA: 1, Latency: time.Millisecond})

	tests := []struct {
		name     string
		path     string
		body     string
		header   []string
		wantCode int
		check    func(t *testing.T, body map[string]any)
	}{
		{
			name: "a completion of the base model answers and names the instance",
			path: "/v1/completions", body: `{"model":"` + base + `","prompt":"Say hi","max_tokens":5}`,
			wantCode: http.StatusOK,
			check: func(t *testing.T, body map[string]any) {
				assert.Equal(t, "text_completion", body["object"])
				assert.Equal(t, base, body["model"])
				assert.Equal(t, "sim-a", body["instance"])
				choice := body["choices"].([]any)[0].(map[string]any)
				assert.Contains(t, choice["text"], "sim-a")
				assert.Equal(t, "stop", choice["finish_reason"])
				assert.EqualValues(t, 2, body["usage"].(map[string]any)["prompt_tokens"])
			},
		},
		{
			name: "a chat completion answers as the assistant",
			path: "/v1/chat/completions", body: `{"model":"` + base + `","messages":[{"role":"user","content":"Say hi"}]}`,
			wantCode: http.StatusOK,
			check: func(t *testing.T, body map[string]any) {
				assert.Equal(t, "chat.completion", body["object"])
				msg := body["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
				assert.Equal(t, "assistant", msg["role"])
				assert.Contains(t, msg["content"], "sim-a")
			},
		},
		{
			name: "a LoRA adapter the server can load is a model",
			path: "/v1/chat/completions", body: `{"model":"lora-x","messages":[]}`,
			wantCode: http.StatusOK,
			check:    func(t *testing.T, body map[string]any) { assert.Equal(t, "lora-x", body["model"]) },
		},
		{
			name: "an unknown model is 404",
			path: "/v1/completions", body: `{"model":"lora-z","prompt":"x"}`,
			wantCode: http.StatusNotFound,
			check: func(t *testing.T, body map[string]any) {
				assert.Contains(t, body["error"].(map[string]any)["message"], "lora-z")
			},
		},
		{name: "a body that is not JSON is 400", path: "/v1/completions", body: `{"model":`, wantCode: http.StatusBadRequest},
		{name: "a request without a model is 400", path: "/v1/chat/completions", body: `{"messages":[]}`, wantCode: http.StatusBadRequest},
		{name: "messages that are not a list are 400", path: "/v1/chat/completions", body: `{"model":"` + base + `","messages":"hi"}`, wantCode: http.StatusBadRequest},
		{
			name: "a latency header that is not a duration is 400",
			path: "/v1/completions", body: `{"model":"` + base + `"}`, header: []string{LatencyHeader, "soon"},
			wantCode: http.StatusBadRequest,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := post(t, t.Context(), srv.URL+tt.path, tt.body, tt.header...)
			assert.Equal(t, tt.wantCode, resp.StatusCode, "%s", b)
			assert.Equal(t, "sim-a", resp.Header.Get(InstanceHeader))
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var body map[string]any
			require.NoError(t, json.Unmarshal(b, &body), "%s", b)
			if tt.wantCode != http.StatusOK {
				assert.NotEmpty(t, body["error"].(map[string]any)["message"])
			}
			if tt.check != nil {
				tt.check(t, body)
			}
		})
	}

	t.Run("GET on a completion path is 405", func(t *testing.T) {
		resp, err := http.Get(srv.URL + "/v1/completions")
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	})

	t.Run("a streamed chat completion is server-sent events ending in DONE", func(t *testing.T) {
		resp, b := post(t, t.Context(), srv.URL+"/v1/chat/completions", `{"model":"`+base+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
		require.Len(t, events, 3)
		assert.Equal(t, "data: [DONE]", events[2])
		var chunk map[string]any
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(events[0], "data: ")), &chunk))
		assert.Equal(t, "chat.completion.chunk", chunk["object"])
		assert.Contains(t, chunk["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)["content"], "sim-a")
	})

	t.Run("models lists the base model and the adapters", func(t *testing.T) {
		resp, err := http.Get(srv.URL + "/v1/models")
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		var list struct{ Data []struct{ ID, Parent string } }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
		require.Len(t, list.Data, 2)
		assert.Equal(t, base, list.Data[0].ID)
		assert.Equal(t, "lora-x", list.Data[1].ID)
		assert.Equal(t, base, list.Data[1].Parent)
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	neg := -1
	over := 1.5
	tests := []struct {
		name string
		opts Options
	}{
		{name: "no model", opts: Options{}},
		{name: "negative concurrency", opts: Options{Model: base, Concurrency: -1}},
		{name: "negative max LoRA", opts: Options{Model: base, MaxLoRA: -1}},
		{name: "an adapter named as the base model", opts: Options{Model: base, LoRAAdapters: []string{base}}},
		{name: "a negative pinned queue", opts: Options{Model: base, Pins: Pins{Waiting: &neg}}},
		{name: "a pinned KV cache usage above 1", opts: Options{Model: base, Pins: Pins{KVCacheUsage: &over}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.InstanceID = "x"
			_, err := New(tt.opts)
			assert.Error(t, err)
		})
	}
}

// hold starts requests for model that stay in the batch until the returned
// function ends them (the clients go away).
func hold(t *testing.T, url, model string, n int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"`+model+`","prompt":"x"}`))
			req.Header.Set(LatencyHeader, "1m")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_ = resp.Body.Close()
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func TestMetricsFollowLoad(t *testing.T) {
	s, srv := start(t, Options{Concurrency: 2})

	idle := scrape(t, srv.URL)
	assert.Equal(t, 0, idle.WaitingQueue)
	assert.Zero(t, idle.KVCacheUsage)
	assert.NotContains(t, metricsOf(t, srv.URL), "vllm:lora_requests_info", "a server without adapters has no lora_requests_info")

	stop := hold(t, srv.URL, base, 5)
	require.Eventually(t, func() bool { m := s.Metrics(); return m.Running == 2 && m.Waiting == 3 }, 5*time.Second, 10*time.Millisecond)
	busy := scrape(t, srv.URL)
	assert.Equal(t, 3, busy.WaitingQueue, "requests beyond the concurrency wait")
	assert.Equal(t, 1.0, busy.KVCacheUsage, "a full batch is a full KV cache")
	assert.Equal(t, 2.0, metricsOf(t, srv.URL).Value(t, `vllm:num_requests_running{model_name="`+base+`"}`))

	stop()
	require.Eventually(t, func() bool { m := s.Metrics(); return m.Running == 0 && m.Waiting == 0 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 0, scrape(t, srv.URL).WaitingQueue)

	// Half a batch is half the cache.
	stop = hold(t, srv.URL, base, 1)
	defer stop()
	require.Eventually(t, func() bool { return s.Metrics().Running == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 0.5, scrape(t, srv.URL).KVCacheUsage)
}

// metricsOf reads the simulator's /metrics as a Prometheus client would.
func metricsOf(t *testing.T, url string) promtext.Metrics {
	t.Helper()
	m, err := promtext.Get(t.Context(), url+"/metrics")
	require.NoError(t, err)
	return m
}

// TestPinsReproduceSeed001 pins the pods of seed 001's three worked
// examples and reads them back with pkg/metrics.
func TestPinsReproduceSeed001(t *testing.T) {
	type pod struct {
		waiting  int
		kv       float64
		adapters []string
	}
	tests := []struct {
		name string
		pod  pod
	}{
		{name: "example 1 pod A: queue 10, KV 30%, LoRA-X", pod: pod{10, 0.3, []string{"lora-x"}}},
		{name: "example 1 pod B: queue 5, KV 70%, no adapter", pod: pod{5, 0.7, []string{}}},
		{name: "example 1 pod C: queue 60, KV 20%, LoRA-X", pod: pod{60, 0.2, []string{"lora-x"}}},
		{name: "example 2 pod A: queue 6, KV 85%", pod: pod{6, 0.85, nil}},
		{name: "example 2 pod B: queue 4, KV 75%", pod: pod{4, 0.75, nil}},
		{name: "example 2 pod C: queue 7, KV 60%", pod: pod{7, 0.6, nil}},
		{name: "example 3 pod A: queue 70, KV 40%, LoRA-Y", pod: pod{70, 0.4, []string{"lora-y"}}},
		{name: "example 3 pod B: queue 80, KV 60%, LoRA-Y", pod: pod{80, 0.6, []string{"lora-y"}}},
		{name: "example 3 pod C: queue 65, KV 70%, no LoRA-Y", pod: pod{65, 0.7, []string{}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv := start(t, Options{
				LoRAAdapters: []string{"lora-x", "lora-y"}, MaxLoRA: 2,
				Pins: Pins{Waiting: &tt.pod.waiting, KVCacheUsage: &tt.pod.kv, RunningAdapters: tt.pod.adapters},
			})
			m := scrape(t, srv.URL)
			assert.Equal(t, tt.pod.waiting, m.WaitingQueue)
			assert.Equal(t, tt.pod.kv, m.KVCacheUsage)
			assert.Equal(t, sets.New(tt.pod.adapters...), m.ActiveAdapters)
			assert.Equal(t, sets.New[string](), m.WaitingAdapters)
			assert.Equal(t, 2, m.MaxLoRA)
		})
	}
}

func TestPinsOverrideLoadAndCanChange(t *testing.T) {
	s, srv := start(t, Options{Concurrency: 1})
	stop := hold(t, srv.URL, base, 3)
	defer stop()
	require.Eventually(t, func() bool { return s.Metrics().Waiting == 2 }, 5*time.Second, 10*time.Millisecond)

	resp, b := post(t, t.Context(), srv.URL+"/admin/pins", `{"waiting":0,"kvCacheUsage":0.1,"runningAdapters":["lora-q"],"waitingAdapters":[]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	m := scrape(t, srv.URL)
	assert.Equal(t, 0, m.WaitingQueue, "the pin hides the real queue")
	assert.Equal(t, 0.1, m.KVCacheUsage)
	assert.Equal(t, sets.New("lora-q"), m.ActiveAdapters, "pinned adapters are reported even without LoRA")
	assert.Equal(t, 1, scrapeRunning(t, srv.URL), "what is not pinned follows the load")

	resp, b = post(t, t.Context(), srv.URL+"/admin/pins", `{"kvCacheUsage":2}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	resp, b = post(t, t.Context(), srv.URL+"/admin/pins", `{"queue":3}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "unknown fields are refused: %s", b)

	resp, _ = post(t, t.Context(), srv.URL+"/admin/pins", `{}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2, scrape(t, srv.URL).WaitingQueue, "unpinned, the real queue shows again")
	assert.Equal(t, Pins{}, s.Pins())
}

func scrapeRunning(t *testing.T, url string) int {
	t.Helper()
	samples := metricsOf(t, url).Samples("vllm:num_requests_running")
	require.NotEmpty(t, samples, "no vllm:num_requests_running")
	return int(samples[0].Value)
}

func TestLoRAAdaptersLoadUpToMaxLoRA(t *testing.T) {
	s, srv := start(t, Options{LoRAAdapters: []string{"lora-a", "lora-b", "lora-c"}, MaxLoRA: 2, Concurrency: 10})

	stopA := hold(t, srv.URL, "lora-a", 1)
	stopB := hold(t, srv.URL, "lora-b", 1)
	defer stopB()
	require.Eventually(t, func() bool { return s.Metrics().Running == 2 }, 5*time.Second, 10*time.Millisecond)
	m := scrape(t, srv.URL)
	assert.Equal(t, sets.New("lora-a", "lora-b"), m.ActiveAdapters)
	assert.Equal(t, 0, m.WaitingQueue)

	// Both slots are held by running requests: lora-c waits ...
	doneC := make(chan int, 1)
	go func() {
		resp, _ := post(t, context.Background(), srv.URL+"/v1/completions", `{"model":"lora-c","prompt":"x"}`, LatencyHeader, "0s")
		doneC <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return s.Metrics().Waiting == 1 }, 5*time.Second, 10*time.Millisecond)
	m = scrape(t, srv.URL)
	assert.Equal(t, sets.New("lora-c"), m.WaitingAdapters)
	assert.Equal(t, 1, m.WaitingQueue)
	assert.Equal(t, 2, m.MaxLoRA)

	// ... while the base model and a loaded adapter do not.
	resp, _ := post(t, t.Context(), srv.URL+"/v1/completions", `{"model":"`+base+`"}`, LatencyHeader, "0s")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = post(t, t.Context(), srv.URL+"/v1/completions", `{"model":"lora-b"}`, LatencyHeader, "0s")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	select {
	case <-doneC:
		t.Fatal("lora-c ran with no free adapter slot")
	default:
	}

	// lora-a's request ends: its slot goes to lora-c.
	stopA()
	select {
	case code := <-doneC:
		assert.Equal(t, http.StatusOK, code)
	case <-time.After(5 * time.Second):
		t.Fatal("lora-c did not run once a slot was free")
	}
	m = scrape(t, srv.URL)
	assert.Equal(t, sets.New("lora-b", "lora-c"), m.ActiveAdapters, "lora-a was evicted; lora-c stays resident")
	assert.Equal(t, sets.New[string](), m.WaitingAdapters)
	assert.Equal(t, 0, m.WaitingQueue)
}

func TestEngineEvictsLeastRecentlyUsedIdleAdapter(t *testing.T) {
	e := newEngine(10, 2)
	run := func(adapter string) {
		release, err := e.acquire(t.Context(), adapter)
		require.NoError(t, err)
		release()
	}
	run("a")
	run("b")
	run("a") // b is now the least recently used
	run("c")
	assert.Equal(t, []string{"a", "c"}, e.load().RunningAdapters)
}

func TestEngineWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	e := newEngine(1, 0)
	release, err := e.acquire(t.Context(), "")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err = e.acquire(ctx, "")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, 0, e.load().Waiting)
	release()
	assert.Equal(t, load{RunningAdapters: []string{}, WaitingAdapters: []string{}}, e.load())
}

func TestReadinessAndMetadata(t *testing.T) {
	s, srv := start(t, Options{NotReady: true, LoRAAdapters: []string{"lora-x"}})
	readyCode := func() int {
		resp, err := http.Get(srv.URL + discovery.ReadyPath)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusServiceUnavailable, readyCode())
	s.SetReady(true)
	assert.Equal(t, http.StatusOK, readyCode())

	resp, _ := post(t, t.Context(), srv.URL+"/admin/ready?ready=false", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, http.StatusServiceUnavailable, readyCode())
	assert.False(t, s.Ready())
	resp, _ = post(t, t.Context(), srv.URL+"/admin/ready?ready=maybe", "")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	md, err := discovery.Metadata(t.Context(), nil, srv.URL)
	require.NoError(t, err)
	assert.Equal(t, "sim-a", md["instance_id"])
	model := md["Model"].(map[string]any)
	assert.Equal(t, base, model["name"])
	assert.Equal(t, []any{"lora-x"}, model["lora_adapters"])
	assert.EqualValues(t, DefaultMaxLoRA, model["max_lora"])
	served, err := discovery.ParseServedModels(md)
	require.NoError(t, err)
	assert.Equal(t, &discovery.ServedModels{Base: base, Adapters: []string{"lora-x"}}, served, "what mci-epp reads of it")
}

func TestInstanceIDFromPodName(t *testing.T) {
	t.Setenv(discovery.PodNameEnv, "vllm-0")
	s, err := New(Options{Model: base})
	require.NoError(t, err)
	assert.Equal(t, "vllm-0", s.InstanceID())
}

func TestServeShutsDownGracefully(t *testing.T) {
	s, err := New(Options{Model: base, InstanceID: "sim-a"})
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, l) }()
	url := "http://" + l.Addr().String()

	md, err := discovery.Metadata(t.Context(), nil, url)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"http": url}, md["Transport"])

	inFlight := make(chan int, 1)
	go func() {
		resp, _ := post(t, context.Background(), url+"/v1/completions", `{"model":"`+base+`"}`, LatencyHeader, "500ms")
		inFlight <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return s.Metrics().Running == 1 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.Eventually(t, func() bool { return !s.Ready() }, time.Second, 5*time.Millisecond, "shutting down, the instance is not ready")
	assert.Equal(t, http.StatusOK, <-inFlight, "the request in flight finishes")
	select {
	case err := <-served:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
}

func TestNoMetadataServesNone(t *testing.T) {
	s, err := New(Options{Model: base, InstanceID: "plain", NoMetadata: true})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	_, err = discovery.Metadata(t.Context(), srv.Client(), srv.URL)
	assert.ErrorIs(t, err, discovery.ErrNoMetadata)
}
