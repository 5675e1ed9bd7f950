// Package eppprobe keeps what mci-sidecar knows of each EPP it routes to,
// learned actively rather than from requests:
//
//   - HealthProber checks each EPP's gRPC health address once per interval
//     (the ext_proc service, else the server as a whole) on a connection
//     kept per address, checks at once when that connection turns READY,
//     and reports each address that turns SERVING (OnServing) so that the
//     relay's connections retry at once. MarkFailed records a failed
//     ext_proc stream until the next good check.
//   - PoolScraper reads each EPP's /metrics page for the pool gauges
//     (metrics.ParsePool, behind metrics.LimitReader), sending the bearer
//     token of the cluster's credentials Secret, else of a token file, and
//     classifies each scrape (fresh, stale, unauthorized, unreachable,
//     unparseable): the gauge mci_sidecar_epp_metrics_state
//     (StateCollector) and one log line per change of outcome.
//
// Both poll on a pkg/poll Poller and reach each address as the
// epptransport.Credentials given to their constructor say (nil:
// plaintext). They know addresses and URLs only: which cluster and pool an
// address belongs to, and what a policy makes of it, is the sidecar's.
package eppprobe
