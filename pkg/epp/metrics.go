package epp

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// unlisted is the model label of a request whose model has no
// InferenceModel. Such names come from callers, so they never become label
// values: a caller could otherwise mint time series at will.
const unlisted = "unlisted"

// Metrics are the EPP's Prometheus metrics: the pool-level gauges upstream
// EPPs expose (inference_pool_*, or llm-d's llm_d_epp_*) and the EPP's own
// request metrics.
type Metrics struct {
	requests          *prometheus.CounterVec
	decisions         prometheus.Histogram
	streams           prometheus.Gauge
	unknownObjectives prometheus.Counter
	inFlight          prometheus.Gauge
	relayed           *relayedRequests
	servedBy          *prometheus.CounterVec
	prefixMatch       prometheus.Histogram
}

// Results of a served report, the result label of
// mci_epp_served_reports_total.
const (
	// ServedPicked: the endpoint that served is the one picked first.
	ServedPicked = "picked"
	// ServedFallback: one of the fallbacks served.
	ServedFallback = "fallback"
	// ServedOther: an endpoint that was not picked served.
	ServedOther = "other"
	// ServedUnreported: the response phase came without a report.
	ServedUnreported = "unreported"
)

// NewMetrics registers the EPP's metrics for pool in reg. staleness is the
// scheduler's: stale metrics count as unknown in the pool's averages too.
// maxNumSeqs is the batch places of each of the pool's model servers
// (vLLM's --max-num-seqs; 0: not known). The pool gauges are served under
// each of schemes (none: the GIE names), as the llm-d EPP serves both its
// own and the GIE names.
func NewMetrics(reg prometheus.Registerer, pool *Pool, staleness time.Duration, maxNumSeqs int, schemes ...metrics.PoolScheme) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_epp_requests_total",
			Help: "Requests the endpoint picker answered, by requested and target model (\"unlisted\" for a model that no InferenceModel or exact InferenceModelRewrite rule names, and for a target model that only the request chose) and HTTP status (200: routed).",
		}, []string{"model_name", "target_model_name", "code"}),
		decisions: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mci_epp_decision_duration_seconds",
			Help:    "Time from the end of the request body to the answer sent: parsing, model mapping and scheduling.",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_epp_ext_proc_streams",
			Help: "ext_proc streams open now.",
		}),
		unknownObjectives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mci_epp_unknown_objective_requests_total",
			Help: "Requests that named (x-gateway-inference-objective) an InferenceObjective the pool does not have; they are served with the default priority 0.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_epp_requests_in_flight",
			Help: "Requests routed to a model server whose response has not ended: from the pick to the response's last message (end of stream or trailers), or to the end of the gateway's stream when the response phase does not reach the endpoint picker.",
		}),
		servedBy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_epp_served_reports_total",
			Help: "Response phases of routed requests by what the gateway reported as the endpoint that served them (x-gateway-destination-endpoint-served): picked (the first endpoint picked), fallback (a fallback picked), other (an endpoint not picked), unreported.",
		}, []string{"result"}),
		prefixMatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mci_epp_prefix_match_ratio",
			Help:    "For each routed request with a prompt, the share of its prompt blocks that the prefix index took the picked endpoint to hold in its prefix cache (0: placed by load alone).",
			Buckets: []float64{0, 0.25, 0.5, 0.75, 0.9, 1},
		}),
	}
	if len(schemes) == 0 {
		schemes = []metrics.PoolScheme{metrics.GIEScheme}
	}
	pc := &poolCollector{pool: pool, staleness: staleness, maxNumSeqs: maxNumSeqs,
		batchCapacity: prometheus.NewDesc(metrics.BatchCapacityMetric,
			"Average batch places (the model servers' max-num-seqs) of the model servers of the pool that publish their running requests; absent when either is unknown.",
			[]string{metrics.PoolNameLabel}, nil),
		batchKnown: prometheus.NewDesc("mci_epp_pool_batch_occupancy_known",
			"1 when the pool's running requests and batch places are published (some model server exposes vllm:num_requests_running and --model-server-max-num-seqs is set), 0 when not: a router then tells a full batch only from the queue.",
			[]string{metrics.PoolNameLabel}, nil),
	}
	for _, s := range schemes {
		pc.schemes = append(pc.schemes, newPoolDescs(s))
	}
	m.relayed = newRelayedRequests(pool)
	reg.MustRegister(m.requests, m.decisions, m.streams, m.unknownObjectives, m.inFlight, m.relayed, m.servedBy, m.prefixMatch, pc)
	return m
}

