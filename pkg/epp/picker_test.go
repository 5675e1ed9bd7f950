package epp

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/requestmodel/requestmodeltest"
	"github.com/mci-dev/mci/pkg/scheduling"
)

var now = time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)

// fakeMetrics maps metrics URLs to metrics.
type fakeMetrics map[string]*scheduling.Metrics

func (f fakeMetrics) Get(url string) *scheduling.Metrics { return f[url] }

// server is a model server of a test: its address and load.
type server struct {
	addr    string
	queue   int
	kv      float64
	active  []string
	maxLoRA int
}

func (s server) metrics() *scheduling.Metrics {
	return &scheduling.Metrics{
		WaitingQueue: s.queue, KVCacheUsage: s.kv,
		ActiveAdapters: sets.New(s.active...), WaitingAdapters: sets.New[string](),
		MaxLoRA: s.maxLoRA, UpdatedAt: now,
	}
}

func newTestPicker(t testing.TB, cfg PickerConfig, servers []server, models ...*v1alpha2.InferenceModel) *Picker {
	t.Helper()
	return newConfiguredPicker(t, cfg, servers, requestmodel.ModelConfig{Models: models})
}

func newConfiguredPicker(t testing.TB, cfg PickerConfig, servers []server, mc requestmodel.ModelConfig) *Picker {
	t.Helper()
	fm := fakeMetrics{}
	var eps []Endpoint
	for _, s := range servers {
		e := Endpoint{Name: s.addr, Address: s.addr}
		eps = append(eps, e)
		fm[e.MetricsURL()] = s.metrics()
	}
	pool := NewPool("pool", fm, nil)
	require.NoError(t, pool.SetEndpoints(eps))
	ms := requestmodel.NewModels()
	ms.Set(mc)
	if cfg.Scheduling == (scheduling.Config{}) {
		cfg.Scheduling = scheduling.DefaultConfig()
	}
	p, err := NewPicker(cfg, pool, ms, rand.NewPCG(1, 2))
	require.NoError(t, err)
	return p
}

func req(model string) []byte { return []byte(`{"model":"` + model + `","prompt":"hi"}`) }

// Three idle servers and the models the picker tests use.
var (
	idle = []server{
		{addr: "10.0.0.1:8000", queue: 1, kv: 0.1},
		{addr: "10.0.0.2:8000", queue: 1, kv: 0.1},
		{addr: "10.0.0.3:8000", queue: 1, kv: 0.1},
	}
	critical  = requestmodeltest.InferenceModel("critical", "chat", ptr.To(v1alpha2.Critical), requestmodeltest.Target("lora-x", nil))
	sheddable = requestmodeltest.InferenceModel("sheddable", "batch", ptr.To(v1alpha2.Sheddable))
	// The objectives and rewrites of the picker tests: a sheddable
	// objective in each group, a critical one, and a canary rewrite.
	testConfig = requestmodel.ModelConfig{
		Models: []*v1alpha2.InferenceModel{critical, sheddable},
		Objectives: []*v1alpha2.InferenceObjective{
			requestmodeltest.Objective("background", ptr.To[int32](-1)),
			requestmodel.ObjectiveFromLLMD(requestmodeltest.LLMDObjective("llmd-background", -5)),
			requestmodeltest.Objective("interactive", ptr.To[int32](10)),
		},
		Rewrites: []*v1alpha2.InferenceModelRewrite{
			requestmodeltest.Rewrite("canary", requestmodeltest.Rule([]string{"food-review"}, requestmodeltest.RewriteTarget("food-review-v2", nil))),
		},
	}
)

