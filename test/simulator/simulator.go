// Package simulator is a stand-in for a vLLM model server, for tests and
// `make run`: an OpenAI-compatible completions API whose answers say which
// instance served them, vLLM's load metrics (queue, KV cache, LoRA
// adapters) following its real load or pinned to chosen values, LoRA
// adapters loaded on demand up to a limit, and seed 002's /metadata and
// readiness endpoints through pkg/discovery's Registry.
//
// No model runs: a request holds a place in the batch for a configurable
// latency and gets a canned answer.
package simulator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/discovery"
)

// Defaults for the zero Options.
const (
	DefaultLatency     = 20 * time.Millisecond
	DefaultConcurrency = 16
	// DefaultMaxLoRA is vLLM's default max_loras, used when LoRA adapters
	// are served and Options.MaxLoRA is 0.
	DefaultMaxLoRA = 1
)

// The seed 002 registration of a simulator.
const (
	RegistryNamespace = "mci"
	RegistryComponent = "model-server"
)

// InstanceHeader is set on every response to the ID of the instance that
// answered.
const InstanceHeader = "X-Simulator-Instance"

// LatencyHeader, on a completion request, overrides Options.Latency for that
// request (a Go duration, at most MaxRequestLatency): tests use it to hold
// requests in the batch.
const LatencyHeader = "X-Simulator-Latency"

// MaxRequestLatency bounds LatencyHeader.
const MaxRequestLatency = 5 * time.Minute

// Options configure a Server.
type Options struct {
	// InstanceID names the instance in responses, metadata and errors; the
	// pod name ($POD_NAME, else the host name) when empty.
	InstanceID string
	// Model is the base model served. Required.
	Model string
	// LoRAAdapters are the adapters the server can load: requests may name
	// them as their model.
	LoRAAdapters []string
	// MaxLoRA is how many adapters can be resident at once; DefaultMaxLoRA
	// when 0 and LoRAAdapters are served.
	MaxLoRA int
	// Latency is how long a request runs once admitted to the batch;
	// DefaultLatency when 0, none when negative.
	Latency time.Duration
	// Concurrency is the batch size: how many requests run at once, the
	// others wait. DefaultConcurrency when 0.
	Concurrency int
	// Pins override what the metrics report.
	Pins Pins
	// NotReady starts the instance not ready (the readiness endpoint
	// answers 503) until SetReady(true).
	NotReady bool
	// CostModel, when set, makes requests cost what prefill and decode
	// would (see CostModel) instead of Latency, with a prefix cache.
	CostModel *CostModel
	// NoMetadata serves no seed 002 /metadata (404), as a plain vLLM
	// server does.
	NoMetadata bool
}

// Pins fix what /metrics reports regardless of the real load, so that tests
// can reproduce a scenario (seed 001's worked examples) exactly; requests
// are served as usual. A nil field follows the real load.
type Pins struct {
	Waiting         *int     `json:"waiting"`
	Running         *int     `json:"running"`
	KVCacheUsage    *float64 `json:"kvCacheUsage"`
	RunningAdapters []string `json:"runningAdapters"`
	WaitingAdapters []string `json:"waitingAdapters"`
}

// Validate checks that the pinned values are values vLLM could report.
func (p Pins) Validate() error {
	var errs []error
	if p.Waiting != nil && *p.Waiting < 0 {
		errs = append(errs, fmt.Errorf("pinned waiting %d is negative", *p.Waiting))
	}
	if p.Running != nil && *p.Running < 0 {
		errs = append(errs, fmt.Errorf("pinned running %d is negative", *p.Running))
	}
	if p.KVCacheUsage != nil && !(*p.KVCacheUsage >= 0 && *p.KVCacheUsage <= 1) {
		errs = append(errs, fmt.Errorf("pinned KV cache usage %v is not between 0 and 1", *p.KVCacheUsage))
	}
	return errors.Join(errs...)
}

func (p Pins) clone() Pins {
	c := p
	if p.Waiting != nil {
		c.Waiting = new(*p.Waiting)
	}
	if p.Running != nil {
		c.Running = new(*p.Running)
	}
	if p.KVCacheUsage != nil {
		c.KVCacheUsage = new(*p.KVCacheUsage)
	}
	if p.RunningAdapters != nil {
		c.RunningAdapters = slices.Clone(p.RunningAdapters)
	}
	if p.WaitingAdapters != nil {
		c.WaitingAdapters = slices.Clone(p.WaitingAdapters)
	}
	return c
}

