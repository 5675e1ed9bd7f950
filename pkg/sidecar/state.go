package sidecar

import (
	"context"
	"strings"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/poll"
)

// Defaults of the health prober and the metrics scraper.
const (
	DefaultHealthInterval = time.Second
	DefaultHealthTimeout  = 500 * time.Millisecond
	DefaultScrapeInterval = time.Second
	DefaultScrapeTimeout  = 500 * time.Millisecond
)

// HealthService is the gRPC health service the prober asks about: the
// ext_proc service, which upstream EPPs and mci-epp both report. An EPP that
// does not know it (NotFound) is asked about the server as a whole ("").
var HealthService = extprocv3.ExternalProcessor_ServiceDesc.ServiceName

// HealthProber keeps the gRPC health of each EPP health address: one Check
// per interval, bounded by a timeout, on a connection kept per address and
// dialled with the relay's DialPolicy. A failed ext_proc stream marks an
// EPP NotServing at once (MarkFailed) until its next successful check, so
// failover does not wait for the next probe.
//
// Recovery does not wait for the interval either: a connection that turns
// READY (the EPP is back) is checked at once, and an address that turns
// SERVING is reported to OnServing, which makes the relay's connections to
// that EPP retry at once instead of at the end of their backoff.
type HealthProber struct {
	poller  *poll.Poller[Health]
	timeout time.Duration
	dial    []grpc.DialOption
	// creds say how each address is reached; nil: plaintext.
	creds *epptransport.Credentials
	// onServing, when set, learns of each address that turns SERVING after
	// it was not (or was not known). Set before Run.
	onServing func(addr string)

	mu    sync.Mutex
	conns map[string]probeConn
}

// probeConn is a connection to a health address and the version of the
// credentials it was made with.
type probeConn struct {
	version string
	conn    *grpc.ClientConn
}

// NewHealthProber returns a prober with no targets that dials with dial.
// Zero durations take the defaults.
func NewHealthProber(interval, timeout time.Duration, dial DialPolicy) *HealthProber {
	h := &HealthProber{timeout: timeout, dial: dial.options(), conns: map[string]probeConn{}}
	if interval <= 0 {
		interval = DefaultHealthInterval
	}
	if h.timeout <= 0 {
		h.timeout = DefaultHealthTimeout
	}
	h.poller = poll.New(interval, h.check)
	h.poller.Forget = h.closeConn
	return h
}

// Run probes until ctx ends.
func (h *HealthProber) Run(ctx context.Context) error {
	err := h.poller.Run(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	for addr, c := range h.conns {
		_ = c.conn.Close()
		delete(h.conns, addr)
	}
	return err
}

// SetTargets makes the probed addresses exactly addrs.
func (h *HealthProber) SetTargets(addrs []string) { h.poller.Set(addrs) }

// Health returns what is known of addr; HealthUnknown for "" or an address
// not probed yet.
func (h *HealthProber) Health(addr string) Health {
	if addr == "" {
		return HealthUnknown
	}
	if v := h.poller.Get(addr); v != nil {
		return *v
	}
	return HealthUnknown
}

var notServing = HealthNotServing

// MarkFailed records that the EPP at health address addr just failed.
func (h *HealthProber) MarkFailed(addr string) {
	if addr != "" {
		h.poller.Put(addr, &notServing)
	}
}

// conn returns the connection to addr with its current credentials; one
// made with other ones is closed (only addr's own poll uses it).
func (h *HealthProber) conn(addr string) (*grpc.ClientConn, error) {
	t, err := h.creds.ForTarget(addr)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.conns[addr]
	if old.conn != nil && old.version == t.Version {
		return old.conn, nil
	}
	if old.conn != nil {
		_ = old.conn.Close()
		delete(h.conns, addr)
	}
	c, err := grpc.NewClient(addr, append(h.dial, grpc.WithTransportCredentials(t.GRPC))...)
	if err != nil {
		return nil, err
	}
	h.conns[addr] = probeConn{version: t.Version, conn: c}
	go h.checkWhenReady(addr, c)
	return c, nil
}

// checkWhenReady checks addr at once each time its connection turns READY
// (the EPP came back, or a first connection was made), rather than at the
// end of the interval. A connection that was lost goes IDLE and would wait
// for the next check to dial again: it is made to reconnect at once, and
// so keeps trying with the DialPolicy's backoff while the EPP is down. It
// ends with the connection.
func (h *HealthProber) checkWhenReady(addr string, c *grpc.ClientConn) {
	for {
		s := c.GetState()
		switch s {
		case connectivity.Shutdown:
			return
		case connectivity.Idle:
			c.Connect()
		case connectivity.Ready:
			h.poller.Poke(addr)
		}
		if !c.WaitForStateChange(context.Background(), s) {
			return
		}
	}
}

func (h *HealthProber) closeConn(addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[addr]; c.conn != nil {
		_ = c.conn.Close()
		delete(h.conns, addr)
	}
}

func (h *HealthProber) check(ctx context.Context, addr string) (*Health, error) {
	result := HealthNotServing
	conn, err := h.conn(addr)
	if err != nil {
		h.creds.Failed(addr, err)
		return &result, nil
	}
	client := healthpb.NewHealthClient(conn)
	ask := func(service string) (*healthpb.HealthCheckResponse, error) {
		ctx, cancel := context.WithTimeout(ctx, h.timeout)
		defer cancel()
		return client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	}
	resp, err := ask(HealthService)
	if status.Code(err) == codes.NotFound {
		resp, err = ask("")
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if status.Code(err) == codes.Unavailable {
		h.creds.Failed(addr, err)
	} else if err == nil {
		h.creds.Reached(addr)
	}
	if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
		result = HealthServing
		if prev := h.poller.Get(addr); (prev == nil || *prev != HealthServing) && h.onServing != nil {
			h.onServing(addr)
		}
	}
	return &result, nil
}

// liveState is the State of the running sidecar.
type liveState struct {
	health  *HealthProber
	metrics *PoolScraper
}

func (s liveState) Health(c *Cluster) Health {
	if s.health == nil {
		return HealthUnknown
	}
	return s.health.Health(c.Health)
}

func (s liveState) PoolMetrics(c *Cluster) *PoolMetrics {
	if s.metrics == nil {
		return nil
	}
	_, pool, _ := strings.Cut(c.Pool, "/")
	return s.metrics.Get(c.Metrics, pool)
}

// Failed marks the cluster's EPP NotServing until its next good probe.
func (s liveState) Failed(c *Cluster) {
	if s.health != nil {
		s.health.MarkFailed(c.Health)
	}
}