func (m *Metrics) observe(d *Decision, code int, took time.Duration) {
	model, target := "", ""
	if d != nil {
		model, target = unlisted, unlisted
		if d.Listed {
			model = d.Model
		}
		// A target an object chose is a name from the configuration; one
		// the request chose (its model, the rewrite header) is not.
		if (d.Listed && d.RewrittenBy == "") || (d.RewrittenBy != "" && d.RewrittenBy != requestmodel.RewrittenByHeader) {
			target = d.TargetModel
		}
	}
	m.requests.WithLabelValues(model, target, strconv.Itoa(code)).Inc()
	m.decisions.Observe(took.Seconds())
	if d != nil && code == http.StatusOK && d.PromptBlocks > 0 {
		m.prefixMatch.Observe(float64(d.PrefixMatched) / float64(d.PromptBlocks))
	}
}

// poolDescs are the descriptors of the pool gauges under one naming scheme.
type poolDescs struct{ queue, kvCache, ready, running *prometheus.Desc }

func newPoolDescs(s metrics.PoolScheme) poolDescs {
	label := []string{metrics.PoolNameLabel}
	return poolDescs{
		queue:   prometheus.NewDesc(s.Queue, "Average number of requests waiting in the model servers of the pool that have known metrics.", label, nil),
		kvCache: prometheus.NewDesc(s.KVCache, "Average KV cache utilization (0 to 1) of the model servers of the pool that have known metrics.", label, nil),
		ready:   prometheus.NewDesc(s.ReadyPods, "Ready model servers in the pool: the candidate endpoints.", label, nil),
		running: prometheus.NewDesc(s.Running, "Average number of requests running in the batches of the model servers of the pool that expose it; absent when none does.", label, nil),
	}
}

// requestInFlight is one routed request counted in
// mci_epp_requests_in_flight until end, which may be called more than once.
type requestInFlight struct {
	gauge prometheus.Gauge
	ended bool
}

// startRequest counts a routed request, relayed by relayer ("" for one of
// this cluster's gateway), and counts it in flight; m may be nil.
func (m *Metrics) startRequest(relayer string) *requestInFlight {
	r := &requestInFlight{}
	if m != nil {
		m.relayed.count(relayer)
		r.gauge = m.inFlight
		r.gauge.Inc()
	}
	return r
}

func (r *requestInFlight) end() {
	if r.gauge != nil && !r.ended {
		r.ended = true
		r.gauge.Dec()
	}
}

func (m *Metrics) served(result string) {
	if m != nil {
		m.servedBy.WithLabelValues(result).Inc()
	}
}

// poolCollector derives the pool gauges at scrape time from the pool and
// its metrics, rather than keeping copies up to date.
type poolCollector struct {
	pool       *Pool
	staleness  time.Duration
	maxNumSeqs int
	schemes    []poolDescs
	// batchCapacity and batchKnown are scheme-less: no upstream EPP
	// publishes batch places.
	batchCapacity, batchKnown *prometheus.Desc
	// occupancy is the last batchOccupancy state logged, so that a change
	// is said once.
	occupancy atomic.Int32
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.schemes {
		ch <- d.queue
		ch <- d.kvCache
		ch <- d.ready
		ch <- d.running
	}
	ch <- c.batchCapacity
	ch <- c.batchKnown
}

// poolAverages are the pool gauges' values: averages over the model
// servers with fresh metrics; running over those that expose it
// (runningKnown of them).
type poolAverages struct {
	queue, kv, running  float64
	known, runningKnown int
}

