package epptransport

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/eppaddr"
)

// Target is one address of a cluster's EPP (its ext_proc, health or
// metrics port) and how it is reached.
type Target struct {
	// Addr is the address as it is dialled ("host:port") or scraped (the
	// metrics URL); "" is none.
	Addr string
	// Cluster names the cluster, Pool the pool (namespace/name), Port the
	// port (eppaddr.PortExtProc, PortHealth or PortMetrics), for logs and
	// metrics.
	Cluster, Pool, Port string
	Transport           eppaddr.PortTransport
	// Token, for a metrics URL, is the Secret whose token its scrapes
	// send (TokenSecretKey); none: the token of the Secret of Transport,
	// else the scraper's own.
	Token types.NamespacedName
}

// SetTargets makes the addresses of the routing table's clusters reached
// with their transports, and forgets Secrets no longer named. An address that clusters
// name with different transports (pools sharing one EPP but not their
// annotations) is reached with the first TLS one rather than plaintext,
// and the problem is logged. Each address's transport is logged when it
// changes and exposed as mci_sidecar_epp_transport.
func (c *Credentials) SetTargets(list []Target) {
	if c == nil {
		return
	}
	targets := map[string]target{}
	conflicts := map[string][]string{}
	for _, tg := range list {
		addr, pt := tg.Addr, tg.Transport
		if addr == "" {
			continue
		}
		next := target{cluster: tg.Cluster, pool: tg.Pool, port: tg.Port, transport: pt, key: pt.Key(), token: tg.Token}
		prev, seen := targets[addr]
		if seen && prev.transport.Key() != pt.Key() {
			conflicts[addr] = append(conflicts[addr], describe(prev.transport), describe(pt))
		}
		// TLS over plaintext; among TLS ones, the first by key.
		if !seen || (!prev.transport.TLS && pt.TLS) || (pt.TLS && pt.Key() < prev.transport.Key()) {
			targets[addr] = next
		}
	}
	inUse := map[types.NamespacedName]bool{}
	for _, tg := range targets {
		if tg.transport.TLS && tg.transport.Secret.Name != "" {
			inUse[tg.transport.Secret] = true
		}
	}

	c.mu.Lock()
	prevTargets := c.targets
	c.targets = targets
	for ref := range c.loaded {
		if !inUse[ref] {
			delete(c.loaded, ref)
		}
	}
	report := describeConflicts(conflicts)
	changed := report != c.conflicts
	c.conflicts = report
	c.mu.Unlock()
	c.failures.Retain(func(addr string) bool { _, ok := targets[addr]; return ok })
	if changed && report != "" {
		c.logger.Info("Addresses are named with different transports by different clusters; each is reached with TLS", "conflicts", report)
	}
	c.reportTransports(prevTargets, targets)
	if c.isSynced() {
		for ref := range inUse {
			_, _ = c.resolve(ref)
		}
	}
}

// target is an address of the table: the cluster, pool and port it is
// of, and how it is reached.
type target struct {
	cluster, pool, port string
	transport           eppaddr.PortTransport
	// key is transport.Key(), computed once rather than per request.
	key string
	// token is the Secret of the bearer token of a metrics URL.
	token types.NamespacedName
}

// describe names a transport for the logs.
func describe(p eppaddr.PortTransport) string {
	switch p.Kind() {
	case eppaddr.TransportKindSecret:
		return "TLS with Secret " + p.Secret.String()
	case eppaddr.TransportKindVerified:
		return "TLS verified by BackendTLSPolicy " + p.Namespace + "/" + p.Validation.PolicyName
	}
	return p.Kind()
}

// reportTransports logs each address whose transport is new or changed,
// and sets mci_sidecar_epp_transport.
func (c *Credentials) reportTransports(prev, next map[string]target) {
	for addr, tg := range next {
		if p, ok := prev[addr]; ok && p.transport.Key() == tg.transport.Key() && p.cluster == tg.cluster && p.pool == tg.pool {
			continue
		}
		kv := []any{"cluster", tg.cluster, "pool", tg.pool, "port", tg.port, "address", addr, "transport", describe(tg.transport)}
		if tg.transport.Kind() == eppaddr.TransportKindUnverified {
			// Asked for (a TLS mode with no Secret and no BackendTLSPolicy
			// to verify with), as gateways reach an EPP's self-signed
			// certificate; said once, so that nobody takes it for verified.
			c.logger.Info("EPP port reached with TLS whose certificate is not verified: add a BackendTLSPolicy for its Service (or the pool's credentials Secret) to verify it", kv...)
			continue
		}
		c.logger.Info("EPP port transport", kv...)
	}
	if c.transportGauge == nil {
		return
	}
	c.transportGauge.Reset()
	for _, tg := range next {
		c.transportGauge.WithLabelValues(tg.cluster, tg.pool, tg.port, tg.transport.Kind()).Set(1)
	}
}

func describeConflicts(conflicts map[string][]string) string {
	var out []string
	for target, refs := range conflicts {
		refs = slices.Compact(slices.Sorted(slices.Values(refs)))
		out = append(out, target+": "+strings.Join(refs, ", "))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}
