package sidecar

import (
	"context"
	"errors"
	"fmt"
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
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/klog/v2"
)

// DefaultDrainTimeout bounds the wait for open ext_proc streams at shutdown.
const DefaultDrainTimeout = 10 * time.Second

// Config is what a sidecar runs with.
type Config struct {
	// BindAddress is the IP the servers listen on.
	BindAddress string
	// GRPCPort (ext_proc), HealthPort (grpc.health.v1) and MetricsPort
	// (Prometheus /metrics). 0 picks a free port (tests).
	GRPCPort, HealthPort, MetricsPort int
	// Watch configures the routing table.
	Watch WatchConfig
	// Server configures the ext_proc service.
	Server ServerConfig
	// HealthInterval and HealthTimeout pace the gRPC health checks of
	// EPPs; ScrapeInterval and ScrapeTimeout the scrapes of their metrics
	// (MetricsBased only). Zero: the defaults.
	HealthInterval, HealthTimeout time.Duration
	ScrapeInterval, ScrapeTimeout time.Duration
	// DrainTimeout bounds the wait for open streams at shutdown; zero:
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
}

// Sidecar is a running mci-sidecar: the routing table kept by a Watcher,
// the ext_proc Server, the EPP health prober and metrics scraper, and the
// gRPC health and Prometheus servers. Listeners are bound by New.
type Sidecar struct {
	cfg     Config
	router  *Router
	watcher *Watcher
	server  *Server
	prober  *HealthProber
	scraper *PoolScraper
	metrics *Metrics

	grpcLis, healthLis, metricsLis net.Listener
	grpcServer, healthGRPC         *grpc.Server
	health                         *health.Server
	httpServer                     *http.Server
}

// New builds a sidecar reading the cluster through clients, and binds its
// listeners.
func New(cfg Config, clients Clients) (_ *Sidecar, err error) {
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	s := &Sidecar{
		cfg:     cfg,
		router:  NewRouter(),
		prober:  NewHealthProber(cfg.HealthInterval, cfg.HealthTimeout),
		scraper: NewPoolScraper(cfg.ScrapeInterval, cfg.ScrapeTimeout),
	}
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	listen := func(port int) (net.Listener, error) {
		return net.Listen("tcp", net.JoinHostPort(cfg.BindAddress, strconv.Itoa(port)))
	}
	if s.grpcLis, err = listen(cfg.GRPCPort); err != nil {
		return nil, fmt.Errorf("ext_proc listener: %w", err)
	}
	if s.healthLis, err = listen(cfg.HealthPort); err != nil {
		return nil, fmt.Errorf("health listener: %w", err)
	}
	if s.metricsLis, err = listen(cfg.MetricsPort); err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = NewMetrics(reg, s.router, s.prober)
	s.server = NewServer(s.router, liveState{health: s.prober, metrics: s.scraper}, cfg.Server, s.metrics, klog.Background().WithName("ext_proc"))
	s.watcher = NewWatcher(clients, cfg.Watch, s.router, s.published)

	s.health = health.NewServer()
	for _, svc := range servingServices {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	s.grpcServer = grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(s.grpcServer, s.server)
	healthpb.RegisterHealthServer(s.grpcServer, s.health)
	s.healthGRPC = grpc.NewServer()
	healthpb.RegisterHealthServer(s.healthGRPC, s.health)

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s.httpServer = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

// servingServices turn SERVING once the first routing table is published:
// the server as a whole, readiness, and the ext_proc service, as an EPP
// reports them (so that gateways health-check the sidecar as they would an
// EPP).
var servingServices = []string{"", "readiness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// GRPCAddr, HealthAddr and MetricsAddr are the listeners' addresses.
func (s *Sidecar) GRPCAddr() string    { return s.grpcLis.Addr().String() }
func (s *Sidecar) HealthAddr() string  { return s.healthLis.Addr().String() }
func (s *Sidecar) MetricsAddr() string { return s.metricsLis.Addr().String() }

// Router returns the sidecar's routing table holder.
func (s *Sidecar) Router() *Router { return s.router }

// published follows a new table: probe and scrape its clusters, keep the
// connections to its EPPs.
func (s *Sidecar) published(t *Table, took time.Duration) {
	var healthTargets, metricsTargets []string
	for _, r := range t.Rules() {
		for _, b := range r.Backends {
			clusters := b.Clusters
			if b.Local != nil {
				clusters = append(clusters[:len(clusters):len(clusters)], b.Local)
			}
			for _, c := range clusters {
				healthTargets = append(healthTargets, c.Health)
				if b.Policy == PolicyMetricsBased {
					metricsTargets = append(metricsTargets, c.Metrics)
				}
			}
		}
	}
	s.prober.SetTargets(healthTargets)
	s.scraper.SetTargets(metricsTargets)
	s.server.Retain(t)
	s.metrics.published(t, took)
}

// Run serves until ctx ends, then drains: the health services turn
// NOT_SERVING, the ext_proc server stops accepting streams and lets the open
// ones finish for up to DrainTimeout, then the rest stops.
func (s *Sidecar) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	fail := func(what string, err error) {
		if err != nil && ctx.Err() == nil {
			cancel(fmt.Errorf("%s: %w", what, err))
		}
	}
	wg.Go(func() { fail("health prober", s.prober.Run(ctx)) })
	wg.Go(func() { fail("metrics scraper", s.scraper.Run(ctx)) })
	wg.Go(func() {
		err := s.watcher.Run(ctx)
		if err == nil && ctx.Err() == nil {
			err = errors.New("stopped")
		}
		fail("routing table watcher", err)
	})
	wg.Go(func() { fail("ext_proc server", s.grpcServer.Serve(s.grpcLis)) })
	wg.Go(func() { fail("health server", s.healthGRPC.Serve(s.healthLis)) })
	wg.Go(func() {
		if err := s.httpServer.Serve(s.metricsLis); !errors.Is(err, http.ErrServerClosed) {
			fail("metrics server", err)
		}
	})
	wg.Go(func() {
		select {
		case <-s.watcher.Synced():
			for _, svc := range servingServices {
				s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
			}
			t := s.router.Table()
			logger.Info("Sidecar ready", "generation", t.Generation, "rules", len(t.Rules()), "problems", len(t.Errors))
		case <-ctx.Done():
		}
	})
	logger.Info("Sidecar serving", "extProc", s.GRPCAddr(), "health", s.HealthAddr(), "metrics", s.MetricsAddr(),
		"localCluster", s.cfg.Watch.LocalCluster, "defaultPolicy", s.cfg.Watch.DefaultPolicy)

	<-ctx.Done()
	logger.Info("Draining", "timeout", s.cfg.DrainTimeout)
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.grpcServer.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(s.cfg.DrainTimeout):
		logger.Info("Drain timeout; cutting the streams still open")
		s.grpcServer.Stop()
	}
	s.healthGRPC.Stop()
	shutdownCtx, shutdownCancel := context.WithTimeout(context.Background(), time.Second)
	defer shutdownCancel()
	_ = s.httpServer.Shutdown(shutdownCtx)
	wg.Wait()
	s.server.Close()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (s *Sidecar) closeListeners() {
	for _, l := range []net.Listener{s.grpcLis, s.healthLis, s.metricsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}
