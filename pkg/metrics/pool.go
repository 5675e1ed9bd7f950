package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/mci-dev/mci/pkg/promptprefix"

	dto "github.com/prometheus/client_model/go"
)

// PoolNameLabel names the InferencePool of a pool gauge's series, in both
// naming schemes.
const PoolNameLabel = "name"

// PoolScheme is one set of names an Endpoint Picker gives its pool-level
// gauges.
type PoolScheme struct {
	// Name says whose names these are, for logs and metrics.
	Name string
	// Queue, KVCache and ReadyPods are the families of the average waiting
	// queue, the average KV cache utilization (0-1) and the ready model
	// servers of the pool; Running the average requests running in their
	// batches (optional: older EPPs do not publish it).
	Queue, KVCache, ReadyPods, Running string
}

// The naming schemes ParsePool reads, in order of preference. Upstream EPPs
// label every series with the pool's name (PoolNameLabel).
var (
	// GIEScheme: the Gateway API Inference Extension EPP (and mci-epp); the
	// llm-d EPP still emits these as deprecated aliases.
	GIEScheme = PoolScheme{
		Name:      "inference_pool",
		Queue:     "inference_pool_average_queue_size",
		KVCache:   "inference_pool_average_kv_cache_utilization",
		ReadyPods: "inference_pool_ready_pods",
		Running:   "inference_pool_average_running_requests",
	}
	// LLMDScheme: the llm-d router's EPP (subsystem llm_d_epp,
	// pkg/epp/metrics/llm_d_router_metrics.go), whose ready-pods gauge is
	// ready_endpoints.
	LLMDScheme = PoolScheme{
		Name:      "llm_d_epp",
		Queue:     "llm_d_epp_average_queue_size",
		KVCache:   "llm_d_epp_average_kv_cache_utilization",
		ReadyPods: "llm_d_epp_ready_endpoints",
		Running:   "llm_d_epp_average_running_requests",
	}
	// LLMDRouterScheme: llm-d router releases that named the subsystem
	// llm_d_router_epp before settling on llm_d_epp.
	LLMDRouterScheme = PoolScheme{
		Name:      "llm_d_router_epp",
		Queue:     "llm_d_router_epp_average_queue_size",
		KVCache:   "llm_d_router_epp_average_kv_cache_utilization",
		ReadyPods: "llm_d_router_epp_ready_endpoints",
		Running:   "llm_d_router_epp_average_running_requests",
	}
	PoolSchemes = []PoolScheme{GIEScheme, LLMDScheme, LLMDRouterScheme}
)

// BatchCapacityMetric is the average batch places (vLLM's max-num-seqs) of
// a pool's model servers, as mci-epp publishes it under every scheme: no
// upstream EPP publishes one, so it has mci's own name, labelled with the
// pool's name (PoolNameLabel) as the pool gauges are.
const BatchCapacityMetric = "mci_epp_pool_average_batch_capacity"

// RelayedRequestsMetric is mci-epp's count of the requests it routed, by
// the cluster whose mci-sidecar relayed them (RelayedFromLabel; "" for
// the requests of its own cluster's gateway), labelled with the pool's
// name (PoolNameLabel) as the pool gauges are: a counter. An importing
// cluster's sidecar reads its own part of the pool's requests from it, and
// the rest as traffic it does not place. No upstream EPP publishes one.
const RelayedRequestsMetric = "mci_epp_pool_routed_requests_total"

// RelayedFromLabel names the relaying cluster of a RelayedRequestsMetric
// series.
const RelayedFromLabel = "relayed_from"

// RelayedElsewhere is the RelayedFromLabel value of the requests relayed
// by a cluster mci-epp does not count on its own: one whose name is not a
// valid cluster name, or beyond the 128 it counts apart. No cluster has
// that name.
const RelayedElsewhere = "~other"

// maxRelayedSeries bounds the relaying clusters read of a pool: mci-epp
// counts 128 apart, and its own cluster's gateway and the rest besides.
const maxRelayedSeries = 256

