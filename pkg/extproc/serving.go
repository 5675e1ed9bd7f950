package extproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strconv"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/klog/v2"
)

// ReadinessService is the gRPC health service that turns SERVING once the
// process is ready, as the Endpoint Picker protocol names it.
const ReadinessService = "readiness"

// readinessServices turn SERVING on Servers.Ready: the server as a whole,
// readiness, and the ext_proc service.
var readinessServices = []string{"", ReadinessService, extprocv3.ExternalProcessor_ServiceDesc.ServiceName}

// ServingOptions are the flags of where an ext_proc process serves: the
// ports of the Endpoint Picker convention by default, so that mci-epp and
// mci-sidecar can stand in for each other.
type ServingOptions struct {
	BindAddress string
	// ExtProcBindAddress, when set, is the address of the ext_proc port
	// instead of BindAddress (mci-sidecar keeps it on loopback).
	ExtProcBindAddress string
	GRPCPort           int
	HealthPort         int
	MetricsPort        int
	// TLS, when enabled, serves every port over TLS.
	TLS TLSOptions

	// HealthPortUsage ends the help of --grpc-health-port: which of its
	// services turn SERVING when, which only the command knows.
	HealthPortUsage string
	// MetricsFilter, when set, wraps the /metrics handler (authentication
	// and authorization of scrapers).
	MetricsFilter func(http.Handler) http.Handler
	// EnablePprof serves Go's runtime profiles (/debug/pprof/) on the
	// metrics port, behind MetricsFilter as /metrics is.
	EnablePprof bool
	// MetricsAlternatives serve /metrics in other media types than the
	// Prometheus exposition, by the type a request accepts first (mci-epp's
	// prompt prefix summary): behind the same MetricsFilter, at the URL
	// the importing clusters already scrape with its credentials.
	MetricsAlternatives map[string]http.Handler
}

// NewServingOptions returns the defaults: every address, ext_proc on 9002,
// gRPC health on 9003, metrics on 9090.
func NewServingOptions() ServingOptions {
	return ServingOptions{BindAddress: "0.0.0.0", GRPCPort: 9002, HealthPort: 9003, MetricsPort: 9090}
}

// AddFlags adds --bind-address, --grpc-port, --grpc-health-port,
// --metrics-port and the TLS flags to fs.
func (o *ServingOptions) AddFlags(fs *pflag.FlagSet) {
	healthUsage := "Port of the gRPC health service (grpc.health.v1)."
	if o.HealthPortUsage != "" {
		healthUsage = "Port of the gRPC health service (grpc.health.v1): " + o.HealthPortUsage
	}
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "IP address the ext_proc, health and metrics servers listen on.")
	fs.IntVar(&o.GRPCPort, "grpc-port", o.GRPCPort, "Port of the ext_proc gRPC service the gateway calls.")
	fs.IntVar(&o.HealthPort, "grpc-health-port", o.HealthPort, healthUsage)
	fs.IntVar(&o.MetricsPort, "metrics-port", o.MetricsPort, "Port of the Prometheus /metrics endpoint.")
	fs.BoolVar(&o.EnablePprof, "enable-pprof", o.EnablePprof, "Serve Go's runtime profiles (/debug/pprof/) on the metrics port, to the clients its metrics endpoint admits. Off by default: a goroutine dump shows what requests are being served.")
	o.TLS.AddFlags(fs)
}

// Validate checks the ports and the TLS files.
func (o *ServingOptions) Validate() error {
	var errs []error
	for _, p := range []struct {
		flag string
		port int
	}{{"--grpc-port", o.GRPCPort}, {"--grpc-health-port", o.HealthPort}, {"--metrics-port", o.MetricsPort}} {
		if p.port < 0 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("%s %d is not a port", p.flag, p.port))
		}
	}
	errs = append(errs, o.TLS.Validate()...)
	return utilerrors.NewAggregate(errs)
}

// Servers are the three servers of an ext_proc process: the ext_proc gRPC
// service, the gRPC health service (on a port of its own and on the ext_proc
// port, for gateways that health-check the cluster where they send ext_proc)
// and the Prometheus /metrics endpoint. The readiness services are
// NOT_SERVING until Ready.
type Servers struct {
	grpcLis, healthLis, metricsLis net.Listener
	grpcServer, healthGRPC         *grpc.Server
	health                         *health.Server
	httpServer                     *http.Server
}

