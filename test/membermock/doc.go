// Package membermock serves the summary API of many virtual member
// clusters from one process, for measuring mci-apiserver at fleet scale
// without a kube-apiserver per member.
//
// What a summary-mode mci-apiserver reads of a member is: its API
// discovery (whether it publishes summaries), /readyz (the reachability
// probe), the uid of its kube-system Namespace (its cluster ID), and
// LIST and WATCH of its InferencePoolExportSummaries and its
// InferenceClusterSummary through the member's aggregator. Each virtual
// member answers exactly these, at its own loopback port, over TLS with a
// CA of its own, to a bearer token of its own, with the authorization a
// real member grants its summary readers.
//
// The summaries are not written by hand: each member keeps the objects a
// real cluster would hold (Namespaces, InferencePools, Services,
// EndpointSlices, Pods, Gateways), and computes and serves their
// summaries with mci-apiserver's own code (pkg/imports computes them,
// pkg/registry/virtual keeps them with their change history and serves
// GET, LIST and WATCH with resourceVersions, bookmarks, watch-list and 410
// Gone, through the generic API server with mci's scheme and codecs).
// What differs from a real member is only where the objects come from
// (Apply and Delete here, a kube-apiserver's storage there) and that the
// kube-apiserver in front, its aggregator and its RBAC are stood in for.
package membermock