// maxBatchPlaces bounds the running requests and batch places read from a
// pool's EPP: beyond any engine's batch, and small enough that products
// with a pod count stay exact.
const maxBatchPlaces = 1 << 20

// poolNames are the families ParsePool reads.
var poolNames = func() []string {
	out := []string{BatchCapacityMetric, RelayedRequestsMetric}
	for _, s := range PoolSchemes {
		out = append(out, s.Queue, s.KVCache, s.ReadyPods, s.Running)
	}
	return out
}()

// PoolMetrics are the pool-level gauges of one InferencePool as its EPP
// exposes them.
type PoolMetrics struct {
	// AverageQueue is the average number of requests waiting in the pool's
	// model servers (>= 0).
	AverageQueue float64
	// AverageKVCache is their average KV cache utilization, 0 to 1.
	AverageKVCache float64
	// ReadyPods is the number of ready model servers; -1 when the EPP does
	// not expose it.
	ReadyPods int
	// AverageRunning is the average number of requests running in their
	// servers' batches, and AverageBatchCapacity their average batch
	// places (vLLM's max-num-seqs); each -1 when the EPP does not publish
	// it (an upstream EPP publishes no batch capacity; a model server may
	// expose neither).
	AverageRunning, AverageBatchCapacity float64
	// Scheme is the Name of the naming scheme they were read under.
	Scheme string
	// UpdatedAt is when they were observed; ParsePool leaves it to the
	// caller.
	UpdatedAt time.Time
	// Prefixes are the prompt prefixes the pool's servers likely hold, as
	// its EPP publishes them (mci-epp's prefix summary); nil when it
	// publishes none or it was not read. ParsePool leaves it to the
	// caller.
	Prefixes *promptprefix.Summary
	// RelayedRequests are the requests the pool's EPP routed since it
	// started, by the cluster whose mci-sidecar relayed them ("" for its
	// own cluster's gateway's), as mci-epp counts them
	// (RelayedRequestsMetric); nil when the EPP publishes none (an
	// upstream EPP).
	RelayedRequests map[string]float64
}

// BatchFull reports whether the pool's figures say every batch place of
// its servers is taken: its average running requests are at least its
// average batch places. False when either is not published. The figures
// are a scrape old, so a batch that turns over fast may read full while
// it has a place: readers weigh it with what they see themselves.
func (m *PoolMetrics) BatchFull() bool {
	return m != nil && m.AverageBatchCapacity > 0 && m.AverageRunning >= m.AverageBatchCapacity
}

// ErrNoPoolMetrics means an exposition has no pool with both the queue and
// the KV cache gauge under any naming scheme.
var ErrNoPoolMetrics = errors.New("no pool gauges")

// ParsePool reads the pool gauges of a Prometheus text exposition, by the
// pool name of their series ("" for a series without PoolNameLabel). A pool
// needs the queue and the KV cache gauge of one scheme; its ready pods gauge
// is optional. When an EPP serves a pool under several schemes (llm-d emits
// both, with the same values), the first scheme of PoolSchemes wins; names of
// two schemes are never mixed for one pool.
//
// Only the lines of pool gauges are parsed, so a malformed line of another
// metric (an EPP's page is mostly histograms) cannot hide the load, and the
// body must be bounded by the caller. Any input gives pool metrics or an
// error, never a panic: a value that is not a finite, non-negative number
// (or a KV cache utilization above 1, clamped to 1 as "full") is an error.
func ParsePool(r io.Reader) (map[string]*PoolMetrics, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading pool metrics: %w", err)
	}
	families, err := parseText(bytes.NewReader(relevantLines(body, poolNames)))
	if err != nil {
		return nil, fmt.Errorf("parsing pool metrics: %w", err)
	}
	out := map[string]*PoolMetrics{}
	for _, scheme := range PoolSchemes {
		found, err := parseScheme(families, scheme)
		if err != nil {
			return nil, err
		}
		for pool, m := range found {
			if _, ok := out[pool]; !ok {
				out[pool] = m
			}
		}
	}
	if len(out) == 0 {
		var want []string
		for _, s := range PoolSchemes {
			want = append(want, s.Queue+" and "+s.KVCache)
		}
		return nil, fmt.Errorf("%w: want %s", ErrNoPoolMetrics, strings.Join(want, ", or "))
	}
	return out, nil
}

