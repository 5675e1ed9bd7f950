package epptransport

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/status"

	"github.com/mci-dev/mci/pkg/statelog"
)

// failureLog is when the errors of an unreachable address are logged: a
// change of gRPC code at once, another error at most once a minute.
var failureLog = statelog.Rule{Interval: time.Minute}

// Failed records that addr could not be reached (a refused or reset
// connection, a failed TLS handshake, a transport of the wrong kind, no
// answer in time: the error says which). Every failure is counted in
// mci_sidecar_epp_connection_failures_total. It is logged when addr turns
// unreachable, and again when its error changes: at once when the gRPC
// code changes, else at most once a minute (a reset link alternates
// between "EOF" and "connection reset by peer" from one attempt to the
// next), the other changes at level 2.
func (c *Credentials) Failed(addr string, err error) {
	if c == nil || err == nil {
		return
	}
	c.mu.RLock()
	tg := c.targets[addr]
	c.mu.RUnlock()
	if c.failureCounter != nil {
		c.failureCounter.WithLabelValues(tg.cluster, tg.port, tg.transport.Kind()).Inc()
	}
	const msg = "EPP port unreachable with its transport: the cluster fails over or follows its failure mode, never a weaker transport"
	kv := []any{"cluster", tg.cluster, "pool", tg.pool, "port", tg.port, "address", addr, "transport", describe(tg.transport)}
	switch ch := c.failures.Observe(addr, status.Code(err).String(), err.Error()); {
	case ch.Loud():
		// Said once per change, so the look at the port that tells a
		// transport mismatch is made once per change too.
		if answered := mismatch(context.Background(), addr, tg.transport.TLS, err); answered != "" {
			err = fmt.Errorf("the EPP answered %s on a port reached with %s: make the pool's transport for this port match it: %w", answered, describe(tg.transport), err)
		}
		c.logger.Error(err, msg, kv...)
	case ch == statelog.Minor:
		// logr's Error ignores verbosity: the quiet changes are Info.
		c.logger.V(2).Info(msg, append(kv, "err", err)...)
	}
}

// Reached records that addr answered, so that its next failure is logged
// again.
func (c *Credentials) Reached(addr string) {
	if c == nil {
		return
	}
	if failed, _ := c.failures.Clear(addr); failed {
		c.logger.Info("EPP port reachable again", "address", addr)
	}
}
