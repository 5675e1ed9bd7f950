package clusterscore

import (
	"errors"
	"time"

	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Health is what the health prober last learned about a candidate's EPP.
type Health int8

const (
	// HealthUnknown: not probed yet, or no health port.
	HealthUnknown Health = iota
	// HealthServing: the EPP answered SERVING.
	HealthServing
	// HealthNotServing: the EPP answered anything else, did not answer,
	// or a stream to it just failed.
	HealthNotServing
	// HealthEjected: the sidecar's outlier detection (pkg/outlier) took
	// the cluster out, its responses having failed. Every configuration
	// drops it, whatever its filters: an ejection is the sidecar's own
	// measure of the responses, which no policy asks to ignore.
	HealthEjected
)

func (h Health) String() string {
	switch h {
	case HealthServing:
		return "Serving"
	case HealthNotServing:
		return "NotServing"
	case HealthEjected:
		return "Ejected"
	default:
		return "Unknown"
	}
}

// PoolMetrics are the pool gauges of a candidate's EPP.
type PoolMetrics = metrics.PoolMetrics

// Candidate is one cluster a request may go to, as the caller knows it at
// request time. The caller keeps the candidates of a backend in a stable
// order (the Rotation is parallel to them).
type Candidate struct {
	// Name of the cluster; unique among the candidates.
	Name string
	// Weight is the configured weight; 0 takes the candidate out.
	Weight int64
	// Health of its EPP.
	Health Health
	// Pool holds the latest pool metrics of its EPP; nil when none.
	Pool *PoolMetrics
	// NotReady is true when the cluster's Ready condition is False.
	NotReady bool
	// ModelUnavailable is true when the cluster is known not to serve the
	// request's model.
	ModelUnavailable bool
	// Local marks the local InferencePool (FilterLocalFirst). A local pool
	// that is not part of the weighted rotation is passed with weight 0.
	Local bool
	// Stale marks a cluster known only from its last known data (the
	// control plane cannot reach it): it passes the filters as any other,
	// and is ordered after every candidate that is not stale, so that it
	// takes requests only when none of those can.
	Stale bool
	// Draining marks a cluster its exporter drains ahead of maintenance:
	// it takes no new work, only the requests it holds (Pipeline.holds),
	// unless no other candidate is kept.
	Draining bool
	// ID is the cluster's id in the prompt index,
	// promptprefix.ClusterID(Name), for a caller that computes it once
	// rather than on every pick; 0: computed when needed.
	ID uint32
	// Rank is the candidate's place among the candidates by weight, then
	// name (RankCandidates), for a caller that ranks them once rather
	// than on every pick; 0: the pick compares weights and names. Either
	// every candidate is ranked or none.
	Rank int32
}

// id is the candidate's id in the prompt index.
func (c *Candidate) id() uint32 {
	if c.ID != 0 {
		return c.ID
	}
	return promptprefix.ClusterID(c.Name)
}

// Request is what the pipeline knows about one request.
type Request struct {
	// Criticality decides shedding: only Sheddable requests are shed.
	Criticality scheduling.Criticality
	// Now is the reference time for metrics staleness and session expiry.
	Now time.Time
	// Scope is what the candidates' names are relative to, such as the
	// pool's "namespace/name": sessions and observations are kept per
	// scope and cluster, so that two pools of the same cluster do not
	// share them. promptprefix.Blocks takes the same scope as its salt.
	Scope string
	// Blocks are the chained hashes of the request's prompt blocks under
	// Scope (promptprefix.Blocks, or promptprefix.Rescoped from
	// ModelBlocks), which this sidecar's own memory keeps; nil when the
	// body has no prompt.
	Blocks []uint64
	// ModelBlocks are the same blocks under the scope of the model the
	// request names (promptprefix.ScopeOfModel), as the candidates' EPPs'
	// prefix summaries (Candidate.Pool.Prefixes) hold them; nil when not
	// read.
	ModelBlocks []uint64
	// Session is the request's session key (SessionKey); "" when none.
	Session string
	// Opens is true when the request opens a conversation: a chat
	// request none of whose messages is an answer (promptprefix's
	// Prompt.Opens). Home placement may send it off a home that serves
	// more than its share (HomeSplit); false when not known.
	Opens bool
	// Cluster is the name of this sidecar's cluster, as the requests it
	// relays name it to other clusters' EPPs (extproc.RelayedHeader), by
	// which their counts of the requests they route tell its own (Shares).
	Cluster string

	// Sampled is set by Pipeline.Sample: the candidates are a sample of
	// a backend's (SampleAbove), over which home placement hashes alone.
	Sampled bool

	// Home is set by Pipeline.Pick: where the request's home was and
	// whether it took the request (zero without a home), for the
	// caller's metrics and logs even when no Explanation is asked for.
	Home HomeDecision
	// LastResort is set by Pipeline.Pick when the filters kept no
	// candidate but ejected ones: they were kept then (ordered as if not
	// ejected), since a cluster whose responses failed lately may still
	// answer, and no cluster at all certainly does not (Envoy's panic
	// routing, at its limit).
	LastResort bool
}

// ErrShed means a sheddable request was shed: every candidate it could go
// to is measured and saturated. The sidecar answers 429.
var ErrShed = errors.New("sheddable request shed: every cluster is saturated")