func (c *poolCollector) averages(snap *snapshot) poolAverages {
	cutoff := time.Now().Add(-c.staleness)
	var a poolAverages
	for i := range snap.endpoints {
		m := c.pool.metricsOf(snap, i)
		if m == nil || (c.staleness > 0 && m.UpdatedAt.Before(cutoff)) {
			continue
		}
		a.known++
		a.queue += float64(m.WaitingQueue)
		a.kv += m.KVCacheUsage
		if m.RunningKnown {
			a.runningKnown++
			a.running += float64(m.RunningRequests)
		}
	}
	if a.known > 0 {
		a.queue /= float64(a.known)
		a.kv /= float64(a.known)
	}
	if a.runningKnown > 0 {
		a.running /= float64(a.runningKnown)
	}
	return a
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.pool.snap.Load()
	a := c.averages(snap)
	name := c.pool.Name()
	for _, d := range c.schemes {
		ch <- prometheus.MustNewConstMetric(d.queue, prometheus.GaugeValue, a.queue, name)
		ch <- prometheus.MustNewConstMetric(d.kvCache, prometheus.GaugeValue, a.kv, name)
		ch <- prometheus.MustNewConstMetric(d.ready, prometheus.GaugeValue, float64(len(snap.endpoints)), name)
		if a.runningKnown > 0 {
			ch <- prometheus.MustNewConstMetric(d.running, prometheus.GaugeValue, a.running, name)
		}
	}
	known := c.batchOccupancy(a)
	if known == occupancyKnown {
		ch <- prometheus.MustNewConstMetric(c.batchCapacity, prometheus.GaugeValue, float64(c.maxNumSeqs), name)
	}
	ch <- prometheus.MustNewConstMetric(c.batchKnown, prometheus.GaugeValue, float64(known), name)
}

// The states of a pool's batch occupancy: whether it publishes both its
// running requests and its batch places.
const (
	occupancyUnknown int32 = iota
	occupancyKnown
)

// batchOccupancy says whether the pool's batch occupancy is published,
// and logs each change: without it, a router tells a batch full of
// traffic it does not see only once requests queue there. Servers with no
// known metrics yet say nothing either way.
func (c *poolCollector) batchOccupancy(a poolAverages) int32 {
	state := occupancyUnknown
	if a.runningKnown > 0 && c.maxNumSeqs > 0 {
		state = occupancyKnown
	}
	if a.known > 0 && c.occupancy.Swap(state+1) != state+1 {
		logger := klog.Background().WithName("pool-metrics")
		if state == occupancyKnown {
			logger.Info("Publishing the pool's running requests and batch places", "pool", c.pool.Name(), "maxNumSeqs", c.maxNumSeqs)
		} else {
			logger.Info("Not publishing the pool's batch places: routers tell a full batch only from the queue",
				"pool", c.pool.Name(), "serversExposingRunning", a.runningKnown, "maxNumSeqs", c.maxNumSeqs,
				"reason", "no model server exposes "+metrics.RunningRequestsMetric+", or --model-server-max-num-seqs is not set")
		}
	}
	return state
}

var apiServedDesc = prometheus.NewDesc("mci_epp_model_config_api_served",
	"Kubernetes mode: 1 when the pool's cluster serves this model configuration resource (InferenceModel, InferenceObjective, InferenceModelRewrite, by group), 0 when the EPP runs without it.",
	[]string{"group", "version", "resource"}, nil)

// NewAPICollector reports which model configuration resources the pool's
// cluster serves (mci_epp_model_config_api_served; nothing in standalone
// mode).
func NewAPICollector(models *requestmodel.Models) prometheus.Collector {
	return &apiCollector{models: models}
}

type apiCollector struct{ models *requestmodel.Models }

func (c *apiCollector) Describe(ch chan<- *prometheus.Desc) { ch <- apiServedDesc }

func (c *apiCollector) Collect(ch chan<- prometheus.Metric) {
	for r, served := range c.models.ServedAPIs() {
		v := 0.0
		if served {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(apiServedDesc, prometheus.GaugeValue, v, r.Group, r.Version, r.Resource)
	}
}