// Server is a simulated model server. Its Handler serves:
//
//	POST /v1/completions, POST /v1/chat/completions  OpenAI-compatible
//	GET  /v1/models                                   the base model and adapters
//	GET  /metrics                                     vLLM load metrics
//	GET  /metadata, GET /ready                        seed 002 (pkg/discovery; no /metadata with NoMetadata)
//	GET  /health                                      liveness: always 200
//	POST /admin/ready?ready=true|false                set readiness
//	GET, POST /admin/pins                             read or replace the Pins
//	GET  /admin/load                                  Metrics as JSON
//	GET, POST /admin/fault                            read or set the Fault: {"fault":"error"|"hang"|""}
//
// and with a cost model:
//
//	POST /admin/prefix-match         how much of a request's prompt is cached
//	GET, DELETE /admin/cache         the prefix cache's counters; DELETE empties it
type Server struct {
	opts     Options
	adapters map[string]bool
	engine   *engine
	instance *discovery.InstanceHandle
	handler  http.Handler
	requests atomic.Uint64
	// cache and kvBlocks (the KV blocks of running requests) exist with a
	// cost model only.
	cache    *prefixCache
	kvBlocks atomic.Int64

	mu   sync.RWMutex
	pins Pins

	fault faultState
}

// New returns a Server for opts.
func New(opts Options) (*Server, error) {
	if opts.Model == "" {
		return nil, errors.New("simulator: a base model is required")
	}
	if opts.Latency == 0 {
		opts.Latency = DefaultLatency
	}
	if opts.Latency < 0 {
		opts.Latency = 0
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.Concurrency < 0 {
		return nil, fmt.Errorf("simulator: concurrency %d is negative", opts.Concurrency)
	}
	if opts.MaxLoRA < 0 {
		return nil, fmt.Errorf("simulator: max LoRA %d is negative", opts.MaxLoRA)
	}
	if opts.MaxLoRA == 0 && len(opts.LoRAAdapters) > 0 {
		opts.MaxLoRA = DefaultMaxLoRA
	}
	if err := opts.Pins.Validate(); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	var cache *prefixCache
	if opts.CostModel != nil {
		cm := *opts.CostModel
		if err := cm.complete(); err != nil {
			return nil, fmt.Errorf("simulator: %w", err)
		}
		opts.CostModel = &cm
		cache = newPrefixCache(cm.CacheBlocks)
	}
	adapters := map[string]bool{}
	for _, a := range opts.LoRAAdapters {
		if a == "" || a == opts.Model {
			return nil, fmt.Errorf("simulator: LoRA adapter name %q must be non-empty and differ from the base model", a)
		}
		adapters[a] = true
	}
	opts.LoRAAdapters = slices.Sorted(func(yield func(string) bool) {
		for a := range adapters {
			if !yield(a) {
				return
			}
		}
	})

	instance, err := discovery.Registry{InstanceID: opts.InstanceID}.RegisterInstance(RegistryNamespace, RegistryComponent)
	if err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	opts.InstanceID = instance.InstanceID()
	s := &Server{
		opts:     opts,
		adapters: adapters,
		engine:   newEngine(opts.Concurrency, opts.MaxLoRA),
		instance: instance,
		pins:     opts.Pins.clone(),
		cache:    cache,
	}
	if err := s.setMetadata(""); err != nil {
		return nil, err
	}
	instance.SetReady(!opts.NotReady)

	registry := prometheus.NewPedanticRegistry()
	if err := registry.Register(&collector{s: s}); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.completion(textCompletion))
	mux.HandleFunc("POST /v1/chat/completions", s.completion(chatCompletion))
	mux.HandleFunc("GET /v1/models", s.models)
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	if !opts.NoMetadata {
		mux.Handle("GET "+discovery.MetadataPath, instance.MetadataHandler())
	}
	mux.Handle("GET "+discovery.ReadyPath, instance.ReadinessHandler())
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /admin/ready", s.adminReady)
	mux.HandleFunc("GET /admin/pins", s.getPins)
	mux.HandleFunc("POST /admin/pins", s.setPins)
	mux.HandleFunc("GET /admin/fault", s.adminFault)
	mux.HandleFunc("POST /admin/fault", s.adminFault)
	mux.HandleFunc("GET /admin/load", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.Metrics()) })
	mux.HandleFunc("POST /admin/prefix-match", s.prefixMatch)
	mux.HandleFunc("GET /admin/cache", s.cacheAdmin)
	mux.HandleFunc("DELETE /admin/cache", s.cacheAdmin)
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.opts.InstanceID)
		mux.ServeHTTP(w, r)
	})
	return s, nil
}

