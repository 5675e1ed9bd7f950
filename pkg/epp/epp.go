// Package epp is mci's reference Endpoint Picker for one InferencePool: an
// Envoy ext_proc v3 server that reads each request's model from its
// OpenAI-style body, maps it through the pool's InferenceModels (criticality,
// weighted target models), and picks a model server with seed 001's filter
// chain (pkg/scheduling) over the servers' scraped vLLM metrics
// (pkg/metrics). It answers with the Endpoint Picker protocol: the
// destination in the x-gateway-destination-endpoint header and the
// envoy.lb dynamic metadata, 429 for a shed request, 503 when no endpoint is
// ready, 400 for a body without a model, 413 for an oversized body.
//
// The decision (Picker) knows nothing of gRPC or Kubernetes; Server puts it
// on ext_proc; EPP runs the servers (ext_proc, gRPC health, Prometheus
// metrics) around a Source that keeps the candidates and models current: a
// fixed list (StaticSource) or an InferencePool in a cluster (KubeSource).
//
// Where seed 001 is silent:
//   - A model name without an InferenceModel is served as it is, with
//     Standard criticality (the API's default criticality): the EPP routes,
//     it does not gatekeep model names.
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
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	"github.com/mci-dev/mci/pkg/metrics"
)

// The gRPC health services the EPP reports, as the Endpoint Picker protocol
// names them. "" is the server as a whole.
const (
	LivenessService  = "liveness"
	ReadinessService = "readiness"
)

