// Package epptransport is how mci-sidecar reaches each port (ext_proc,
// gRPC health, metrics) of a cluster's EPP with the transport the routing
// table resolved for it (eppaddr.PortTransport, eppaddr.ResolvePortTransport:
// plaintext, TLS unverified, TLS verified as a BackendTLSPolicy says, TLS
// with the pool's credentials Secret): Credentials reads the labelled
// Secrets and CA ConfigMaps of the namespaces it is given and turns each
// address of the routing table (SetTargets) into the TLS configuration and
// the metrics bearer token to reach it with (ForTarget, MetricsToken),
// logging and counting the failures its users report (Failed, Reached).
// The sidecar's relay, health prober and pool scraper get it through their
// constructors, and keep their connections in a Conns, one per address and
// credentials version, dialled (gRPC) with the one DialPolicy; it knows
// nothing of the routing table but the Targets it is given.
//
// Its files are its jobs: credentials.go (ForTarget), secrets.go (the
// Secrets' informers, their TLS configurations and metrics tokens),
// btls.go (BackendTLSPolicy validations), targets.go (the table's
// addresses and their transports), failures.go (unreachable addresses,
// logged on change), conns.go and dial.go (connections). The decisions it carries are described in pkg/routetable's
// documentation ("Transport to EPPs") and pkg/sidecar's ("Credentials").
package epptransport
