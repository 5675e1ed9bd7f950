// Package soak is the chaos soak (`make soak`, and a short
// smoke of it in `make test`): a local ClusterSet (test/localclusterset) of
// three clusters with two mci-apiserver replicas each, link proxies and
// the data path, under steady request traffic, 50 watchers and an
// informer per cluster, export changes and a seeded random schedule of
// faults. It checks, while it runs, that every view comes back to a fresh
// LIST after each heal, that no request goes to a cluster whose export
// was withdrawn (past the measured convergence), that each failed request
// falls in the window of a fault on the data path, that mci-sidecar's
// outlier detection takes a cluster whose model servers fail fast or hang
// out of the choice of new requests and back after, that a member whose
// every watch ends in 410 Gone at once is relisted a bounded number of
// times, that a member's namespace deleted and recreated shows in every
// import with nothing of the old one, and it compares the heap, goroutines
// and file descriptors of every mci process at the start and the end. See
// docs/performance.md, "Chaos soak".
package soak
