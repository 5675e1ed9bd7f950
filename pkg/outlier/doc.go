// Package outlier takes a cluster whose responses fail out of the choice of
// new requests for a while: outlier detection, as Envoy does it for the
// hosts of a cluster, done by mci-sidecar for the clusters of a pool. A
// cluster whose model servers answer 5xx at once looks lightly loaded and
// fast to every load measure (in-flight requests, time to first byte), so
// that it draws ever more of the traffic it fails: ejection is what stops
// it.
//
// A Detector learns the result of each request a cluster took (Record): a
// success, a 5xx answer, or a gateway failure (502, 503, 504, no first
// byte within the cluster's bound). It ejects
// the cluster on
//
//   - Consecutive5xx failures in a row (any 5xx and gateway failure),
//   - ConsecutiveGatewayFailure gateway failures in a row, or
//   - a success rate, over the last SuccessRateInterval, below
//     SuccessRateFactor times that of the pool's other clusters taken
//     together (each with at least SuccessRateMinimumRequests requests):
//     clusters that all fail alike (a client sending what no model server
//     accepts) eject none.
//
// An ejection lasts BaseEjectionTime times the cluster's ejections, up to
// MaxEjectionTime; a cluster back for BaseEjectionTime forgets one. Then the
// cluster is eligible again and probed: it takes one request at a time
// until one succeeds, which returns it, or fails, which ejects it again at
// once. No more than MaxEjectionPercent of a pool's clusters (at least one,
// never all) are ejected at once; an ejection beyond it is withheld and
// said so (EventOverflow).
//
// FirstByteBound is the bound on a cluster's time to first byte past which
// a request counts as a gateway failure: a quantile of its own recent times
// to first byte times a factor, between a floor and a ceiling.
//
// It is pure logic: every method takes the time it is called at, and the
// caller (pkg/sidecar) logs and counts the events it is given.
package outlier
