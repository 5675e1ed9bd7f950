package sidecar

import (
	"cmp"
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
)

// DefaultDrainTimeout bounds the wait for open ext_proc streams at shutdown.
const DefaultDrainTimeout = 10 * time.Second

// shimPortRetry paces the retries of the shim pools' ports that could not
// be bound.
const shimPortRetry = 5 * time.Second

// Config is what a sidecar runs with.
type Config struct {
	// BindAddress is the IP the servers listen on; ExtProcBindAddress,
	// when set, the IP of the main ext_proc port instead (the command keeps
	// it on loopback outside shim mode).
	BindAddress, ExtProcBindAddress string
	// MetricsFilter, when set, guards /metrics (metricsauth), as mci-epp's.
	MetricsFilter func(http.Handler) http.Handler
	// GRPCPort (ext_proc), HealthPort (grpc.health.v1) and MetricsPort
	// (Prometheus /metrics). 0 picks a free port (tests).
	GRPCPort, HealthPort, MetricsPort int
	// EnablePprof serves Go's runtime profiles on the metrics port, behind
	// MetricsFilter.
	EnablePprof bool
	// TLS, when enabled, serves those ports over TLS.
	TLS extproc.TLSOptions
	// ExtProcTransport is what the ext_proc ports serve without TLS:
	// extproc.ListenerAuto (or ""): self-signed TLS or plaintext in shim
	// mode (Watch.EndpointPickerServices set), plaintext otherwise.
	ExtProcTransport extproc.ListenerTransport
	// SecretNamespaces are the namespaces whose Secrets labelled
	// CredentialsLabel=true the sidecar reads, for the EPPs that need TLS
	// (the Secrets that pools' endpoint-picker-secret annotations, and so
	// imports' secretRefs, name). Empty: no Secret is read, and such EPPs
	// are not reached.
	SecretNamespaces []string
	// Watch configures the routing table.
	Watch WatchConfig
	// Server configures the ext_proc service.
	Server ServerConfig
	// HealthInterval and HealthTimeout pace the gRPC health checks of
	// EPPs; ScrapeInterval and ScrapeTimeout the scrapes of their metrics
	// (MetricsBased only). Zero: the defaults.
	HealthInterval, HealthTimeout time.Duration
	ScrapeInterval, ScrapeTimeout time.Duration
	// PrefixSummaryInterval paces the asks for the EPPs' prompt prefix
	// summaries, after a good scrape; zero: never.
	PrefixSummaryInterval time.Duration
	// MetricsTokenFile, when set, holds the sidecar's own bearer token for
	// the scrapes of EPP metrics whose pool names no token Secret: a
	// projected ServiceAccount token with an audience of its own, re-read
	// as it rotates. It goes only over verified TLS, to in-cluster EPPs and
	// to those MetricsTokenRecipients name (eppprobe.PoolScraperOptions).
	MetricsTokenFile       string
	MetricsTokenRecipients []string
	// DrainTimeout bounds the wait for open streams at shutdown; zero:
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
}

// Sidecar is a running mci-sidecar: the routing table kept by a Watcher,
// the ext_proc Server, the EPP health prober and metrics scraper, and the
// gRPC health and Prometheus servers. Listeners are bound by New.
type Sidecar struct {
	cfg Config
	// transport is what the ext_proc ports serve.
	transport extproc.ListenerTransport
	router    *routetable.Router
	watcher   *Watcher
	server    *Server
	prober    *eppprobe.HealthProber
	scraper   *eppprobe.PoolScraper
	creds     *epptransport.Credentials
	metrics   *Metrics
	draining  *drainingWatch
	// servers report readiness as an EPP does (so that gateways health-check
	// the sidecar as they would an EPP): once the first routing table is
	// published.
	servers *extproc.Servers
}

