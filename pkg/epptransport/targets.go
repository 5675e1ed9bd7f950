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
	// Local is true for the EPP of a local pool, ExternalName for one
	// whose Service is an ExternalName (a name its author chose, which may
	// point anywhere).
	Local, ExternalName bool
}

// InCluster is true for the EPP of a local pool reached at its Service's
// own address (cluster IP or load balancer), not at an ExternalName: with
// verified TLS, where the sidecar's own metrics token may go without an
// operator naming it.
func (t Target) InCluster() bool { return t.Local && !t.ExternalName }

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
		next := target{cluster: tg.Cluster, pool: tg.Pool, port: tg.Port, transport: pt, key: pt.Key(), token: tg.Token, local: tg.Local, externalName: tg.ExternalName}
		prev, seen := targets[addr]
		if seen && prev.transport.Key() != pt.Key() {
			conflicts[addr] = append(conflicts[addr], describe(prev.transport), describe(pt))
		}
		// TLS over plaintext; among TLS ones, the first by key.
		if !seen || (!prev.transport.TLS && pt.TLS) || (pt.TLS && pt.Key() < prev.transport.Key()) {
			if seen {
				next.local, next.externalName = next.local && prev.local, next.externalName || prev.externalName
			}
			targets[addr] = next
		} else {
			// An address that another cluster also names (an import
			// naming a local EPP's address) is local only when all say so.
			prev.local, prev.externalName = prev.local && tg.Local, prev.externalName || tg.ExternalName
			targets[addr] = prev
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
	// local and externalName: Target's, for every cluster naming the
	// address (local when all say so, externalName when one does).
	local, externalName bool
}

// TargetOf returns the target addr is, as SetTargets was given it (Local
// only when every cluster naming it said so, ExternalName when one did);
// false when addr is not an address of the table.
func (c *Credentials) TargetOf(addr string) (Target, bool) {
	if c == nil {
		return Target{}, false
	}
	c.mu.RLock()
	tg, ok := c.targets[addr]
	c.mu.RUnlock()
	if !ok {
		return Target{}, false
	}
	return Target{Addr: addr, Cluster: tg.cluster, Pool: tg.pool, Port: tg.port, Transport: tg.transport, Token: tg.token, Local: tg.local, ExternalName: tg.externalName}, true
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
