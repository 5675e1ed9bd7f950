// Package epp is mci's reference Endpoint Picker for one InferencePool: an
// Envoy ext_proc v3 server that reads each request's model from its
// OpenAI-style body and its steering headers, resolves them through the
// pool's InferenceObjectives (priority), InferenceModelRewrites (weighted
// model rewrites) and InferenceModels (criticality, weighted target models)
// with requestmodel.Models.Resolve, and picks a model server with seed 001's filter chain
// (pkg/scheduling) over the servers' scraped vLLM metrics (pkg/metrics).
// InferenceObjective and InferenceModelRewrite are read in both groups that
// served them: inference.networking.x-k8s.io/v1alpha2 (GIE up to v1.5) and
// llm-d.ai/v1alpha2 (GIE v1.6 on). It answers with the Endpoint Picker protocol: the
// destination in the x-gateway-destination-endpoint header and the
// envoy.lb dynamic metadata, 429 for a shed request, 503 when no endpoint is
// ready, 404 when no ready endpoint serves the model, 400 for a body
// without a model, 413 for an oversized body.
//
// The decision (Picker) knows nothing of gRPC or Kubernetes; Server puts it
// on ext_proc; EPP runs the servers (ext_proc, gRPC health, Prometheus
// metrics) around a Source that keeps the candidates and models current: a
// fixed list (StaticSource) or an InferencePool in a cluster (KubeSource).
//
// Objectives and rewrites, as upstream EPPs apply them (details on
// requestmodel.Models.Resolve):
//   - A request names an InferenceObjective by metadata.name in
//     x-gateway-inference-objective (or x-llm-d-inference-objective).
//     Priority below 0 is Sheddable, 0 (unset, or no objective) Standard,
//     above 0 Critical. The objective wins over the InferenceModel's
//     criticality.
//   - An objective the pool does not have is served with priority 0, as
//     upstream EPPs do (not 400): logged once per name, counted by
//     mci_epp_unknown_objective_requests_total.
//   - Target model: an exact InferenceModelRewrite rule, then an
//     InferenceModel's targetModels, then a rule without matches, then the
//     x-gateway-model-name-rewrite header, then the model as requested.
//   - x-gateway-inference-fairness-id is read and logged (there is no flow
//     control to use it); like every steering header it stays on the
//     request.
//   - One objective name in both groups: llm-d.ai wins.
//
// The models a server serves (KubeSource): a model server whose seed 002
// /metadata names its base model and LoRA adapters gets only requests whose
// target model is one of them; one without /metadata gets any. This
// filter comes before seed 001's chain. When servers are ready but none
// serves the target model, the answer is 404, what the model servers
// themselves answer for a model they do not have, so that a client with a
// wrong model name is told so instead of retrying a 503; 503 stays for no
// ready server at all. A target model that a server's metadata names as
// its base model needs no LoRA adapter.
//
// Where seed 001 is silent:
//   - A model name without an InferenceModel is served as it is, with
//     Standard criticality (the API's default criticality): the EPP routes,
//     it does not gatekeep model names (the servers' /metadata may).
//   - The target model is taken for the LoRA adapter the request needs,
//     unless it is one of PickerConfig.BaseModels (the model servers' base
//     model): then the request has no adapter preference.
//   - Several InferenceModels with one model name: the oldest wins.
//   - The subset hint: "ip:port" entries match that endpoint, bare "ip"
//     entries every endpoint on the IP. A hint that is present but empty,
//     or names no endpoint of the pool, gets 503, as the protocol says; so
//     does a hint that is not a list of strings (picking outside it would
//     break the protocol).
//   - Fallbacks (PickerConfig.MaxFallbacks, 0 by default): the destination
//     "primary,fallback,..." goes into the header and the metadata alike (the
//     protocol requires them to agree). Each fallback is the scheduler's pick
//     among the endpoints not yet listed, so a sheddable request's fallbacks
//     have capacity too, and there may be fewer than asked.
//   - A body that is not a JSON object, has no "model" string, or is
//     absent: 400. Any path is accepted; completions and chat completions
//     (and embeddings, ...) all carry a top-level "model".
package epp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// The gRPC health services the EPP reports, as the Endpoint Picker protocol
// names them. "" is the server as a whole.
const (
	LivenessService  = "liveness"
	ReadinessService = extproc.ReadinessService
)