// Config is what an EPP runs with.
type Config struct {
	// BindAddress is the IP the servers listen on.
	BindAddress string
	// GRPCPort (ext_proc), HealthPort (grpc.health.v1) and MetricsPort
	// (Prometheus /metrics). 0 picks a free port (tests).
	GRPCPort, HealthPort, MetricsPort int
	// SecureServing serves ext_proc over TLS with a self-signed certificate,
	// as gateways that verify nothing but encryption expect.
	SecureServing bool
	// PoolName names the pool in the metrics.
	PoolName string
	// MaxRequestBodyBytes bounds the request bodies buffered; <= 0:
	// DefaultMaxRequestBodyBytes.
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
// first SetEndpoints marks the pool synced, which makes the EPP ready.
type Source interface {
	Run(ctx context.Context, pool *Pool, models *Models) error
}

// EPP is a running Endpoint Picker: its listeners are bound by New, so their
// addresses are known before Run.
type EPP struct {
	cfg     Config
	source  Source
	pool    *Pool
	models  *Models
	picker  *Picker
	scraper *metrics.Scraper

	grpcLis, healthLis, metricsLis net.Listener
	grpcServer, healthGRPC         *grpc.Server
	health                         *health.Server
	httpServer                     *http.Server
}

// New builds an EPP and binds its listeners.
func New(cfg Config, source Source) (_ *EPP, err error) {
	scraper := metrics.NewScraper(metrics.ScraperOptions{Interval: cfg.ScrapeInterval})
	pool := NewPool(cfg.PoolName, scraper, scraper)
	models := NewModels()
	picker, err := NewPicker(cfg.Picker, pool, models, cfg.Rand)
	if err != nil {
		return nil, err
	}
	e := &EPP{cfg: cfg, source: source, pool: pool, models: models, picker: picker, scraper: scraper}
	defer func() {
		if err != nil {
			e.closeListeners()
		}
	}()
	listen := func(port int) (net.Listener, error) {
		return net.Listen("tcp", net.JoinHostPort(cfg.BindAddress, strconv.Itoa(port)))
	}
	if e.grpcLis, err = listen(cfg.GRPCPort); err != nil {
		return nil, fmt.Errorf("ext_proc listener: %w", err)
	}
	if e.healthLis, err = listen(cfg.HealthPort); err != nil {
		return nil, fmt.Errorf("health listener: %w", err)
	}
	if e.metricsLis, err = listen(cfg.MetricsPort); err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := NewMetrics(reg, pool, cfg.Picker.Scheduling.MetricsStaleness)

	var opts []grpc.ServerOption
	if cfg.SecureServing {
		creds, err := selfSignedCredentials(cfg.BindAddress)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(creds))
	}
	e.health = health.NewServer()
	e.health.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	for _, svc := range readinessServices {
		e.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	e.grpcServer = grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(e.grpcServer, NewServer(picker, m, cfg.MaxRequestBodyBytes, klog.Background().WithName("ext_proc")))
	// Health on the ext_proc port too, for gateways that health-check the
	// EPP's cluster where they send ext_proc.
	healthpb.RegisterHealthServer(e.grpcServer, e.health)
	e.healthGRPC = grpc.NewServer()
	healthpb.RegisterHealthServer(e.healthGRPC, e.health)

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	e.httpServer = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return e, nil
}

// readinessServices turn SERVING once the pool has synced.
var readinessServices = []string{"", ReadinessService, extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// GRPCAddr, HealthAddr and MetricsAddr are the listeners' addresses.
func (e *EPP) GRPCAddr() string    { return e.grpcLis.Addr().String() }
func (e *EPP) HealthAddr() string  { return e.healthLis.Addr().String() }
func (e *EPP) MetricsAddr() string { return e.metricsLis.Addr().String() }

// Pool returns the EPP's candidates.
func (e *EPP) Pool() *Pool { return e.pool }

// Run serves until ctx ends or a part fails, then stops everything: ext_proc
// streams get a few seconds to finish.
func (e *EPP) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	fail := func(what string, err error) {
		if err != nil && ctx.Err() == nil {
			cancel(fmt.Errorf("%s: %w", what, err))
		}
	}
	wg.Go(func() { fail("scraper", e.scraper.Run(ctx)) })
	wg.Go(func() {
		err := e.source.Run(ctx, e.pool, e.models)
		if err == nil && ctx.Err() == nil {
			err = errors.New("stopped")
		}
		fail("candidate source", err)
	})
	wg.Go(func() { fail("ext_proc server", e.grpcServer.Serve(e.grpcLis)) })
	wg.Go(func() { fail("health server", e.healthGRPC.Serve(e.healthLis)) })
	wg.Go(func() {
		if err := e.httpServer.Serve(e.metricsLis); !errors.Is(err, http.ErrServerClosed) {
			fail("metrics server", err)
		}
	})
	wg.Go(func() {
		select {
		case <-e.pool.Synced():
			for _, svc := range readinessServices {
				e.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
			}
			logger.Info("Endpoint picker ready", "pool", e.cfg.PoolName, "endpoints", len(e.pool.Endpoints()), "models", e.models.Len())
		case <-ctx.Done():
		}
	})
	logger.Info("Endpoint picker serving", "extProc", e.GRPCAddr(), "health", e.HealthAddr(), "metrics", e.MetricsAddr(), "secure", e.cfg.SecureServing)

	<-ctx.Done()
	e.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		e.grpcServer.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		e.grpcServer.Stop()
	}
	e.healthGRPC.Stop()
	shutdownCtx, shutdownCancel := context.WithTimeout(context.Background(), time.Second)
	defer shutdownCancel()
	_ = e.httpServer.Shutdown(shutdownCtx)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (e *EPP) closeListeners() {
	for _, l := range []net.Listener{e.grpcLis, e.healthLis, e.metricsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// selfSignedCredentials makes TLS credentials from a fresh self-signed
// certificate for the bind address (and localhost).
func selfSignedCredentials(bindAddress string) (credentials.TransportCredentials, error) {
	var ips []net.IP
	if ip := net.ParseIP(bindAddress); ip != nil && !ip.IsUnspecified() {
		ips = append(ips, ip)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("mci-epp", ips, []string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("generating a self-signed serving certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the self-signed serving certificate: %w", err)
	}
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), nil
}

// StaticSource is a fixed set of endpoints and models: the standalone mode.
type StaticSource struct {
	Endpoints []Endpoint
	Models    []*v1alpha2.InferenceModel
}

// Run sets the endpoints and models once and waits for ctx to end.
func (s StaticSource) Run(ctx context.Context, pool *Pool, models *Models) error {
	for _, ignored := range models.Set(s.Models) {
		klog.FromContext(ctx).Info("Ignoring an InferenceModel", "inferenceModel", ignored)
	}
	if err := pool.SetEndpoints(s.Endpoints); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// ParseEndpoints turns "ip:port,ip:port" into endpoints named by their
// address.
func ParseEndpoints(list []string) ([]Endpoint, error) {
	eps := make([]Endpoint, 0, len(list))
	for _, a := range list {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("endpoint %q: %w", a, err)
		}
		if net.ParseIP(host) == nil {
			return nil, fmt.Errorf("endpoint %q: %q is not an IP address", a, host)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("endpoint %q: %q is not a port", a, port)
		}
		eps = append(eps, Endpoint{Name: a, Address: a})
	}
	return eps, nil
}