func TestPick(t *testing.T) {
	tests := []struct {
		name     string
		cfg      PickerConfig
		servers  []server
		body     []byte
		headers  requestmodel.RequestHeaders
		subset   []string
		noSubset bool
		// want lists the endpoints the primary may be; wantCode the error.
		want         []string
		wantCode     int
		wantModel    string
		wantCrit     scheduling.Criticality
		wantRewrite  bool
		wantEndpoint int // number of endpoints in the destination, 1 if 0
	}{
		{
			name: "a listed model is rewritten to its target and takes its criticality",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 10, kv: 0.3, active: []string{"lora-x"}, maxLoRA: 2},
				{addr: "10.0.0.2:8000", queue: 5, kv: 0.7, maxLoRA: 2},
			},
			body: req("chat"), noSubset: true,
			want: []string{"10.0.0.1:8000"}, wantModel: "lora-x", wantCrit: scheduling.Critical, wantRewrite: true,
		},
		{
			name:    "an unlisted model goes as it is, with Standard criticality",
			servers: idle, body: req("somebody-else"), noSubset: true,
			want: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, wantModel: "somebody-else", wantCrit: scheduling.Standard,
		},
		{
			name: "a base model has no adapter preference: the least loaded server wins over one with a free adapter slot",
			cfg:  PickerConfig{BaseModels: []string{"base"}},
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 1, kv: 0.1},
				{addr: "10.0.0.2:8000", queue: 40, kv: 0.9, maxLoRA: 4},
			},
			body: req("base"), noSubset: true,
			want: []string{"10.0.0.1:8000"}, wantModel: "base",
		},
		{
			name: "a non-base target model is an adapter: a server with a free slot wins",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 1, kv: 0.1},
				{addr: "10.0.0.2:8000", queue: 40, kv: 0.9, maxLoRA: 4},
			},
			body: req("base"), noSubset: true,
			want: []string{"10.0.0.2:8000"}, wantModel: "base",
		},
		{
			name:    "the subset hint restricts the candidates to the listed endpoints",
			servers: idle, body: req("m"), subset: []string{"10.0.0.2:8000", "192.0.2.1:8000"},
			want: []string{"10.0.0.2:8000"}, wantModel: "m",
		},
		{
			name: "a subset entry without a port matches every port of the IP",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 1, kv: 0.1}, {addr: "10.0.0.1:8001", queue: 1, kv: 0.1}, {addr: "10.0.0.2:8000", queue: 1, kv: 0.1},
			},
			body: req("m"), subset: []string{"10.0.0.1"},
			want: []string{"10.0.0.1:8000", "10.0.0.1:8001"}, wantModel: "m",
		},
		{
			name:    "an empty subset hint allows nothing: 503",
			servers: idle, body: req("m"), subset: []string{},
			wantCode: http.StatusServiceUnavailable,
		},
		{
			name:    "a subset hint naming no endpoint of the pool: 503",
			servers: idle, body: req("m"), subset: []string{"192.0.2.1:8000"},
			wantCode: http.StatusServiceUnavailable,
		},
		{
			name: "no endpoints: 503", body: req("m"), noSubset: true,
			wantCode: http.StatusServiceUnavailable,
		},
		{
			name: "a sheddable request with every server saturated: 429",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 6, kv: 0.5}, {addr: "10.0.0.2:8000", queue: 1, kv: 0.85},
			},
			body: req("batch"), noSubset: true,
			wantCode: http.StatusTooManyRequests,
		},
		{
			name: "a request naming an objective of negative priority is sheddable: 429 with every server saturated",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 6, kv: 0.5}, {addr: "10.0.0.2:8000", queue: 1, kv: 0.85},
			},
			body: req("m"), headers: requestmodel.RequestHeaders{Objective: "background"}, noSubset: true,
			wantCode: http.StatusTooManyRequests,
		},
		{
			name: "an llm-d.ai objective of negative priority is sheddable too",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 6, kv: 0.5}, {addr: "10.0.0.2:8000", queue: 1, kv: 0.85},
			},
			body: req("m"), headers: requestmodel.RequestHeaders{Objective: "llmd-background"}, noSubset: true,
			wantCode: http.StatusTooManyRequests,
		},
		{
			name: "the objective's priority wins over the InferenceModel's criticality: a sheddable model named with a priority above 0 is critical and served",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 6, kv: 0.5}, {addr: "10.0.0.2:8000", queue: 1, kv: 0.85},
			},
			body: req("batch"), headers: requestmodel.RequestHeaders{Objective: "interactive"}, noSubset: true,
			want: []string{"10.0.0.2:8000"}, wantModel: "batch", wantCrit: scheduling.Critical,
		},
		{
			name: "an unknown objective is served as if the request named none: the InferenceModel's criticality",
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 6, kv: 0.5}, {addr: "10.0.0.2:8000", queue: 1, kv: 0.85},
			},
			body: req("batch"), headers: requestmodel.RequestHeaders{Objective: "no-such-objective"}, noSubset: true,
			wantCode: http.StatusTooManyRequests,
		},
		{
			name:    "an exact InferenceModelRewrite rule rewrites the body's model",
			servers: idle, body: req("food-review"), noSubset: true,
			want: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, wantModel: "food-review-v2", wantRewrite: true,
		},
		{
			name:    "the model name rewrite header rewrites a model no rule matches",
			servers: idle, body: req("m"), headers: requestmodel.RequestHeaders{ModelNameRewrite: "m-v3"}, noSubset: true,
			want: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, wantModel: "m-v3", wantRewrite: true,
		},
		{
			name:    "a matching rule wins over the model name rewrite header",
			servers: idle, body: req("food-review"), headers: requestmodel.RequestHeaders{ModelNameRewrite: "m-v3"}, noSubset: true,
			want: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, wantModel: "food-review-v2", wantRewrite: true,
		},
		{
			name:    "a body that is not JSON: 400",
			servers: idle, body: []byte("hello"), noSubset: true,
			wantCode: http.StatusBadRequest,
		},
		{
			name:    "a body without a model: 400",
			servers: idle, body: []byte(`{"prompt":"hi"}`), noSubset: true,
			wantCode: http.StatusBadRequest,
		},
		{
			name:    "no body: 400",
			servers: idle, body: nil, noSubset: true,
			wantCode: http.StatusBadRequest,
		},
		{
			name:    "fallbacks follow the primary, each a different endpoint",
			cfg:     PickerConfig{MaxFallbacks: 2},
			servers: idle, body: req("m"), noSubset: true,
			want: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, wantModel: "m", wantEndpoint: 3,
		},
		{
			name:    "fallbacks are bounded by the candidates",
			cfg:     PickerConfig{MaxFallbacks: 5},
			servers: idle[:2], body: req("m"), noSubset: true,
			want: []string{"10.0.0.1:8000", "10.0.0.2:8000"}, wantModel: "m", wantEndpoint: 2,
		},
		{
			name: "fallbacks of a sheddable request only have capacity too",
			cfg:  PickerConfig{MaxFallbacks: 2},
			servers: []server{
				{addr: "10.0.0.1:8000", queue: 1, kv: 0.1}, {addr: "10.0.0.2:8000", queue: 2, kv: 0.2}, {addr: "10.0.0.3:8000", queue: 9, kv: 0.9},
			},
			body: req("batch"), noSubset: true,
			want: []string{"10.0.0.1:8000"}, wantModel: "batch", wantCrit: scheduling.Sheddable, wantEndpoint: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newConfiguredPicker(t, tt.cfg, tt.servers, testConfig)
			seen := sets.New[string]()
			for range 200 {
				d, err := p.Pick(tt.body, tt.headers, tt.subset, !tt.noSubset, now)
				if tt.wantCode != 0 {
					require.Error(t, err)
					assert.Equal(t, tt.wantCode, StatusCode(err), err.Error())
					return
				}
				require.NoError(t, err)
				assert.Equal(t, tt.wantModel, d.TargetModel)
				assert.Equal(t, tt.wantCrit, d.Criticality)
				if tt.wantRewrite {
					b, err := requestmodel.ParseBody(d.Body)
					require.NoError(t, err)
					assert.Equal(t, tt.wantModel, b.Model())
				} else {
					assert.Nil(t, d.Body)
				}
				assert.Len(t, d.Endpoints, max(tt.wantEndpoint, 1))
				assert.Len(t, sets.New(d.Endpoints...), len(d.Endpoints), "fallbacks repeat an endpoint: %v", d.Endpoints)
				seen.Insert(d.Endpoints[0])
			}
			assert.ElementsMatch(t, tt.want, sets.List(seen), "primaries picked")
		})
	}
}