// drainTimeout bounds the wait for open ext_proc streams at shutdown.
const drainTimeout = 5 * time.Second

// Config is what an EPP runs with.
type Config struct {
	// BindAddress is the IP the servers listen on.
	BindAddress string
	// GRPCPort (ext_proc), HealthPort (grpc.health.v1) and MetricsPort
	// (Prometheus /metrics). 0 picks a free port (tests).
	GRPCPort, HealthPort, MetricsPort int
	// EnablePprof serves Go's runtime profiles on the metrics port, behind
	// MetricsFilter.
	EnablePprof bool
	// SecureServing serves ext_proc over TLS with a self-signed certificate,
	// as gateways that verify nothing but encryption expect. TLS, when
	// enabled, supersedes it.
	SecureServing bool
	// TLS serves every port over TLS with a certificate from files,
	// optionally requiring client certificates.
	TLS extproc.TLSOptions
	// PoolName names the pool in the metrics.
	PoolName string
	// PoolMetricsSchemes are the names the pool gauges are served under;
	// empty: metrics.GIEScheme's (inference_pool_*).
	PoolMetricsSchemes []metrics.PoolScheme
	// MaxNumSeqs is the batch places of each model server of the pool
	// (vLLM's --max-num-seqs), published with the pool gauges beside their
	// running requests; 0: not known, not published.
	MaxNumSeqs int
	// MetricsFilter, when set, guards /metrics (metricsauth): as upstream
	// EPPs serve it by default, to bearer tokens only.
	MetricsFilter func(http.Handler) http.Handler
	// MaxRequestBodyBytes bounds the request bodies buffered; <= 0:
	// requestmodel.DefaultMaxRequestBodyBytes.
	MaxRequestBodyBytes int64
	// ScrapeInterval is the pause between scrapes of a model server's
	// metrics; 0: the scraper's default.
	ScrapeInterval time.Duration
	// Picker configures the decisions.
	Picker PickerConfig
	// Rand drives the decisions' randomness; nil: randomly seeded.
	Rand rand.Source
}

// Source keeps a pool's endpoints and models current until ctx ends. Its
// first SetEndpoints marks the pool synced, which makes the EPP ready. A
// Source that is also a prometheus.Collector has its metrics served with
// the EPP's.
type Source interface {
	Run(ctx context.Context, pool *Pool, models *requestmodel.Models) error
}

// EPP is a running Endpoint Picker: its listeners are bound by New, so their
// addresses are known before Run.
type EPP struct {
	cfg     Config
	source  Source
	pool    *Pool
	models  *requestmodel.Models
	scraper *metrics.Scraper
	servers *extproc.Servers
}

// New builds an EPP and binds its listeners.
func New(cfg Config, source Source) (*EPP, error) {
	scraper := metrics.NewScraper(metrics.ScraperOptions{Interval: cfg.ScrapeInterval})
	pool := NewPool(cfg.PoolName, scraper, scraper)
	models := requestmodel.NewModels()
	picker, err := NewPicker(cfg.Picker, pool, models, cfg.Rand)
	if err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := NewMetrics(reg, pool, cfg.Picker.Scheduling.MetricsStaleness, cfg.MaxNumSeqs, cfg.PoolMetricsSchemes...)
	reg.MustRegister(NewAPICollector(models))
	if c, ok := source.(prometheus.Collector); ok {
		// The source's own metrics (KubeSource: whether its informers
		// list and watch).
		reg.MustRegister(c)
	}

	var opts []grpc.ServerOption
	if cfg.SecureServing && !cfg.TLS.Enabled() {
		creds, err := selfSignedCredentials(cfg.BindAddress)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(creds))
	}
	servers, err := extproc.Listen(extproc.ServingOptions{
		BindAddress: cfg.BindAddress,
		GRPCPort:    cfg.GRPCPort,
		HealthPort:  cfg.HealthPort,
		MetricsPort: cfg.MetricsPort,
		EnablePprof: cfg.EnablePprof,
		TLS:         cfg.TLS,
		// As upstream EPPs: only the metrics port is guarded.
		MetricsFilter: cfg.MetricsFilter,
		// The importing clusters' sidecars read the prefix summary where
		// they read the pool gauges, with the same credentials.
		MetricsAlternatives: map[string]http.Handler{promptprefix.SummaryContentType: newPrefixSummary(picker, reg)},
	}, NewServer(picker, m, cfg.MaxRequestBodyBytes, klog.Background().WithName("ext_proc")), reg, opts...)
	if err != nil {
		return nil, err
	}
	servers.SetServing(LivenessService)
	return &EPP{cfg: cfg, source: source, pool: pool, models: models, scraper: scraper, servers: servers}, nil
}