// New builds a sidecar reading the cluster through clients, and binds its
// listeners. Its parts are made in the order they depend on each other:
// the credentials of EPP addresses; the relay, which reaches EPPs with
// them; the health prober, which reaches them alike and makes the relay
// retry an EPP that turns SERVING; the pool scraper; the server, which
// decides with what the prober and scraper know and relays; the watcher,
// which retargets them all.
func New(cfg Config, clients Clients) (*Sidecar, error) {
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	transport, err := extproc.ResolveListenerTransport(cmp.Or(cfg.ExtProcTransport, extproc.ListenerAuto), cfg.TLS, len(cfg.Watch.EndpointPickerServices) > 0)
	if err != nil {
		return nil, err
	}
	server := cfg.Server.withDefaults()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	router := routetable.NewRouter()
	metrics := NewMetrics(reg)
	creds := epptransport.NewCredentials(clients.Kube, cfg.SecretNamespaces, klog.Background().WithName("credentials"))
	creds.RegisterMetrics(reg)
	relay := newRelayer(server, creds, metrics)
	prober, scraper, err := newProbes(cfg, server, creds, router, relay, reg)
	if err != nil {
		return nil, err
	}
	s := &Sidecar{cfg: cfg, transport: transport, router: router, prober: prober, scraper: scraper, creds: creds, metrics: metrics,
		draining: newDrainingWatch(reg, klog.Background().WithName("draining"))}
	logger := klog.Background().WithName("ext_proc")
	if s.server, err = newServer(router, newLiveState(prober, scraper), relay, server, metrics, logger); err != nil {
		return nil, err
	}
	s.server.phases = newResponsePhaseWatch(reg, logger)
	registerScoringMetrics(reg, s.server.mem)
	s.watcher = NewWatcher(clients, cfg.Watch, router, s.published, metrics.watches)
	if err := s.listen(server, reg, logger); err != nil {
		return nil, err
	}
	return s, nil
}

// newProbes makes what watches the EPPs: the health prober, which has the
// relay reconnect to an EPP that serves again, and the pool scraper, each
// with its metrics in reg.
func newProbes(cfg Config, server ServerConfig, creds *epptransport.Credentials, router *routetable.Router, relay *relayer, reg *prometheus.Registry) (*eppprobe.HealthProber, *eppprobe.PoolScraper, error) {
	prober := eppprobe.NewHealthProber(eppprobe.HealthProberOptions{
		Interval:    cfg.HealthInterval,
		Timeout:     cfg.HealthTimeout,
		Dial:        server.Dial,
		Credentials: creds,
		OnServing:   reconnectProbed(router, relay),
	})
	reg.MustRegister(&eppHealthCollector{router: router, health: prober})
	scraper, err := eppprobe.NewPoolScraper(eppprobe.PoolScraperOptions{
		Interval:        cfg.ScrapeInterval,
		Timeout:         cfg.ScrapeTimeout,
		Staleness:       server.Scheduling.MetricsStaleness,
		TokenFile:       cfg.MetricsTokenFile,
		TokenRecipients: cfg.MetricsTokenRecipients,
		Credentials:     creds,
		// The options' zero means the default; the sidecar's means never.
		PrefixSummaryInterval: cmp.Or(cfg.PrefixSummaryInterval, -1),
	})
	if err != nil {
		return nil, nil, err
	}
	reg.MustRegister(scraper.StateCollector(func() []eppprobe.ScrapedPool { return scrapedPools(router.Table()) }), scraper.SummaryFetches())
	return prober, scraper, nil
}

// listen binds the sidecar's listeners: ext_proc (the shim pools' ports
// too), health and metrics.
func (s *Sidecar) listen(server ServerConfig, reg *prometheus.Registry, logger klog.Logger) error {
	extProcAddr := cmp.Or(s.cfg.ExtProcBindAddress, s.cfg.BindAddress)
	transportOpts, err := extProcTransport(s.transport, extProcAddr, s.cfg.Watch.EndpointPickerServices, reg, logger)
	if err != nil {
		return err
	}
	servers, err := extproc.Listen(extproc.ServingOptions{
		BindAddress:        s.cfg.BindAddress,
		ExtProcBindAddress: s.cfg.ExtProcBindAddress,
		GRPCPort:           s.cfg.GRPCPort,
		HealthPort:         s.cfg.HealthPort,
		MetricsPort:        s.cfg.MetricsPort,
		EnablePprof:        s.cfg.EnablePprof,
		TLS:                s.cfg.TLS,
		MetricsFilter:      s.cfg.MetricsFilter,
	}, s.server, reg, append(serverOptions(), append(transportOpts,
		// Per connection; the admission bounds the streams across them.
		grpc.MaxConcurrentStreams(uint32(min(server.MaxStreams, math.MaxUint32))))...)...)
	if err != nil {
		return err
	}
	s.servers = servers
	_, mainPort, _ := net.SplitHostPort(servers.GRPCAddr())
	port, _ := strconv.ParseInt(mainPort, 10, 32)
	// The shim pools' ports are ext_proc ports too.
	s.server.ports = newShimPorts(extProcAddr, int32(port), servers.ServeExtProc, reg, logger)
	return nil
}

// reconnectProbed follows an EPP health address that turned SERVING: the
// relay's connections to the ext_proc addresses of the clusters probed
// there retry at once, so that active probing and the relay agree that the
// EPP is back.
func reconnectProbed(router *routetable.Router, relay *relayer) func(healthAddr string) {
	return func(healthAddr string) {
		for _, c := range router.Table().Clusters() {
			if c.Health == healthAddr && c.EPP != "" {
				relay.reconnect(c.EPP)
			}
		}
	}
}

