package epptransport

import (
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/mci-dev/mci/pkg/extproc"
)

// Defaults of DialPolicy.
const (
	DefaultReconnectBaseDelay = 100 * time.Millisecond
	DefaultReconnectMaxDelay  = time.Second
	DefaultMinConnectTimeout  = time.Second
)

// DialPolicy is how the sidecar connects to EPPs: the ext_proc relay and the
// health prober dial with the same one, so that both see an EPP that comes
// back at about the same moment. The caller adds the transport credentials
// that Credentials gives each address.
//
// gRPC's default reconnect backoff grows to 120 s: after a long outage, a
// connection would wait up to two minutes before it tries the EPP again.
// A short maximum keeps that wait under about MaxDelay*(1+jitter) whatever
// the length of the outage, for the price of one TCP connect per MaxDelay
// to an EPP that stays down.
type DialPolicy struct {
	// BaseDelay is the pause after the first failed connection attempt;
	// each next one grows by 1.6 up to MaxDelay (with 20% jitter).
	BaseDelay, MaxDelay time.Duration
	// MinConnectTimeout bounds one connection attempt.
	MinConnectTimeout time.Duration
}

// DefaultDialPolicy reconnects after 100 ms, then at most every second.
func DefaultDialPolicy() DialPolicy {
	return DialPolicy{BaseDelay: DefaultReconnectBaseDelay, MaxDelay: DefaultReconnectMaxDelay, MinConnectTimeout: DefaultMinConnectTimeout}
}

// withDefaults fills zero fields with the defaults.
func (p DialPolicy) withDefaults() DialPolicy {
	d := DefaultDialPolicy()
	if p.BaseDelay <= 0 {
		p.BaseDelay = d.BaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = d.MaxDelay
	}
	if p.MinConnectTimeout <= 0 {
		p.MinConnectTimeout = d.MinConnectTimeout
	}
	p.BaseDelay = min(p.BaseDelay, p.MaxDelay)
	return p
}

// Options are the dial options of every connection to an EPP: the
// reconnect backoff, and the fixed flow-control windows of
// extproc.StreamDialOptions, as the EPP's server has them (harmless on a
// health connection). The caller adds the transport credentials.
func (p DialPolicy) Options() []grpc.DialOption {
	p = p.withDefaults()
	return slices.Clip(append([]grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: p.BaseDelay, Multiplier: 1.6, Jitter: 0.2, MaxDelay: p.MaxDelay},
			MinConnectTimeout: p.MinConnectTimeout,
		}),
	}, extproc.StreamDialOptions()...))
}