// PoolNames returns the pools of a ParsePool result, sorted.
func PoolNames(pools map[string]*PoolMetrics) []string {
	out := make([]string, 0, len(pools))
	for p := range pools {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// parseScheme reads the pools that have the queue and KV cache gauges of
// scheme.
func parseScheme(families map[string]*dto.MetricFamily, scheme PoolScheme) (map[string]*PoolMetrics, error) {
	queue, kv := families[scheme.Queue], families[scheme.KVCache]
	if queue == nil || kv == nil {
		return nil, nil
	}
	out := map[string]*PoolMetrics{}
	partial := map[string]*PoolMetrics{}
	get := func(pool string) *PoolMetrics {
		m := partial[pool]
		if m == nil {
			m = &PoolMetrics{AverageQueue: math.NaN(), AverageKVCache: math.NaN(), ReadyPods: -1,
				AverageRunning: -1, AverageBatchCapacity: -1, Scheme: scheme.Name}
			partial[pool] = m
		}
		return m
	}
	eachSeries := func(mf *dto.MetricFamily, set func(*PoolMetrics, *dto.Metric, float64) error) error {
		for _, s := range mf.GetMetric() {
			v, err := value(mf, s)
			if err == nil {
				if !(v >= 0) || math.IsInf(v, 0) {
					err = fmt.Errorf("value %v is not a non-negative number", v)
				} else {
					err = set(get(labelValue(s, PoolNameLabel)), s, v)
				}
			}
			if err != nil {
				return fmt.Errorf("metric %s: %w", mf.GetName(), err)
			}
		}
		return nil
	}
	each := func(mf *dto.MetricFamily, set func(*PoolMetrics, float64) error) error {
		return eachSeries(mf, func(m *PoolMetrics, _ *dto.Metric, v float64) error { return set(m, v) })
	}
	if err := each(queue, func(m *PoolMetrics, v float64) error { m.AverageQueue = v; return nil }); err != nil {
		return nil, err
	}
	if err := each(kv, func(m *PoolMetrics, v float64) error {
		// A fraction; above 1 is a rounding artifact or percent: "full" is
		// the safe reading.
		m.AverageKVCache = min(v, 1)
		return nil
	}); err != nil {
		return nil, err
	}
	if ready := families[scheme.ReadyPods]; ready != nil {
		if err := each(ready, func(m *PoolMetrics, v float64) error {
			m.ReadyPods = int(min(math.Round(v), math.MaxInt32))
			return nil
		}); err != nil {
			return nil, err
		}
	}
	batchFamilies := []struct {
		mf  *dto.MetricFamily
		set func(*PoolMetrics, float64)
	}{
		{families[scheme.Running], func(m *PoolMetrics, v float64) { m.AverageRunning = min(v, maxBatchPlaces) }},
		{families[BatchCapacityMetric], func(m *PoolMetrics, v float64) { m.AverageBatchCapacity = min(v, maxBatchPlaces) }},
	}
	for _, f := range batchFamilies {
		if f.mf == nil {
			continue
		}
		if err := each(f.mf, func(m *PoolMetrics, v float64) error { f.set(m, v); return nil }); err != nil {
			return nil, err
		}
	}
	if mf := families[RelayedRequestsMetric]; mf != nil {
		if err := eachSeries(mf, func(m *PoolMetrics, s *dto.Metric, v float64) error {
			if m.RelayedRequests == nil {
				m.RelayedRequests = map[string]float64{}
			}
			if len(m.RelayedRequests) >= maxRelayedSeries {
				return fmt.Errorf("more than %d relaying clusters", maxRelayedSeries)
			}
			m.RelayedRequests[labelValue(s, RelayedFromLabel)] += v
			return nil
		}); err != nil {
			return nil, err
		}
	}
	for pool, m := range partial {
		if !math.IsNaN(m.AverageQueue) && !math.IsNaN(m.AverageKVCache) {
			out[pool] = m
		}
	}
	return out, nil
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
