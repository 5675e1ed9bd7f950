package eppprobe

import (
	"context"
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

// positiveOr is d, or def when d is not positive.
func positiveOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// HealthService is the gRPC health service the prober asks about: the
// ext_proc service, which upstream EPPs and mci-epp both report. An EPP that
// does not know it (NotFound) is asked about the server as a whole ("").
var HealthService = extprocv3.ExternalProcessor_ServiceDesc.ServiceName

// HealthProber keeps the gRPC health of each EPP health address: one Check
// per interval, bounded by a timeout, on a connection kept per address and
// dialled with the relay's DialPolicy. A
// failed ext_proc stream marks an EPP not serving at once (MarkFailed)
// until its next successful check, so failover does not wait for the next
// probe.
//
// Recovery does not wait for the interval either: a connection that turns
// READY (the EPP is back) is checked at once, and an address that turns
// SERVING is reported to OnServing, which makes the relay's connections to
// that EPP retry at once instead of at the end of their backoff.
type HealthProber struct {
	// poller keeps whether each address answered SERVING.
	poller  *poll.Poller[bool]
	timeout time.Duration
	creds   *epptransport.Credentials
	// conns keeps one connection per address, made anew when its
	// credentials change (the old one is closed at once: only the
	// address's own poll uses it).
	conns *epptransport.Conns[*grpc.ClientConn]
	// onServing, when set, learns of each address that turns SERVING after
	// it was not (or was not known).
	onServing func(addr string)
}

// HealthProberOptions configure a HealthProber.
type HealthProberOptions struct {
	// Interval between the checks of an address and Timeout of one check;
	// zero: DefaultHealthInterval and DefaultHealthTimeout.
	Interval, Timeout time.Duration
	// Dial is how every connection is made (the relay's policy, so that
	// both see an EPP that comes back at about the same moment); zero
	// fields: epptransport.DefaultDialPolicy.
	Dial epptransport.DialPolicy
	// Credentials say how each address is reached; nil: plaintext.
	Credentials *epptransport.Credentials
	// OnServing, when set, learns of each address that turns SERVING after
	// it was not (or was not known). It is called on the prober's
	// goroutines and must not block.
	OnServing func(addr string)
}

// NewHealthProber returns a prober with no targets.
func NewHealthProber(o HealthProberOptions) *HealthProber {
	h := &HealthProber{
		timeout:   positiveOr(o.Timeout, DefaultHealthTimeout),
		creds:     o.Credentials,
		onServing: o.OnServing,
	}
	dial := o.Dial.Options()
	h.conns = epptransport.NewConns(o.Credentials, 0, func(addr string, t *epptransport.EndpointTLS) (*grpc.ClientConn, error) {
		c, err := grpc.NewClient(addr, append(dial, grpc.WithTransportCredentials(t.GRPC))...)
		if err == nil {
			go h.checkWhenReady(addr, c)
		}
		return c, err
	}, func(c *grpc.ClientConn) { _ = c.Close() })
	h.poller = poll.New(positiveOr(o.Interval, DefaultHealthInterval), h.check)
	h.poller.Forget = h.conns.Forget
	return h
}

// Run probes until ctx ends.
func (h *HealthProber) Run(ctx context.Context) error {
	defer h.conns.Close()
	return h.poller.Run(ctx)
}

// SetTargets makes the probed addresses exactly addrs.
func (h *HealthProber) SetTargets(addrs []string) { h.poller.Set(addrs) }

// Serving says whether the EPP at addr answered SERVING to its last check
// and was not marked failed since; known is false for "" or an address not
// probed yet (not a target, or no answer yet).
func (h *HealthProber) Serving(addr string) (serving, known bool) {
	if addr == "" {
		return false, false
	}
	if v := h.poller.Get(addr); v != nil {
		return *v, true
	}
	return false, false
}

// HealthRef reads what the prober knows of one EPP without looking its
// address up (poll.Ref): see HealthProber.Refs.
type HealthRef struct{ r poll.Ref[bool] }

// Serving answers as HealthProber.Serving does for the address the Ref
// was made for, while the prober's Version is the one Refs returned.
func (r HealthRef) Serving() (serving, known bool) {
	if v := r.r.Load(); v != nil {
		return *v, true
	}
	return false, false
}

// Refs sets out[i] to the HealthRef of addrs(i) for each i below
// len(out), and returns the version of the prober's targets they read
// (Version): a reader of the same addresses at every request (the
// clusters of a backend) looks them up once a change of the targets.
func (h *HealthProber) Refs(addrs func(i int) string, out []HealthRef) (version uint64) {
	refs := make([]poll.Ref[bool], len(out))
	version = h.poller.Refs(addrs, refs)
	for i, r := range refs {
		out[i] = HealthRef{r: r}
	}
	return version
}

// Version changes whenever the probed addresses do (SetTargets).
func (h *HealthProber) Version() uint64 { return h.poller.Version() }

var notServing = false

// MarkFailed records that the EPP at health address addr just failed: it is
// not serving until its next successful check.
func (h *HealthProber) MarkFailed(addr string) {
	if addr != "" {
		h.poller.Put(addr, &notServing)
	}
}

// checkWhenReady checks addr at once each time its connection turns READY
// (the EPP came back, or a first connection was made), rather than at the
// end of the interval. A connection that was lost goes IDLE and would wait
// for the next check to dial again: it is made to reconnect at once, and
// so keeps trying with the dial options' backoff while the EPP is down. It
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

func (h *HealthProber) check(ctx context.Context, addr string) (*bool, error) {
	result := false
	conn, err := h.conns.Get(addr)
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
	// An EPP that cannot be reached (refused, reset) or does not answer in
	// time (a blackholed or slow link, on which the connection may never
	// fail) is logged once per change and counted; it is then not serving.
	if code := status.Code(err); code == codes.Unavailable || code == codes.DeadlineExceeded {
		h.creds.Failed(addr, err)
	} else if err == nil {
		h.creds.Reached(addr)
	}
	if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
		result = true
		if prev := h.poller.Get(addr); (prev == nil || !*prev) && h.onServing != nil {
			h.onServing(addr)
		}
	}
	return &result, nil
}