// GRPCAddr, HealthAddr and MetricsAddr are the listeners' addresses.
func (e *EPP) GRPCAddr() string    { return e.servers.GRPCAddr() }
func (e *EPP) HealthAddr() string  { return e.servers.HealthAddr() }
func (e *EPP) MetricsAddr() string { return e.servers.MetricsAddr() }

// Pool returns the EPP's candidates.
func (e *EPP) Pool() *Pool { return e.pool }

// Run serves until ctx ends or a part fails, then stops everything: ext_proc
// streams get a few seconds to finish.
func (e *EPP) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// The first part to fail stops the others.
	parts, ctx := extproc.NewParts(ctx)
	parts.Run("scraper", e.scraper.Run)
	parts.Run("candidate source", func(ctx context.Context) error {
		if err := e.source.Run(ctx, e.pool, e.models); err != nil || ctx.Err() != nil {
			return err
		}
		return errors.New("stopped")
	})
	// The servers' error already names the server that failed.
	parts.Run("", func(ctx context.Context) error { return e.servers.Run(ctx, drainTimeout) })
	parts.Run("", func(ctx context.Context) error {
		select {
		case <-e.pool.Synced():
			e.servers.Ready()
			models, objectives, rules := e.models.Counts()
			logger.Info("Endpoint picker ready", "pool", e.cfg.PoolName, "endpoints", len(e.pool.Endpoints()),
				"inferenceModels", models, "inferenceObjectives", objectives, "rewriteRules", rules)
		case <-ctx.Done():
		}
		return nil
	})
	logger.Info("Endpoint picker serving", "extProc", e.GRPCAddr(), "health", e.HealthAddr(), "metrics", e.MetricsAddr(),
		"secure", e.cfg.SecureServing || e.cfg.TLS.Enabled(), "clientCertificates", e.cfg.TLS.ClientCAFile != "", "metricsAuth", e.cfg.MetricsFilter != nil)
	return parts.Wait()
}

// selfSignedCredentials makes TLS credentials from a fresh self-signed
// certificate for the bind address (and localhost).
func selfSignedCredentials(bindAddress string) (credentials.TransportCredentials, error) {
	cfg, err := extproc.SelfSignedConfig("mci-epp", bindAddress, []string{"localhost"})
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// StaticSource is a fixed set of endpoints and request configuration: the
// standalone mode.
type StaticSource struct {
	Endpoints []Endpoint
	Config    requestmodel.ModelConfig
}

// Run sets the endpoints and configuration once and waits for ctx to end.
func (s StaticSource) Run(ctx context.Context, pool *Pool, models *requestmodel.Models) error {
	for _, ignored := range models.Set(s.Config) {
		klog.FromContext(ctx).Info("Ignoring or repairing part of the model configuration", "note", ignored)
	}
	if err := pool.SetEndpoints(s.Endpoints); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// ParseEndpoints turns "ip:port,ip:port" into endpoints named by their
// address, written the canonical way (net.JoinHostPort of the IP's String
// and the port in decimal), so that one server written two ways
// ("::ffff:10.0.0.1:080" and "10.0.0.1:80") is one endpoint and the
// gateway is sent an address it can read.
func ParseEndpoints(list []string) ([]Endpoint, error) {
	eps := make([]Endpoint, 0, len(list))
	for _, a := range list {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("endpoint %q: %w", a, err)
		}
		ip := net.ParseIP(host)
		if ip == nil {
			return nil, fmt.Errorf("endpoint %q: %q is not an IP address", a, host)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p < 1 {
			return nil, fmt.Errorf("endpoint %q: %q is not a port", a, port)
		}
		addr := net.JoinHostPort(ip.String(), strconv.FormatUint(p, 10))
		eps = append(eps, Endpoint{Name: addr, Address: addr})
	}
	return eps, nil
}