// Listen binds the listeners of o (port 0 picks a free port) and builds the
// servers: processor on the ext_proc server, configured by grpcOpts, and
// reg's metrics on /metrics. With o.TLS every server serves TLS, whatever
// credentials grpcOpts names.
func Listen(o ServingOptions, processor extprocv3.ExternalProcessorServer, reg *prometheus.Registry, grpcOpts ...grpc.ServerOption) (_ *Servers, err error) {
	tlsConfig, err := o.TLS.ServerConfig()
	if err != nil {
		return nil, err
	}
	var healthOpts []grpc.ServerOption
	if tlsConfig != nil {
		creds := grpc.Creds(credentials.NewTLS(tlsConfig))
		grpcOpts = append(grpcOpts, creds)
		healthOpts = append(healthOpts, creds)
	}
	s := &Servers{}
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	listen := func(addr string, port int) (net.Listener, error) {
		return net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	}
	if s.grpcLis, err = listen(cmp.Or(o.ExtProcBindAddress, o.BindAddress), o.GRPCPort); err != nil {
		return nil, fmt.Errorf("ext_proc listener: %w", err)
	}
	if s.healthLis, err = listen(o.BindAddress, o.HealthPort); err != nil {
		return nil, fmt.Errorf("health listener: %w", err)
	}
	if s.metricsLis, err = listen(o.BindAddress, o.MetricsPort); err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}

	s.health = health.NewServer()
	for _, svc := range readinessServices {
		s.health.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	s.grpcServer = grpc.NewServer(append(streamServerOptions(), grpcOpts...)...)
	extprocv3.RegisterExternalProcessorServer(s.grpcServer, processor)
	healthpb.RegisterHealthServer(s.grpcServer, s.health)
	s.healthGRPC = grpc.NewServer(healthOpts...)
	healthpb.RegisterHealthServer(s.healthGRPC, s.health)

	mux := http.NewServeMux()
	var metrics http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	if len(o.MetricsAlternatives) > 0 {
		metrics = byAcceptedType(o.MetricsAlternatives, metrics)
	}
	if o.MetricsFilter != nil {
		metrics = o.MetricsFilter(metrics)
	}
	mux.Handle("/metrics", metrics)
	if o.EnablePprof {
		var profiles http.Handler = profilesMux()
		if o.MetricsFilter != nil {
			profiles = o.MetricsFilter(profiles)
		}
		mux.Handle("/debug/pprof/", profiles)
	}
	s.httpServer = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsConfig}
	return s, nil
}

// profilesMux serves net/http/pprof's handlers under /debug/pprof/.
func profilesMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// byAcceptedType serves a request with the handler of the media type its
// Accept header names first, when alternatives has one, else with
// fallback. Quality values are not weighed: a client that asks for an
// alternative names it alone.
func byAcceptedType(alternatives map[string]http.Handler, fallback http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first, _, _ := strings.Cut(r.Header.Get("Accept"), ",")
		mediaType, _, _ := strings.Cut(first, ";")
		if h, ok := alternatives[strings.TrimSpace(mediaType)]; ok {
			h.ServeHTTP(w, r)
			return
		}
		fallback.ServeHTTP(w, r)
	})
}

// streamServerOptions tune the ext_proc server for many short streams of a
// few small messages each, one per HTTP request:
//   - Stream workers run each stream on a goroutine that lives on, instead
//     of a new one per stream whose stack grows again every time.
//   - Fixed flow-control windows, large enough for any request body chunk,
//     turn off the bandwidth-delay probing, whose pings and window updates
//     would otherwise follow the data frames of every stream.
//
// The write and read buffers are gRPC's own (32 KiB, taken from a pool
// only while a connection writes or reads) on purpose: larger ones, or a
// write buffer kept by each connection, did not change the sidecar's CPU
// per request measurably, and gRPC already writes all the messages queued
// at once in one system call (docs/performance-history/data-path-2026-12.md).
func streamServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.InitialWindowSize(1 << 20),
		grpc.InitialConnWindowSize(16 << 20),
	}
}

// GRPCAddr, HealthAddr and MetricsAddr are the listeners' addresses.
func (s *Servers) GRPCAddr() string    { return s.grpcLis.Addr().String() }
func (s *Servers) HealthAddr() string  { return s.healthLis.Addr().String() }
func (s *Servers) MetricsAddr() string { return s.metricsLis.Addr().String() }

// ServeExtProc serves the ext_proc server (and gRPC health, as its main
// port does) on one more listener, with the same credentials, until the
// listener is closed or the servers stop; once they stopped, it only
// closes l.
func (s *Servers) ServeExtProc(l net.Listener) {
	go func() { _ = s.grpcServer.Serve(l) }()
}

// SetServing reports a health service SERVING until the drain.
func (s *Servers) SetServing(service string) {
	s.health.SetServingStatus(service, healthpb.HealthCheckResponse_SERVING)
}

// Ready turns the readiness services SERVING: the server as a whole
// (""), ReadinessService and the ext_proc service.
func (s *Servers) Ready() {
	for _, svc := range readinessServices {
		s.SetServing(svc)
	}
}

// Run serves until ctx ends or a server fails, then drains: the health
// services turn NOT_SERVING, the ext_proc server stops accepting streams and
// lets the open ones finish for up to drainTimeout, then the rest stops. It
// returns the failure, if a server failed.
func (s *Servers) Run(ctx context.Context, drainTimeout time.Duration) error {
	logger := klog.FromContext(ctx)
	parts, ctx := NewParts(ctx)
	parts.Run("ext_proc server", func(context.Context) error { return s.grpcServer.Serve(s.grpcLis) })
	parts.Run("health server", func(context.Context) error { return s.healthGRPC.Serve(s.healthLis) })
	parts.Run("metrics server", func(context.Context) error {
		serve := s.httpServer.Serve
		if s.httpServer.TLSConfig != nil {
			// The certificate comes from TLSConfig.
			serve = func(l net.Listener) error { return s.httpServer.ServeTLS(l, "", "") }
		}
		if err := serve(s.metricsLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})

	<-ctx.Done()
	logger.Info("Draining", "timeout", drainTimeout)
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.grpcServer.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(drainTimeout):
		logger.Info("Drain timeout; cutting the streams still open")
		s.grpcServer.Stop()
	}
	s.healthGRPC.Stop()
	shutdownCtx, shutdownCancel := context.WithTimeout(context.Background(), time.Second)
	defer shutdownCancel()
	_ = s.httpServer.Shutdown(shutdownCtx)
	return parts.Wait()
}

func (s *Servers) closeListeners() {
	for _, l := range []net.Listener{s.grpcLis, s.healthLis, s.metricsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
}