// GRPCAddr, HealthAddr and MetricsAddr are the listeners' addresses.
func (s *Sidecar) GRPCAddr() string    { return s.servers.GRPCAddr() }
func (s *Sidecar) HealthAddr() string  { return s.servers.HealthAddr() }
func (s *Sidecar) MetricsAddr() string { return s.servers.MetricsAddr() }

// Router returns the sidecar's routing table holder.
func (s *Sidecar) Router() *routetable.Router { return s.router }

// published follows a new table: reach its addresses with their
// credentials, probe and scrape its clusters, keep the connections to its
// EPPs.
func (s *Sidecar) published(t *routetable.Table, took time.Duration) {
	// First, so that no probe of a new address goes out without them.
	s.creds.SetTargets(credentialTargets(t))
	var healthTargets, metricsTargets []string
	for b := range t.Backends {
		clusters := b.Clusters
		if b.Local != nil && !b.Shim {
			clusters = append(clusters[:len(clusters):len(clusters)], b.Local)
		}
		for _, c := range clusters {
			healthTargets = append(healthTargets, c.Health)
			if b.Scoring().Needs().PoolMetrics {
				metricsTargets = append(metricsTargets, c.Metrics)
			}
		}
	}
	s.prober.SetTargets(healthTargets)
	s.scraper.SetTargets(metricsTargets)
	s.server.Retain(t)
	s.server.ports.follow(t)
	s.metrics.published(t, took)
	s.draining.follow(t)
}

// Run serves until ctx ends, then drains: the health services turn
// NOT_SERVING, the ext_proc server stops accepting streams and lets the open
// ones finish for up to DrainTimeout, then the rest stops.
func (s *Sidecar) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// The first part to fail stops the others.
	parts, ctx := extproc.NewParts(ctx)
	parts.Run("health prober", s.prober.Run)
	parts.Run("metrics scraper", s.scraper.Run)
	parts.Run("EPP credentials", s.creds.Run)
	parts.Run("routing table watcher", func(ctx context.Context) error {
		if err := s.watcher.Run(ctx); err != nil || ctx.Err() != nil {
			return err
		}
		return errors.New("stopped")
	})
	// The servers' error already names the server that failed.
	parts.Run("", func(ctx context.Context) error { return s.servers.Run(ctx, s.cfg.DrainTimeout) })
	parts.Run("shim ports", func(ctx context.Context) error {
		wait.Until(s.server.ports.retry, shimPortRetry, ctx.Done())
		s.server.ports.close()
		return nil
	})
	parts.Run("", func(ctx context.Context) error {
		// Ready once the first table is built and the credentials of its
		// EPPs are known.
		for _, synced := range []<-chan struct{}{s.watcher.Synced(), s.creds.Synced()} {
			select {
			case <-synced:
			case <-ctx.Done():
				return nil
			}
		}
		s.servers.Ready()
		t := s.router.Table()
		logger.Info("Sidecar ready", "generation", t.Generation, "rules", len(t.Rules()), "problems", len(t.Errors))
		return nil
	})
	logger.Info("Sidecar serving", "extProc", s.GRPCAddr(), "health", s.HealthAddr(), "metrics", s.MetricsAddr(),
		"localCluster", s.cfg.Watch.LocalCluster, "defaultPolicy", s.cfg.Watch.DefaultPolicy,
		"extProcTransport", s.transport, "metricsAuth", s.cfg.MetricsFilter != nil, "secretNamespaces", s.cfg.SecretNamespaces, "metricsTokenFile", s.cfg.MetricsTokenFile)
	err := parts.Wait()
	s.server.Close()
	return err
}

// credentialTargets are the addresses of t's clusters' EPPs and how each
// is reached.
func credentialTargets(t *routetable.Table) []epptransport.Target {
	var out []epptransport.Target
	for _, cl := range t.Clusters() {
		out = append(out,
			epptransport.Target{Addr: cl.EPP, Cluster: cl.Name, Pool: cl.Pool, Port: eppaddr.PortExtProc, Transport: cl.EPPTransport},
			epptransport.Target{Addr: cl.Health, Cluster: cl.Name, Pool: cl.Pool, Port: eppaddr.PortHealth, Transport: cl.HealthTransport},
			epptransport.Target{Addr: cl.Metrics, Cluster: cl.Name, Pool: cl.Pool, Port: eppaddr.PortMetrics, Transport: cl.MetricsTransport, Token: cl.MetricsToken,
				Local: cl.Local, ExternalName: cl.ExternalName})
	}
	return out
}