// InstanceID is the ID the server answers as.
func (s *Server) InstanceID() string { return s.opts.InstanceID }

// Handler serves the simulator's HTTP API.
func (s *Server) Handler() http.Handler { return s.handler }

// SetReady sets what the readiness endpoint answers.
func (s *Server) SetReady(ready bool) { s.instance.SetReady(ready) }

// Ready reports whether the instance is ready.
func (s *Server) Ready() bool { return s.instance.Ready() }

// SetPins replaces the pins.
func (s *Server) SetPins(p Pins) error {
	if err := p.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pins = p.clone()
	return nil
}

// Pins returns the current pins.
func (s *Server) Pins() Pins {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pins.clone()
}

// Metrics is what /metrics reports now: the real load with the pins
// applied.
type Metrics struct {
	Waiting         int      `json:"waiting"`
	Running         int      `json:"running"`
	KVCacheUsage    float64  `json:"kvCacheUsage"`
	RunningAdapters []string `json:"runningAdapters"`
	WaitingAdapters []string `json:"waitingAdapters"`
	MaxLoRA         int      `json:"maxLoRA"`
}

// Metrics returns what /metrics would report now.
func (s *Server) Metrics() Metrics {
	l := s.engine.load()
	m := Metrics{
		Waiting: l.Waiting, Running: l.Running, KVCacheUsage: l.KVCacheUsage,
		RunningAdapters: l.RunningAdapters, WaitingAdapters: l.WaitingAdapters,
		MaxLoRA: s.opts.MaxLoRA,
	}
	if cm := s.opts.CostModel; cm != nil {
		// Under a cost model the KV cache holds the blocks of the running
		// requests, as vLLM's usage gauge counts them.
		m.KVCacheUsage = min(float64(s.kvBlocks.Load())/float64(cm.CacheBlocks), 1)
	}
	p := s.Pins()
	if p.Waiting != nil {
		m.Waiting = *p.Waiting
	}
	if p.Running != nil {
		m.Running = *p.Running
	}
	if p.KVCacheUsage != nil {
		m.KVCacheUsage = *p.KVCacheUsage
	}
	if p.RunningAdapters != nil {
		m.RunningAdapters = p.RunningAdapters
	}
	if p.WaitingAdapters != nil {
		m.WaitingAdapters = p.WaitingAdapters
	}
	return m
}

// Serve serves the simulator on l until ctx ends, then marks the instance
// not ready and shuts down gracefully, letting requests in flight finish
// for up to shutdownTimeout.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	const shutdownTimeout = 10 * time.Second
	if err := s.setMetadata("http://" + l.Addr().String()); err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger := klog.FromContext(ctx)
	logger.Info("Shutting down", "instance", s.opts.InstanceID)
	s.SetReady(false)
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("simulator: shutting down: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// setMetadata publishes the instance's metadata in seed 002's shape: a
// "Model" entry (name, type, runtime_config, and the LoRA adapters it can
// load, which mci-epp reads to send it only requests for those models) and
// a "Transport" entry once it serves.
func (s *Server) setMetadata(address string) error {
	runtime := map[string]any{
		"max_num_seqs": s.opts.Concurrency,
		"latency":      s.opts.Latency.String(),
	}
	if cm := s.opts.CostModel; cm != nil {
		runtime["block_size"] = cm.BlockTokens
		runtime["num_gpu_blocks"] = cm.CacheBlocks
		runtime["enable_prefix_caching"] = true
	}
	md := map[string]any{
		"instance_id": s.opts.InstanceID,
		"Model": map[string]any{
			"name":           s.opts.Model,
			"type":           "Completions",
			"lora_adapters":  s.opts.LoRAAdapters,
			"max_lora":       s.opts.MaxLoRA,
			"runtime_config": runtime,
		},
	}
	if address != "" {
		md["Transport"] = map[string]any{"http": address}
	}
	if err := s.instance.SetMetadata(md); err != nil {
		return fmt.Errorf("simulator: %w", err)
	}
	return nil
}
