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
//	              affinity margin 1 request per ready pod
//
// The annotation syntax is Parse's: a name, or "prefix-cache=3,in-flight=1"
// with optional "pick=two-choices", "filters=health+saturation" and
// "affinity-margin=2".
//
// Decisions where the issue is silent:
//
//   - Tokens. The sidecar does not know the model's tokenizer, so a prompt
//     block is 64 bytes of the JSON text of the prompt (16 tokens at ~4
//     bytes a token, vLLM's block size), read from a completions prompt or
//     the role and text of each chat message. A block's hash covers the
//     hash before it, the first one the scope (the pool), so one hash
//     stands for a whole prefix, and the index needs no tree. Only full
//     blocks count, and at most 512 (32 KiB of prompt).
//   - The prefix index is approximate and bounded: a set-associative table
//     of block hashes, each with the four clusters that served it most
//     recently, allocated once at its capacity (32 bytes a block: 3.05 MiB
//     per 100,000 prefixes) and never grown; a new block pushes out the one
//     of its set recorded least recently. The score is the share of the
//     request's blocks in the candidate's longest cached prefix. The index
//     learns from the cluster that actually served (Memory.Served), not
//     from the pick, so a failover does not teach it wrong. It is per
//     sidecar: each gateway replica learns from its own traffic.
//   - Affinity yields to load by one rule: the prefix-cache and session
//     scores count only among the candidates whose load is within the
//     configuration's affinity margin (PrefixAffinity: 1 request per
//     ready pod; "affinity-margin=<n>|off") of the least loaded
//     candidate's; the others score 0 on them and compete on load alone
//     (yieldAffinity). A candidate's load is the one the chain picker
//     ranks MetricsBased by: its scraped average queue plus this
//     sidecar's requests in flight to it per ready pod. The in-flight
//     part moves with every request, so a cluster whose servers are
//     taken by traffic the sidecar does not see loses its affinity after
//     a few requests wait there (3 for 2 pods at equal scraped queues),
//     not a scrape or a saturation threshold later; below the margin, a
//     whole shared prompt (3 at weight 3) still outweighs the load
//     scorers (in-flight, queue, KV cache, at most 1 each), so a
//     conversation stays where its cache is while that costs it at most
//     about one request per pod of waiting. Above all this, a saturated
//     cluster (its fresh pool metrics above the sheddable thresholds) is
//     in the last tier whatever its affinity, and a sheddable request
//     never goes there.
//   - Sessions are a header (or a cookie) value, scoped per pool, pinned to
//     the cluster that last served them for a TTL after their last request
//     (10 minutes by default) in a bounded table (100,000; least recently
//     pinned first out). A pinned cluster that is not serving or is
//     saturated is not chosen (filters, tiers); the session then moves to
//     the cluster that serves it.
//   - Observations are the sidecar's own (requests in flight, moving
//     averages of time to first byte and of errors), never the metrics a
//     remote cluster reports about itself. A cluster not measured yet
//     scores as the fastest, so that it gets measured; scores are relative
//     to the best candidate (latency: fastest/own; in flight: (least+1) /
//     (own+1)), so that they mean the same at any load.
//   - Pool metrics scores are absolute: queue 1/(1+queue/q0), q0 the
//     sheddable queue threshold, and 1 - KV cache utilization; an
//     unmeasured cluster scores 0.5 (unknown load is neither idle nor full).
//   - No herding. Pool metrics change once a scrape; the in-flight counts
//     change with every request, and equal totals are broken at random, so
//     requests between two scrapes spread (TestNoHerdingBetweenScrapes).
//     The chain picker, with the in-flight scorer configured (MetricsBased
//     has it), ranks measured candidates by the scraped queue plus the
//     requests in flight per ready pod, for the same reason; the tiers
//     stay the scraped metrics' alone. MetricsBased of old ranked by the
//     scraped queue alone and sent every request between two scrapes to
//     the same cluster.
//   - Weight 0 takes a cluster out of every configuration. MetricsBased of
//     old tried measured clusters of weight 0 (only its round-robin over
//     unmeasured ones skipped them); the annotation documents weight 0 as
//     "out of rotation", which is now what it does everywhere.
//   - Explanations (Explanation) are filled only when the caller passes
//     one; without, a pick over up to 16 candidates into a reused order
//     does not allocate (but for the chain picker, whose filter chain
//     takes its input on the heap).
//
// Concurrency: a Pipeline is immutable; Memory, Rotation and their parts
// are safe for concurrent use, so picks run from every ext_proc stream at
// once.
package clusterscore
