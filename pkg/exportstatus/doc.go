// Package exportstatus writes the one status mci writes: on each exported
// InferencePool of the local cluster, a parent status entry whose parentRef
// is the pool's InferencePoolImport (kind InferencePoolImport, the pool's
// namespace and name), with mci's ControllerName and the Exported condition
// that pkg/imports computes (upstream proposal 1374, InferencePool Status).
//
// One replica writes: the controller runs under client-go leader election,
// and only while the local cluster has something to write, so a cluster
// that only imports sees no write at all, not even a Lease renewal. The
// worker is level-triggered and idempotent: it recomputes the entry from
// the ClusterSet cache and patches status.parents only when mci's entry
// would change, with the pool's resourceVersion as a precondition, because
// status.parents is an atomic list that other controllers write too (a
// server-side apply of it would take the whole list over).
package exportstatus
