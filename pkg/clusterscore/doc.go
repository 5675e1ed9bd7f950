// Package clusterscore chooses the cluster of a request among the clusters
// of a backend, and the failover order after it: a pure pipeline (no I/O,
// no clock of its own) of filters, weighted scorers and a picker, whose
// configuration is named or written in an annotation.
//
// A pick, for one request over a backend's candidates (Candidate: name,
// weight, health, pool metrics, readiness, model availability):
//
//  1. Filters drop the candidates that cannot take the request (EPP not
//     serving, Ready False or no ready pod, weight 0, model not served) and
//     put the others in tiers: saturated candidates last, and for the
//     pickers of old, unknown health after serving, unmeasured after
//     measured with capacity. A sheddable request never goes to a saturated
//     candidate: it is shed (ErrShed) when only saturated ones remain.
//  2. Scorers score each remaining candidate in [0, 1]; a candidate's total
//     is the weighted sum of its scores.
//  3. The picker orders the candidates: tier first, then by total, and
//     chooses the first of the first tier: the highest total, ties broken
//     at random (max-score), or the better of two drawn at random
//     (two-choices), or by smooth weighted round-robin (round-robin), or by
//     the filter chain of pkg/scheduling (chain). The rest of the order is
//     where the request fails over to.
//
// The sidecar's four policies are named configurations of it and behave
// as before (legacy_test.go restates their tests):
//
//	Weighted      filters weight, model;                        pick round-robin
//	HealthBased   filters health, weight, model;                pick round-robin
//	LocalFirst    HealthBased, then the local pool first;       pick round-robin
//	MetricsBased  filters health, ready, weight, model, saturation; in-flight=1;
//	              pick chain
//	PrefixAffinity the default filters; prefix-cache=3, session=2, in-flight=1,
//	              latency=1, errors=1, queue=1, kv-cache=1;     pick max-score;
//	              affinity margin 1 request per ready pod; queue margin 1
//	              waiting request per server; home bound 2
//	HubReference  the default filters; prefix-cache=3, queue=2, kv-cache=2;
//	              pick max-score; no affinity margin (the llm-d hub's weights)
//
// With a home bound (PrefixAffinity), a request with a prompt goes first to
// its home cluster, derived from its leading prompt blocks alike on every
// replica (rendezvous hashing, the prefixes that repeat dealt in equal
// shares by Homes), while the home's load stays within the bound and its
// queue within the queue margin, and beyond the bound while its servers
// show no wait to save (leaving costs a cold prefill elsewhere); else to
// its second home or the best scored candidate within the bound. A
// prompt new to the sidecar is dealt in turn among the clusters where
// the fewest wait. decideHome is that rule as one
// table, and its HomeOutcome is what the explanation, the sidecar's log
// and its metrics say.
//
// A configuration (routingpolicy.Config) and its syntax are
// pkg/routingpolicy's: a name, or "prefix-cache=3,in-flight=1" with
// optional "pick=two-choices", "filters=health+saturation",
// "affinity-margin=2", "queue-margin=2" and "home-bound=2". New compiles
// one into a Pipeline, whose Needs say what a pick reads.
//
// Prompt blocks and the bounded prefix index are pkg/promptprefix's, which
// mci-epp shares. The decisions behind them and this package's (home
// placement with bounded loads, affinity that yields to load, sessions,
// observations, no herding) are in docs/design/cluster-scoring.md.
//
// Concurrency: a Pipeline is immutable; Memory, Rotation and their parts
// are safe for concurrent use, so picks run from every ext_proc stream at
// once.
package clusterscore