func TestStatusCode(t *testing.T) {
	assert.Equal(t, 429, StatusCode(fmt.Errorf("wrapped: %w", &Error{Code: 429, Err: scheduling.ErrDropped})))
	assert.Equal(t, 500, StatusCode(fmt.Errorf("anything else")))
}

func TestNewPickerRefusesABadConfig(t *testing.T) {
	_, err := NewPicker(PickerConfig{Scheduling: scheduling.Config{SheddableKVCacheThreshold: 2}}, NewPool("p", nil, nil), requestmodel.NewModels(), nil)
	assert.Error(t, err)
	_, err = NewPicker(PickerConfig{Scheduling: scheduling.DefaultConfig(), MaxFallbacks: -1}, NewPool("p", nil, nil), requestmodel.NewModels(), nil)
	assert.Error(t, err)
}

// benchBody returns a chat completions body of about size bytes.
func benchBody(size int) []byte {
	const head = `{"model":"chat","messages":[{"role":"user","content":"`
	const tail = `"}],"max_tokens":128,"stream":false}`
	return []byte(head + strings.Repeat("a", max(size-len(head)-len(tail), 0)) + tail)
}

// BenchmarkPick is one decision, parsing and rewriting a 4 KiB body, over
// 8 servers: what the EPP adds to a request besides the ext_proc exchange.
// The parallel variant measures the cost of the mutex around the scheduler
// under contention.
func BenchmarkPick(b *testing.B) {
	var servers []server
	for i := range 8 {
		servers = append(servers, server{addr: fmt.Sprintf("10.0.0.%d:8000", i+1), queue: i % 3, kv: float64(i) / 10, maxLoRA: 4, active: []string{"lora-x"}[:i%2]})
	}
	body := benchBody(4 << 10)
	b.Run("serial", func(b *testing.B) {
		p := newTestPicker(b, PickerConfig{}, servers, critical)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Pick(body, requestmodel.RequestHeaders{}, nil, false, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		p := newTestPicker(b, PickerConfig{}, servers, critical)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.Pick(body, requestmodel.RequestHeaders{}, nil, false, now); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("schedule-only", func(b *testing.B) {
		p := newTestPicker(b, PickerConfig{}, servers, critical)
		snap := p.pool.snap.Load()
		ids := make([]int, len(servers))
		cands := make([]*scheduling.Metrics, len(servers))
		for b.Loop() {
			for i := range servers {
				ids[i], cands[i] = i, p.pool.metricsOf(snap, i)
			}
			if _, err := p.schedule(&Decision{Model: "chat", TargetModel: "lora-x", Criticality: scheduling.Critical}, ids, cands, nil, false, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestPickerSendsARequestOnlyToServersOfItsModel: the filter "serves the
// requested model" comes before seed 001's chain, on the target model
// (after rewrites), from the servers' /metadata.
func TestPickerSendsARequestOnlyToServersOfItsModel(t *testing.T) {
	eps := []Endpoint{
		{Name: "llama-1", Address: "10.0.0.1:8000", Models: []string{"llama", "lora-x"}, BaseModel: "llama"},
		{Name: "llama-2", Address: "10.0.0.2:8000", Models: []string{"llama"}, BaseModel: "llama"},
		{Name: "qwen", Address: "10.0.0.3:8000", Models: []string{"qwen"}, BaseModel: "qwen"},
	}
	tests := []struct {
		name      string
		endpoints []Endpoint
		model     string
		subset    []string
		want      []string // the possible picks
		code      int
	}{
		{name: "a base model goes to its servers only", endpoints: eps, model: "llama", want: []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{name: "an adapter goes to the servers that list it", endpoints: eps, model: "lora-x", want: []string{"10.0.0.1:8000"}},
		{name: "another base model to its own server", endpoints: eps, model: "qwen", want: []string{"10.0.0.3:8000"}},
		{name: "a model no server serves is 404", endpoints: eps, model: "mistral", code: http.StatusNotFound},
		{name: "a server without metadata takes any model", endpoints: append([]Endpoint{{Name: "any", Address: "10.0.0.9:8000"}}, eps...), model: "mistral", want: []string{"10.0.0.9:8000"}},
		{name: "no endpoint at all is 503, not 404", model: "mistral", code: http.StatusServiceUnavailable},
		{name: "servers of the model outside the subset hint is 503", endpoints: eps, model: "qwen", subset: []string{"10.0.0.1:8000"}, code: http.StatusServiceUnavailable},
		{name: "the subset hint applies among the model's servers", endpoints: eps, model: "llama", subset: []string{"10.0.0.2"}, want: []string{"10.0.0.2:8000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := NewPool("pool", fakeMetrics{}, nil)
			require.NoError(t, pool.SetEndpoints(tt.endpoints))
			p, err := NewPicker(PickerConfig{Scheduling: scheduling.DefaultConfig()}, pool, requestmodel.NewModels(), rand.NewPCG(1, 2))
			require.NoError(t, err)
			for range 20 {
				d, err := p.Pick(req(tt.model), requestmodel.RequestHeaders{}, tt.subset, tt.subset != nil, now)
				if tt.code != 0 {
					require.Error(t, err)
					assert.Equal(t, tt.code, StatusCode(err), "%v", err)
					if tt.code == http.StatusNotFound {
						assert.ErrorIs(t, err, ErrModelNotServed)
					}
					return
				}
				require.NoError(t, err)
				assert.Contains(t, tt.want, d.Endpoints[0])
			}
		})
	}
}

// TestPickerPlacesByPrefix: the approximate prefix index sends the turns of
// a conversation (prompts that extend one another) to the server that
// served the earlier ones, while idle servers share the conversations.
func TestPickerPlacesByPrefix(t *testing.T) {
	system := strings.Repeat("You are a careful assistant for the billing team. ", 40)
	turn := func(conversation, n int) []byte {
		msgs := fmt.Sprintf(`{"role":"system","content":%q}`, strconv.Itoa(conversation)+system)
		for i := range n {
			msgs += fmt.Sprintf(`,{"role":"user","content":"question %d of conversation %d, with enough words to fill a block or two of text"}`, i, conversation)
		}
		return []byte(`{"model":"base","messages":[` + msgs + `]}`)
	}
	p := newTestPicker(t, PickerConfig{BaseModels: []string{"base"}}, idle)
	homes := map[int]string{}
	for conversation := range 12 {
		d, err := p.Pick(turn(conversation, 1), requestmodel.RequestHeaders{}, nil, false, now)
		require.NoError(t, err)
		homes[conversation] = d.Endpoints[0]
		assert.Zero(t, d.PrefixMatched, "a new conversation matches nothing")
		assert.Positive(t, d.PromptBlocks)
	}
	used := map[string]bool{}
	for _, h := range homes {
		used[h] = true
	}
	assert.Len(t, used, len(idle), "new conversations spread over the idle servers: %v", homes)

	for n := 2; n <= 4; n++ {
		for conversation := range 12 {
			d, err := p.Pick(turn(conversation, n), requestmodel.RequestHeaders{}, nil, false, now)
			require.NoError(t, err)
			assert.Equal(t, homes[conversation], d.Endpoints[0], "turn %d of conversation %d goes where its prefix is", n, conversation)
			assert.Greater(t, d.PrefixMatched, len(system)/128, "most of the prompt was matched")
		}
	}

	t.Run("a server beyond the queue margin loses the affinity", func(t *testing.T) {
		busy := slices.Clone(idle)
		p := newTestPicker(t, PickerConfig{BaseModels: []string{"base"}}, busy)
		d, err := p.Pick(turn(99, 1), requestmodel.RequestHeaders{}, nil, false, now)
		require.NoError(t, err)
		home := d.Endpoints[0]
		for i := range busy {
			if busy[i].addr == home {
				busy[i].queue = 1 + scheduling.DefaultPrefixQueueMargin + 1
			}
		}
		// The same index, the new loads.
		loaded := newTestPicker(t, PickerConfig{BaseModels: []string{"base"}}, busy)
		loaded.prefixes = p.prefixes
		d, err = loaded.Pick(turn(99, 2), requestmodel.RequestHeaders{}, nil, false, now)
		require.NoError(t, err)
		assert.NotEqual(t, home, d.Endpoints[0])
	})
}
