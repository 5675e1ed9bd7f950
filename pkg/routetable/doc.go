// Package routetable is mci-sidecar's routing table: a pure function of the
// watched objects (HTTPRoutes, InferencePoolImports, InferencePools, their
// Services, InferenceModels and InferenceObjectives, BackendTLSPolicies,
// Gateways, Namespaces and ReferenceGrants) and the sidecar's settings to an
// immutable Table that answers, for a request's attributes, which HTTPRoute
// rule it belongs to, which backendRef it goes to, with which filters, over
// which clusters and under which cluster policy. It makes no connection,
// starts no goroutine and reads no clock: the sidecar feeds it objects and
// publishes what it returns.
//
// The parts:
//
//   - Incremental turns HTTPRoutes, InferencePoolImports, InferencePools,
//     Services, InferenceModels and InferenceObjectives, with the served
//     Gateways, Namespaces and ReferenceGrants that decide which routes and
//     backendRefs Gateway API allows, into an immutable Table, with every
//     broken reference reported as a BuildError rather than a failure. It
//     takes objects that change one at a time and redoes only what a change
//     touches (the routes that name a changed pool, import, Service,
//     InferenceModel or InferenceObjective; the routes that name a Gateway
//     whose listeners changed, of a namespace whose labels changed, or with
//     backendRefs into the namespace of a changed ReferenceGrant; and the
//     host groups of those routes); the tests' Build computes the same
//     table from scratch and a randomized test holds the two equal
//     (build*.go: the builder shared by both; incremental*.go). A table
//     is never modified once published.
//   - Table.Match finds the HTTPRoute rule of a request (hostnames, path,
//     method, headers, query parameters) with Gateway API precedence.
//   - Rule.PickBackend picks a backendRef by weight, InferencePool and
//     InferencePoolImport backendRefs mixed, with smooth weighted
//     round-robin (clusterscore.Rotation): the split is exact over every
//     cycle of sum(weights) requests, so the proposal's 50/50 example
//     splits exactly equally. A rule's and a backend's rotations are
//     carried over to a rebuilt table that keeps their candidates and
//     weights (rotation.go).
//   - Router holds the published table, swapped atomically, and carries
//     the weighted round-robin state over to the next one.
//   - Filters are what a rule's and a backendRef's HTTPRoute filters do to
//     a request (header changes, a rewrite, a redirect), as plain values:
//     the sidecar writes them as ext_proc answers.
//
// Decisions where the proposal and the API are silent:
//
//   - Policy. Imports are computed and read-only, so the cluster policy is
//     chosen by the annotation mci.x-k8s.io/cluster-policy on the HTTPRoute
//     (it applies to all its backendRefs, shim pools included), else by the
//     same annotation or label on the InferencePool / InferencePoolImport
//     the backendRef names (an import carries the labels of its oldest
//     exporting pool, so an exporter can label its pool), else by the
//     sidecar's --default-cluster-policy (HealthBased by default), each a
//     name or an inline configuration (a label value cannot hold "=" or ",":
//     labels name policies only). An invalid value is reported once (logged
//     when the table's problems change) and ignored (the next in that order
//     applies). Cluster weights come from mci.x-k8s.io/cluster-weights on
//     the route ("cluster-a=3,cluster-c=1"; unlisted clusters weigh 1,
//     weight 0 is never picked, by any policy: MetricsBased of old tried
//     measured clusters of weight 0 first, and its FailOpen set had them).
//   - Gateway API attachment (attach.go, by the rules of pkg/gatewayattach,
//     which mci-apiserver's import parents read too). With --gateway the
//     sidecar serves only the routes attached to those Gateways: a parentRef (group and
//     kind defaulting to Gateway, namespace to the route's) selects the
//     listeners of its sectionName and port (each when set), and a route
//     attaches when at least one selected listener accepts it:
//     allowedRoutes.namespaces.from Same (the default), All or Selector
//     (the route namespace's labels; a Selector without a selector, or an
//     invalid one, accepts none), allowedRoutes.kinds (group defaulting to
//     Gateway API's; without kinds, HTTP and HTTPS listeners allow
//     HTTPRoutes, others none), and, when both have hostnames, an
//     intersection of the route's hostnames with the listener's. The route
//     is then served for those intersections only (for the listener's
//     hostname when it has none), so that a route behind a listener of
//     a.example.com never answers for b.example.com. A served Gateway that
//     does not exist accepts nothing. The Gateways' listeners, not their
//     status, are read. Without --gateway every HTTPRoute is served: the
//     sidecar does not know which listeners requests come through.
//   - ReferenceGrants. A backendRef to an InferencePool or
//     InferencePoolImport of another namespace is used only when a
//     ReferenceGrant (v1beta1) of that namespace has a from of group
//     gateway.networking.k8s.io, kind HTTPRoute and the route's namespace,
//     and a to of the backend's group and kind with no name or its name;
//     otherwise it is refused (RefNotPermitted) and answers 500 for its
//     share of the weight.
//   - Refusals are reported, not written. A route that names a served
//     Gateway none of whose listeners accepts it is reported once with
//     every listener's reason (the most specific of NoMatchingParent,
//     NotAllowedByListeners, NoMatchingListenerHostname as its reason); a
//     route that another parentRef attaches is served and its refused
//     parentRefs are not reported. Reports are logged once per change of
//     the table's problems and counted by reason in
//     mci_sidecar_gateway_api_refusals. mci writes no route status: the
//     gateway's own controller does.
//   - Local EPPs are reached like remote ones: their Service's LoadBalancer
//     ingress, else its cluster IP, else its ExternalName, on the ports
//     eppaddr.ResolvePorts finds, the rule mci-apiserver uses for the
//     pool's import: the endpointPickerRef's port, else the port named for
//     ext-proc, else the only port that is neither health nor metrics (a
//     port numbered 9002 is no longer taken on its number alone).
//   - EPP shim (--endpoint-picker-service=namespace/name, the sidecar's own
//     Services). A local InferencePool whose endpointPickerRef names one of
//     them is a shim pool: "this pool plus the import of the same
//     namespace/name". Its clusters are the pool's real local EPP, named by
//     the annotation mci.x-k8s.io/local-endpoint-picker ("service" or
//     "service:port"; the sidecar cannot be it, that would loop), then the
//     import's clusters; its failure mode comes from its endpointPickerRef.
//     In shim mode every request is an EPP-protocol request for a shim pool
//     (no HTTPRoute is needed); which one is decided by, in order: the
//     gateway's filter metadata mci.x-k8s.io/inference-pool
//     ("namespace/name", e.g. route metadata Envoy forwards with
//     metadata_options); the only shim pool, which is the common case of one
//     sidecar Service per pool, as one EPP per pool; the only shim pool
//     among the backendRefs of the request's HTTPRoute rule. Otherwise the
//     request gets 500 (503 while no shim pool exists), and several shim
//     pools behind one Service are reported. An HTTPRoute backendRef to a
//     shim pool resolves the same way, never to the sidecar itself. The
//     policy and cluster weights of a request follow the rule of every
//     backendRef, whichever way its pool was found: the annotations of the
//     request's HTTPRoute when its rule has a backendRef to the pool (a
//     platform engineer sets the policy where the route is, as for imports),
//     else the pool's, else --default-cluster-policy (and weights of 1).
//   - Transport to EPPs. Each port of each cluster's EPP (ext_proc,
//     health, metrics) has a PortTransport: plaintext, TLS not verified
//     (how gateways reach an upstream EPP's default self-signed
//     certificate), TLS verified as a BackendTLSPolicy says, or TLS with
//     the credentials Secret (CA, optional client certificate). Per port,
//     the first that applies decides the mode (eppaddr.ResolvePortTransport): the
//     pool's mci.x-k8s.io/endpoint-picker-transport ("TLS", "Plaintext",
//     or port=mode pairs such as "ext-proc=TLS"; an import carries it as
//     transport.mode); the Secret (from the exporting pool's
//     mci.x-k8s.io/endpoint-picker-secret; for a local pool, the
//     annotation itself): TLS; a BackendTLSPolicy that targets the ext-proc
//     port of the EPP Service: TLS; --endpoint-picker-transport; else
//     plaintext. A TLS port is verified with the Secret, else with the
//     BackendTLSPolicy of that Service port (for an import, the exporting
//     cluster's, carried by mci-apiserver as transport.validation; for a
//     local pool, the local cluster's), else not at all. Upstream EPPs
//     (GIE's cmd/epp and the llm-d EPP built on it) serve by default
//     ext_proc over self-signed TLS and health and metrics in plaintext:
//     "ext-proc=TLS" is their setting.
package routetable
