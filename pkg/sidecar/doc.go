// Package sidecar is mci-sidecar's routing core: an Envoy ext_proc server
// that runs next to an Inference Gateway and makes each request land on a
// model server of the right cluster of the ClusterSet.
//
// The parts, from the cluster's objects to a request's answer:
//
//   - Watcher queues the keys of changed objects from informers in a
//     client-go workqueue and feeds them, on a single goroutine, to a
//     routetable.Incremental, which turns them into an immutable
//     routing table (pkg/routetable: HTTPRoute matching, backendRef
//     weights, HTTPRoute filters, Gateway API attachment, the EPP shim's
//     pools, the cluster policy each backend names); a
//     routetable.Router publishes it and requests read it with one atomic
//     load. The server renders what the table's filters do as ext_proc
//     header mutations and redirects (filters.go).
//   - When an informer cannot list or watch its resource (the aggregated
//     API of InferencePoolImports unavailable because no mci-apiserver
//     replica of the cluster answers, the kube-apiserver unreachable, RBAC
//     missing), client-go retries with backoff and its cache keeps what it
//     last read, so the sidecar keeps routing on the last table built from
//     it. pkg/informerhealth builds every informer of the Watcher and says
//     so: one log line per change (lost, with the error; back, with how
//     long it was lost; another error while lost at most once a minute),
//     mci_sidecar_watch_reachable{resource} (1/0) and
//     mci_sidecar_watch_failures_total{resource}.
//   - A ClusterPolicy orders the backend's clusters: a compiled
//     configuration of the cluster scoring pipeline of pkg/clusterscore
//     (filters, weighted scorers, a picker), named (Weighted, HealthBased,
//     MetricsBased, LocalFirst, PrefixAffinity) or written inline in the
//     annotation ("prefix-cache=3,in-flight=1,pick=two-choices"). PolicySet
//     compiles each value once and keeps it while a table names it. A
//     policy's Needs say whether the server parses the request's
//     criticality or prompt, reads its session key, observes its attempts,
//     and whether the sidecar scrapes the clusters' pool metrics, so that
//     neither knows a policy by name. The annotation that chooses it is
//     read in one place (pkg/routetable's builder.policyOf).
//   - pkg/eppprobe's HealthProber and PoolScraper poll each EPP's health
//     and metrics port on a pkg/poll Poller; the pool metrics are read
//     through metrics.LimitReader and metrics.ParsePool, the guarded, fuzzed
//     parser. New makes the parts in the order they depend on each other:
//     the credentials; the relay, which reaches EPPs with them; the prober,
//     which reaches them alike and makes the relay retry an EPP that turns
//     SERVING; the scraper; the server, which sees prober and scraper
//     through Clusters only (State for its policies, FailureRecorder for
//     passive health).
//   - Server serves each request stream as a short list of named steps
//     (Process): read the request whole; decide (decide.go: a pure
//     function of the table, the request and the clusters' State — the
//     rule, the backendRef, the clusters in order, what FailOpen adds, or
//     the sidecar's own answer); deliver (deliver.go: the attempts in turn,
//     relaying the request to the first cluster's EPP (EndpointMode) and
//     returning its answer to the gateway, trying the next cluster when an
//     EPP fails before answering; or a remote parent gateway as the
//     destination (ParentMode); then FailOpen or FailClose); send the
//     answer; then see the response phase through (relayed to the EPP that
//     answered, response.go). One tracker per request (tracker.go) is the
//     only place that tells the observers what became of it: the policies'
//     memory and observations, passive health, the metrics and the logs.
//     Each address is reached with the transport and credentials
//     pkg/epptransport resolves for it; the criticality of a request comes
//     from pkg/requestmodel, which the reference EPP shares, so the sidecar
//     does not link the EPP.
//   - Sidecar runs all of it in an errgroup (extproc.Parts, as the EPP
//     runs its own): the first part to fail stops the others.
//
// Decisions where the proposal and the API are silent (those of the
// routing table itself, such as which annotation chooses a policy, are
// in pkg/routetable):
//
//   - What the policies learn (one clusterscore.Memory per sidecar,
//     scoped by the backend's namespace/name, so a pool and its import
//     share it). The prompt's blocks are read from the buffered body only
//     for policies with the prefix-cache scorer; a body whose prompt
//     cannot be read is routed without prefix affinity, counted in
//     mci_sidecar_unparseable_prompts_total and logged once per backend
//     and change of the reason (a body without a prompt is not counted).
//     The session key is --session-header's value, else
//     --session-cookie's (no sessions by default: no header is a standard
//     across clients). Memory.Served runs with the cluster whose EPP
//     answered (after a failover, not the first of the order), as soon as
//     it answered: a request that shares the prefix and comes before the
//     response ends follows it. The sidecar's observations, for policies
//     with the in-flight, latency or errors scorers (MetricsBased
//     included): every attempt is Started; one that fails, or whose EPP
//     refuses (429, 5xx), is Finished as failed at once; the one that
//     routed is Finished when the gateway's stream ends, failed when its
//     response status is 5xx or the stream failed. Its first byte is the
//     response headers coming back through the response phase (in both
//     --epp-response-phase modes), or, when the gateway sends no response
//     phase, the EPP's answer (the remote round trip alone). Observations
//     of clusters and pools a new table no longer has are dropped
//     (Observer.Retain).
//   - Explanations. With --explain-decisions every response carries
//     x-mci-cluster-scores, the decision's clusterscore.Explanation on one
//     line (per cluster: verdict, tier, each score, total); it is added to
//     the response headers of the response phase, so a gateway that does
//     not send that phase to the sidecar gets no header. At log level 4
//     every decision is logged with it whatever the flag says.
//   - Eligibility. A cluster whose per-cluster Ready condition is False is
//     never chosen (Unknown or absent is eligible), but for reason
//     ClusterUnreachable: mci-apiserver cannot reach that member, and the
//     entry is its last known one, while its EPP may well answer (a
//     control-plane partition is not a data-plane one). Such a cluster is
//     stale: it passes the same filters as any other and comes after every
//     cluster that is not stale, so it takes requests only when none of
//     those can (the table reports it once, reason ClusterUnreachable, in
//     the log and mci_sidecar_routing_table_errors). HealthBased prefers
//     clusters whose EPP answered SERVING, then clusters of unknown health
//     (not probed yet, or no health port), and skips the others. A failed
//     ext_proc stream marks the EPP NotServing at once, until its next good
//     probe.
//   - MetricsBased reads the pool gauges of the EPP's metrics port under
//     either upstream naming scheme (metrics.ParsePool): the Gateway API
//     Inference Extension's inference_pool_average_queue_size,
//     inference_pool_average_kv_cache_utilization and
//     inference_pool_ready_pods, or the llm-d router's
//     llm_d_epp_average_queue_size, llm_d_epp_average_kv_cache_utilization
//     and llm_d_epp_ready_endpoints, series labelled name=<pool>. It runs
//     pkg/scheduling with one candidate per cluster; a cluster whose fresh
//     ready pods gauge is 0 is skipped. The queue the filter chain ranks
//     by is the scraped average plus this sidecar's own requests in flight
//     to the cluster per ready pod: scrapes come once a second, requests
//     between two of them would otherwise all go to the cluster least
//     loaded at the last one (herding).
//   - Unknown load is not zero load. A cluster is measured only while its
//     gauges are fresh (younger than --metrics-staleness-threshold); one
//     whose EPP refuses the token (401/403), cannot be reached, serves no
//     parseable gauges for the pool, or has not been read yet is
//     unmeasured. MetricsBased tries measured clusters with capacity
//     first (filter chain order), then the unmeasured ones (HealthBased
//     order: weighted round-robin among serving ones, then unknown
//     health), then the measured saturated ones (critical and standard
//     requests only). So an unmeasured cluster never takes traffic from a
//     cluster known to have room, nor is it starved behind clusters known
//     to be full. A sheddable request (criticality as the EPP decides it:
//     the InferenceObjective the request names in
//     x-gateway-inference-objective, priority below 0, else the
//     InferenceModel of its model; of the backend's namespace and whose
//     poolRef names it) gets 429 only when every cluster left is measured
//     and saturated.
//   - Metrics behind authentication. Upstream EPPs serve /metrics to bearer
//     tokens only by default. Each scrape sends the `token` key of the
//     cluster's credentials Secret (the Secret of TLS to EPPs, below) when
//     it has one, else the token of --epp-metrics-token-file (the pod's
//     ServiceAccount token by default, re-read as the kubelet rotates it
//     and at once after a 401), else none. Each cluster's metrics state
//     (fresh, stale, unauthorized, unreachable, unparseable) is the gauge
//     mci_sidecar_epp_metrics_state{cluster,pool,state} (one-hot), and
//     each EPP metrics URL logs one line per change of its scrapes'
//     outcome, never one per scrape.
//   - LocalFirst applies to InferencePoolImport backendRefs: the local
//     InferencePool of the same namespace/name comes first while its EPP is
//     not known to be failing, then the remote clusters (HealthBased).
//   - Failure mode. An InferencePool backendRef uses its pool's
//     endpointPickerRef.failureMode. An import has none: it takes
//     mci.x-k8s.io/failure-mode from the route, else the failure mode of
//     the local InferencePool of the same namespace/name, else FailClose
//     (the API's default). In both modes the clusters of the policy's order
//     are tried in turn: an EPP that fails, times out, or answers 503 (its
//     pool has no endpoint) is followed by the next cluster. When none
//     takes the request, FailClose answers 503 (the last EPP's own 503 when
//     there is one). FailOpen has no endpoint list to fall back on — the
//     sidecar never sees remote model servers, only their EPPs — so it goes
//     on with the clusters the policy left out (health may be stale), and
//     then lets the request continue unchanged with no destination: the
//     gateway does what it does for a pool whose EPP is down (for a local
//     pool, its own load balancing over the pool's endpoints, which is
//     FailOpen's meaning in one cluster; for a remote pool it has nothing
//     and answers 503 itself). Pointing the gateway at an EPP's address, or
//     at a parent the import does not list, would be wrong, not open.
//   - Gateway API errors: no matching rule answers 404; a backendRef of
//     another kind, or to a missing object, answers 500 for its share of
//     the weight, as Gateway API requires; a backend with no available
//     cluster answers 503. HTTPRoute filters are not applied (reported).
//   - The response phase (EndpointMode). The stream of the EPP that picked
//     the endpoint stays open: the sidecar relays the gateway's response
//     headers, body (in whatever mode the gateway sends it) and trailers,
//     with their metadata_context (the served report
//     x-gateway-destination-endpoint-served of the EPP protocol), to that
//     EPP and its answers back, message by message, as if the gateway
//     talked to it; so the EPP counts the request in flight until its
//     response ends, and sees its usage. Only the EPP that answered the
//     request phase sees it: the streams of EPPs that failed or refused
//     (503) were reset before the next cluster was tried, and the next
//     EPP got the whole request again. The EPP's mode_override answers go
//     to the gateway like any answer; the sidecar follows the response body
//     mode the gateway announced (protocol_config), changed by an override
//     only where Envoy honours one (no FULL_DUPLEX_STREAMED body mode). A
//     gateway that ends the stream early (its client went away) resets the
//     EPP's stream with it. An EPP that fails in the response phase, does
//     not answer a response message within the attempt timeout (a
//     FULL_DUPLEX_STREAMED body is waited for only once the gateway's body
//     has ended: an EPP may hold it to read the usage at its end), or ends
//     its stream with answers owed, does not fail a response already
//     served: the sidecar answers what it owed (the headers, the body
//     bytes it did not stream back, the trailers) and the rest of the
//     response phase itself, unchanged; it logs it (once a minute per
//     cluster at level 0), counts it in mci_sidecar_epp_response_phase_total
//     (outcome failed, timeout or ended), and a failure or timeout counts
//     against the EPP's health like a failed request. An immediate response
//     of the EPP in the response phase goes to the gateway. A connection to
//     an EPP that left the routing table, or whose credentials changed, is
//     closed after a grace period (twice the attempt timeout plus 5s): a
//     response phase still open on it then ends as failed, is answered by
//     the sidecar, and does not count against the EPP's health.
//     The sidecar decodes each message of the response phase (to know what
//     the EPP owes) but does not encode it again: it is forwarded as the
//     bytes it came in (frames.go), unless the sidecar changed it.
//     --epp-response-phase=Skip restores the request-phase-only behaviour:
//     the EPP's stream ends with the request phase and the sidecar lets the
//     response phase through itself. ParentMode and the sidecar's own
//     answers (404, 500, 429, 503, redirects, FailOpen without a
//     destination) have no EPP stream: the sidecar lets the response phase
//     through itself, and in ParentMode the remote gateway's own EPP sees
//     the response. A subset hint of the gateway is passed to the local EPP
//     only: it lists local endpoints, which a remote EPP does not have.
//   - ParentMode's destination is the first Programmed parent's first
//     address and lowest listener port; the request's host and path are
//     kept.
//   - Credentials (pkg/epptransport) reads only Secrets, and the CA ConfigMaps of
//     BackendTLSPolicies, labelled mci.x-k8s.io/endpoint-picker-credentials
//     =true in the namespaces it is given (--endpoint-picker-secret-
//     namespaces), never cluster-wide; they are resolved in the pool's
//     namespace of the local cluster (namespace sameness). A missing or
//     unusable Secret or ConfigMap, a failed handshake, or a transport the
//     EPP does not serve fails the cluster like any EPP failure (next
//     cluster, then the failure mode); nothing is retried with a weaker
//     transport, and Plaintext asked for an ext-proc port that a
//     BackendTLSPolicy targets is refused. Each port's transport is logged
//     when it changes and exported (mci_sidecar_epp_transport); failed
//     connections are logged once per change of the error and counted
//     (mci_sidecar_epp_connection_failures_total). Connections are kept
//     per address and credentials version, so a rotated Secret or
//     ConfigMap is dialled anew at once. A secretRef to another namespace
//     than the import's is refused (mci reads no ReferenceGrant for
//     Secrets: mci-apiserver only ever names the pool's own), and the
//     cluster is skipped.
//   - Recovery. The relay and the health prober dial with one
//     epptransport.DialPolicy
//     (reconnect after 100 ms, at most every --epp-reconnect-max-delay,
//     1 s; gRPC's default grows to 120 s). The prober keeps its connection
//     reconnecting, checks at once when it turns READY, and an address
//     that turns SERVING makes the relay's connections to that EPP retry
//     at once: active probes and the relay agree, and an EPP that comes
//     back serves within about a second whatever the outage length. A
//     failed stream still marks the EPP NotServing until its next good
//     probe.
//   - Faults on the link to an EPP (TestEPPLinkFaults, test/e2e). Each
//     relay attempt is bounded by the attempt timeout: an EPP that
//     resets fails the attempt at once, one that stalls (a blackholed
//     link) fails it at the timeout, and the next cluster is tried; a slow
//     one (a 1s link) that answers within it is used, and its health
//     check, bounded by its own timeout, takes it out of HealthBased's
//     order at the next probe. In the response phase the same timeout
//     bounds each answer owed, after which the sidecar answers the rest
//     itself (above). A port that cannot be reached or does not answer in
//     time, by the relay or the prober, is logged when it turns
//     unreachable and when its gRPC code changes (other changes of the
//     error's text at most once a minute) and counted in
//     mci_sidecar_epp_connection_failures_total; mci_sidecar_epp_streams
//     counts the ext_proc streams open to EPPs from gRPC's own view of
//     them (a stats handler on the relay's connections), 0 when no
//     request is open, which is how a leaked stream would show. A response
//     phase the EPP answered whole is completed even when the gateway
//     resets the stream before the EPP's end of stream reaches the
//     sidecar (a slow link).
//   - Relayed requests. A request the sidecar relays to a remote EPP
//     carries x-mci-relayed-from: <local cluster>; a shim-mode sidecar
//     serves such a request with its pool's local EPP only and fails
//     closed, so that clusters exporting shim pools to each other never
//     bounce a request back and forth. The header only narrows routing.
package sidecar
