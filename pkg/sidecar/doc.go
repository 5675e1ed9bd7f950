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
//     missing), its list or watch is tried again (within a second while
//     no server answers) and its cache keeps what it last read, so the
//     sidecar keeps routing on the last table built from it.
//     pkg/informerhealth builds every informer of the Watcher and says
//     so: one log line per change (lost, with the error; back, with how
//     long it was lost; another error while lost at most once a minute),
//     mci_sidecar_watch_reachable{resource} (1/0) and
//     mci_sidecar_watch_failures_total{resource}.
//   - A ClusterPolicy orders the backend's clusters: a compiled
//     configuration of the cluster scoring pipeline of pkg/clusterscore
//     (filters, weighted scorers, a picker), named (Weighted, HealthBased,
//     MetricsBased, LocalFirst, PrefixAffinity) or written inline in the
//     annotation ("prefix-cache=3,in-flight=1,pick=two-choices"), in
//     pkg/routingpolicy's vocabulary. The routing table parses it where it
//     reads it and routetable.Router compiles it when it publishes the
//     table, so that a request only takes what is compiled. A policy's
//     Needs say whether the server parses the request's
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
//     answered by pkg/responserelay, a state machine of named phases with
//     one transition function; responsephase.go). One tracker per request (tracker.go) is the
//     only place that tells the observers what became of it: the policies'
//     memory and observations, passive health, the metrics and the logs.
//     Each address is reached with the transport and credentials
//     pkg/epptransport resolves for it; the criticality of a request comes
//     from pkg/requestmodel, which the reference EPP shares, so the sidecar
//     does not link the EPP.
//   - In EPP shim mode the sidecar stands where an EPP stands: its
//     ext_proc ports serve self-signed TLS and plaintext alike by default
//     (listentransport.go, --ext-proc-tls), it listens on every port its
//     shim pools name and tells a request's pool by the port its
//     connection arrived on (shimports.go), and it says once per change
//     when the gateway never sends the response phase (gatewayphase.go).
//   - Sidecar runs all of it in an errgroup (extproc.Parts, as the EPP
//     runs its own): the first part to fail stops the others.
//
// The decisions where the proposal and the API are silent (what the
// policies learn, eligibility, failure modes, the response phase,
// transport to EPPs, recovery) are in docs/design/request-path.md.
package sidecar
