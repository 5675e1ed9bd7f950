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
// The decisions where the proposal and the API are silent (which
// annotation chooses a policy, Gateway API attachment, ReferenceGrants,
// the EPP shim, transport to EPPs) are in docs/design/routing-table.md.
package routetable
