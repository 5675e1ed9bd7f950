package sidecar

import (
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/routetable"
)

// Outcomes of a request, the outcome label of mci_sidecar_requests_total.
const (
	// OutcomeRouted: a cluster's EPP answered with a destination.
	OutcomeRouted = "routed"
	// OutcomeParent: routed to a remote parent gateway (ParentMode).
	OutcomeParent = "parent"
	// OutcomeRefused: a cluster's EPP answered with an error of its own
	// (429, 400, ...), relayed to the gateway.
	OutcomeRefused = "refused"
	// OutcomeShed: MetricsBased shed a sheddable request (429).
	OutcomeShed = "shed"
	// OutcomeNoRoute: no HTTPRoute rule matches (404).
	OutcomeNoRoute = "no_route"
	// OutcomeRedirected: an HTTPRoute RequestRedirect filter answered.
	OutcomeRedirected = "redirected"
	// OutcomeInvalidBackend: the picked backendRef, or its rule, cannot be
	// used (500).
	OutcomeInvalidBackend = "invalid_backend"
	// OutcomeUnavailable: no cluster could take the request (503).
	OutcomeUnavailable = "unavailable"
	// OutcomeOutsideRegions: the route's cluster filter left the backend
	// no cluster, none of its clusters being in the regions it allows
	// (routetable.ClusterRegionsAnnotation) (503).
	OutcomeOutsideRegions = "outside_regions"
	// OutcomeOutsideTags: the route's cluster filter left the backend no
	// cluster, for want of the tags it requires
	// (routetable.ClusterTagsAnnotation) (503).
	OutcomeOutsideTags = "outside_tags"
	// OutcomeFailOpen: no cluster could take the request and FailOpen let it
	// continue without a destination.
	OutcomeFailOpen = "fail_open"
	// OutcomeError: the request could not be read (413, protocol errors).
	OutcomeError = "error"
	// OutcomeOverLimit: the sidecar was at a global limit (its streams,
	// or the request bytes it buffers) and answered 503.
	OutcomeOverLimit = "over_limit"
)

// Metrics are the sidecar's Prometheus metrics.
type Metrics struct {
	requests     *prometheus.CounterVec
	eppFailures  *prometheus.CounterVec
	responses    *prometheus.CounterVec
	lateBody     *prometheus.CounterVec
	pickDuration prometheus.Histogram
	answer       prometheus.Histogram
	streams      prometheus.Gauge
	eppStreams   prometheus.Gauge
	generation   prometheus.Gauge
	tableErrors  prometheus.Gauge
	refusals     *prometheus.GaugeVec
	// unverified: mci_sidecar_remote_epp_unverified.
	unverified  *prometheus.GaugeVec
	buildTime   prometheus.Histogram
	unparseable prometheus.Counter
	homes       *prometheus.CounterVec
	homesAlike  *prometheus.GaugeVec
	// answersRefused counts remote EPPs' answers refused, admission the
	// streams refused at a global limit; remotePolicy and limits are
	// what the sidecar runs with.
	answersRefused *prometheus.CounterVec
	admission      *prometheus.CounterVec
	loopback       prometheus.Gauge
	deniedRanges   *prometheus.GaugeVec
	reg            prometheus.Registerer
	// requestCounts and responseCounts are the children of requests and
	// responses by their labels, counted on every request: looked up once
	// per label set rather than hashed again each time. (No series of
	// either is ever deleted, so a child kept is never stale.)
	requestCounts, responseCounts sync.Map
	// homeCounts and alikeGauges are, in the same way, the children of
	// homes by backend and outcome and of homesAlike by backend, set on
	// every request a prefix policy places.
	homeCounts, alikeGauges sync.Map
	// outlier: outlier detection's ejections and first-byte timeouts.
	outlier outlierMetrics
	// watches follows the informers the routing table is built from:
	// mci_sidecar_watch_reachable and mci_sidecar_watch_failures_total.
	watches *informerhealth.Tracker
}

// NewMetrics registers the sidecar's metrics in reg: those of its requests,
// EPP streams, routing table and watches. (The EPP health gauges are
// eppHealthCollector's.)
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_requests_total",
			Help: "Requests the sidecar answered, by the cluster that took them (\"\" when none did) and outcome (routed, parent, refused, shed, no_route, invalid_backend, unavailable, fail_open, over_limit, error).",
		}, []string{"cluster", "outcome", "code"}),
		eppFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_epp_failures_total",
			Help: "ext_proc streams to a cluster's EPP that failed before it answered, each followed by the next cluster.",
		}, []string{"cluster"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_epp_response_phase_total",
			Help: "Response phases relayed to the EPP that routed the request, by cluster and outcome: completed; canceled (the gateway ended the stream early); immediate (the EPP answered with an immediate response); failed, timeout, ended (the EPP's stream failed, did not answer in time, or ended with answers owed: the sidecar answered the rest itself and the response went on unchanged).",
		}, []string{"cluster", "outcome"}),
		lateBody: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_epp_late_body_answers_total",
			Help: "Answers of a cluster's EPP to streamed response body chunks that had gone to the gateway already (--epp-response-phase=Relay) and asked for a change the gateway could no longer make (a rewritten body, a header mutation): the chunks went on unchanged.",
		}, []string{"cluster"}),
		pickDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mci_sidecar_pick_duration_seconds",
			Help:    "Time to match the route, pick the backendRef and order the clusters of one request (the EPP call not included).",
			Buckets: []float64{1e-6, 2.5e-6, 5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3},
		}),
		answer: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mci_sidecar_answer_duration_seconds",
			Help:    "Time from the end of the request body to the answer sent to the gateway, EPP round trips included.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1},
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_sidecar_ext_proc_streams",
			Help: "ext_proc streams from the gateway open now.",
		}),
		eppStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_sidecar_epp_streams",
			Help: "ext_proc streams to EPPs open now (request and response phases relayed), counted by the relay from opening each to its end: 0 when no request is open.",
		}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_sidecar_routing_table_generation",
			Help: "Generation of the routing table in use; it grows by one per rebuild.",
		}),
		tableErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_sidecar_routing_table_errors",
			Help: "Problems found building the routing table in use (broken references, unknown kinds, imports without a ready cluster); see the logs.",
		}),
		refusals: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mci_sidecar_gateway_api_refusals",
			Help: "What the routing table in use refuses under Gateway API's rules, by reason: HTTPRoutes that name the served Gateway but no listener of it accepts (NotAllowedByListeners, NoMatchingListenerHostname, NoMatchingParent), which are not served, and cross-namespace backendRefs no ReferenceGrant allows (RefNotPermitted), which answer 500 for their share; see the logs.",
		}, []string{"reason"}),
		buildTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mci_sidecar_routing_table_build_duration_seconds",
			Help:    "Time to rebuild the routing table from the informers' caches.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}),
		reg: reg,
	}
	m.watches = informerhealth.NewTracker("mci_sidecar")
	reg.MustRegister(slices.Concat(m.remoteMetrics(), m.scoringMetrics(), m.outlierMetrics())...)
	reg.MustRegister(m.requests, m.eppFailures, m.responses, m.lateBody, m.pickDuration, m.answer, m.streams, m.eppStreams, m.generation, m.tableErrors, m.refusals, m.buildTime, m.watches)
	return m
}

// scoringMetrics makes the metrics of the cluster scoring's decisions:
// prompts it could not read, and home placement's decisions.
func (m *Metrics) scoringMetrics() []prometheus.Collector {
	m.unparseable = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mci_sidecar_unparseable_prompts_total",
		Help: "Request bodies whose prompt a policy with the prefix-cache scorer could not read: routed without prefix affinity.",
	})
	m.homes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mci_sidecar_prefix_home_requests_total",
		Help: "Requests of a policy with a home bound (PrefixAffinity), by backend and result, the lead decision of home placement: no_key (no full prompt block: no home, the scores lead), dealt (a prompt new to the sidecar, dealt by the rotation among the clusters within the bound where the fewest wait), reported (a prompt new to the sidecar whose leading blocks a cluster's EPP reports its servers hold, in its prefix summary: that cluster, as its home, took it), home (the home took it), home_no_wait (the home was beyond its load bound, but its servers queued no more than the least queued cluster's and every request the sidecar sent it had its first byte: a move would cost a cold prefill and save no wait, so the home took it), second_home (the home was beyond its load bound, saturated or stale; its second home took it), queued (the home's servers' scraped queue was beyond the queue margin above the least queued cluster's; the request went to the second home or spilled), overdue (a request the sidecar sent the home awaited its first byte past its due; the request went to the second home or spilled), filled (the home's pool metrics said every batch place of its servers was taken and a request the sidecar sent it had awaited its first byte past the home's average: a wait for a place, not a prefill; the request went to the second home or spilled), spill (neither home nor second home could take it; the best scored cluster within the bound did), score_order (no cluster within the bound: the scores' order stood).",
	}, []string{"backend", "result"})
	m.homesAlike = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mci_sidecar_prefix_home_capacities_unknown",
		Help: "1 while the last home decision of a backend counted its clusters alike because not every one reported its ready pods (no fresh pool metrics): homes and bounds then assume equal capacities. 0 once they are known again.",
	}, []string{"backend"})
	return []prometheus.Collector{m.unparseable, m.homes, m.homesAlike}
}

// remoteMetrics makes the metrics of what the sidecar accepts from remote
// EPPs and the gateway: answers refused, streams refused at a limit, the
// destinations allowed and the EPPs reached without verified TLS.
func (m *Metrics) remoteMetrics() []prometheus.Collector {
	m.answersRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mci_sidecar_epp_answers_refused_total",
		Help: "Answers of remote clusters' EPPs the sidecar refused, by cluster and reason (no_destination, conflicting_destinations, unpublished_destination, forbidden_destination, body_mutation, immediate_status, protocol_violation): the request went to the next cluster or followed its failure mode.",
	}, []string{"cluster", "reason"})
	m.admission = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mci_sidecar_admission_refused_total",
		Help: "Streams of the gateway answered 503 because the sidecar was at a global limit, by limit: streams (--max-streams) or body_bytes (--max-inflight-body-bytes).",
	}, []string{"limit"})
	m.loopback = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "mci_sidecar_remote_destinations_loopback_allowed",
		Help: "1 when remote EPPs may name loopback destinations (--allow-loopback-destinations: a ClusterSet on one machine only), else 0.",
	})
	m.deniedRanges = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mci_sidecar_remote_destination_denied_ranges",
		Help: "Address ranges no remote EPP may name as a destination beyond loopback, link-local, multicast and unspecified ones, by what they are: services (--service-cluster-ip-range), pods (--cluster-cidr), other (--denied-destination-cidrs). 0 for services or pods: this cluster's Service or Pod addresses are not refused.",
	}, []string{"ranges"})
	m.unverified = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mci_sidecar_remote_epp_unverified",
		Help: "1 for each cluster of an import (pool, namespace/name) whose EPP's ext_proc would be reached without verified TLS (plaintext or TLS not verified), by outcome: allowed (--insecure-remote-endpoint-pickers names the import: routed to) or refused (skipped, see the routing table's problems).",
	}, []string{"pool", "cluster", "outcome"})
	return []prometheus.Collector{m.answersRefused, m.admission, m.loopback, m.deniedRanges, m.unverified}
}

func (m *Metrics) request(cluster, outcome string, code int) {
	if m != nil {
		k := requestLabels{cluster, outcome, code}
		c, ok := m.requestCounts.Load(k)
		if !ok {
			c, _ = m.requestCounts.LoadOrStore(k, m.requests.WithLabelValues(cluster, outcome, strconv.Itoa(code)))
		}
		c.(prometheus.Counter).Inc()
	}
}

// requestLabels are the labels of mci_sidecar_requests_total.
type requestLabels struct {
	cluster, outcome string
	code             int
}

func (m *Metrics) answerRefused(cluster, reason string) {
	if m != nil {
		m.answersRefused.WithLabelValues(cluster, reason).Inc()
	}
}

func (m *Metrics) admissionRefused(limit string) {
	if m != nil {
		m.admission.WithLabelValues(limit).Inc()
	}
}

func (m *Metrics) remotePolicy(p eppanswer.Policy) {
	if m == nil {
		return
	}
	if p.AllowLoopback {
		m.loopback.Set(1)
	} else {
		m.loopback.Set(0)
	}
	m.deniedRanges.WithLabelValues(RangesServices).Set(float64(len(p.ServiceRanges)))
	m.deniedRanges.WithLabelValues(RangesPods).Set(float64(len(p.PodRanges)))
	m.deniedRanges.WithLabelValues(RangesOther).Set(float64(len(p.Denied)))
}

// admissionLimits registers the gauges of a's state, read at scrape time.
func (m *Metrics) admissionLimits(a *admission) {
	if m == nil {
		return
	}
	for _, limit := range []string{LimitStreams, LimitBodyBytes} {
		m.admission.WithLabelValues(limit)
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "mci_sidecar_inflight_body_bytes",
			Help: "Request body bytes the sidecar buffers now across streams, each counted twice (the body and the messages kept to replay it); at --max-inflight-body-bytes new bodies are answered 503.",
		}, func() float64 { return float64(a.bytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "mci_sidecar_admitted_streams",
			Help: "Streams of the gateway the sidecar admitted and serves now; at --max-streams new ones are answered 503.",
		}, func() float64 { return float64(a.streams.Load()) }),
	)
}

func (m *Metrics) eppFailure(cluster string) {
	if m != nil {
		m.eppFailures.WithLabelValues(cluster).Inc()
	}
}

func (m *Metrics) responsePhase(cluster, outcome string) {
	if m != nil {
		k := [2]string{cluster, outcome}
		c, ok := m.responseCounts.Load(k)
		if !ok {
			c, _ = m.responseCounts.LoadOrStore(k, m.responses.WithLabelValues(cluster, outcome))
		}
		c.(prometheus.Counter).Inc()
	}
}

func (m *Metrics) lateBodyAnswers(cluster string, n int) {
	if m != nil {
		m.lateBody.WithLabelValues(cluster).Add(float64(n))
	}
}

func (m *Metrics) picked(d time.Duration) {
	if m != nil {
		m.pickDuration.Observe(d.Seconds())
	}
}

func (m *Metrics) unparseablePrompt() {
	if m != nil {
		m.unparseable.Inc()
	}
}

// prefixHome counts a home placement's decision, and while the request
// had a home, whether its clusters' capacities were known.
func (m *Metrics) prefixHome(backend string, h clusterscore.HomeDecision) {
	if m == nil {
		return
	}
	k := homeLabels{backend, h.Outcome}
	c, ok := m.homeCounts.Load(k)
	if !ok {
		c, _ = m.homeCounts.LoadOrStore(k, m.homes.WithLabelValues(backend, h.Outcome.String()))
	}
	c.(prometheus.Counter).Inc()
	if h.Home == "" {
		return
	}
	g, ok := m.alikeGauges.Load(backend)
	if !ok {
		g, _ = m.alikeGauges.LoadOrStore(backend, m.homesAlike.WithLabelValues(backend))
	}
	v := 0.0
	if h.Alike {
		v = 1
	}
	g.(prometheus.Gauge).Set(v)
}

// homeLabels are the labels of mci_sidecar_prefix_home_requests_total.
type homeLabels struct {
	backend string
	outcome clusterscore.HomeOutcome
}

func (m *Metrics) answered(d time.Duration) {
	if m != nil {
		m.answer.Observe(d.Seconds())
	}
}

func (m *Metrics) published(t *routetable.Table, took time.Duration) {
	if m != nil {
		m.generation.Set(float64(t.Generation))
		m.tableErrors.Set(float64(len(t.Errors)))
		refused := map[string]int{routetable.ReasonNotAllowedByListeners: 0, routetable.ReasonNoMatchingListenerHostname: 0, routetable.ReasonNoMatchingParent: 0, routetable.ReasonRefNotPermitted: 0}
		m.unverified.Reset()
		for _, err := range t.Errors {
			var be *routetable.BuildError
			if errors.As(err, &be) {
				if _, ok := refused[be.Reason]; ok {
					refused[be.Reason]++
				}
				if be.Reason == routetable.ReasonUnverifiedEndpointPicker {
					m.unverified.WithLabelValues(be.Namespace+"/"+be.Name, be.Cluster, "refused").Set(1)
				}
			}
		}
		for _, c := range t.Clusters() {
			if c.Unverified {
				m.unverified.WithLabelValues(c.Pool, c.Name, "allowed").Set(1)
			}
		}
		for reason, n := range refused {
			m.refusals.WithLabelValues(reason).Set(float64(n))
		}
		m.buildTime.Observe(took.Seconds())
	}
}

// registerScoringMetrics registers the gauges of the policies' memory,
// read at scrape time.
func registerScoringMetrics(reg prometheus.Registerer, mem *clusterscore.Memory) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(
		gauge("mci_sidecar_prefix_index_bytes", "Memory of the prefix-cache affinity index, allocated once at its capacity.",
			func() float64 { return float64(mem.Prefixes.Bytes()) }),
		gauge("mci_sidecar_prefix_index_capacity_blocks", "Prompt blocks the prefix-cache affinity index holds at most.",
			func() float64 { return float64(mem.Prefixes.Capacity()) }),
		gauge("mci_sidecar_prefix_index_blocks", "Prompt blocks the prefix-cache affinity index holds now.",
			func() float64 { return float64(mem.Prefixes.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "mci_sidecar_prefix_index_evictions_total",
			Help: "Prompt blocks pushed out of the full prefix-cache affinity index by newer ones.",
		}, func() float64 { return float64(mem.Prefixes.Evicted()) }),
		gauge("mci_sidecar_session_pins", "Sessions pinned to a cluster (expired ones included until read or pushed out).",
			func() float64 { return float64(mem.Sessions.Len()) }),
		sharesCollector{mem.Shares},
	)
}

var homeSharesDesc = prometheus.NewDesc("mci_sidecar_prefix_home_shares",
	"The share of its prompt homes a policy with a home bound (PrefixAffinity) deals each cluster of a backend, as last adopted: the clusters' capacities' shares, leveled against the requests the sidecar does not place where their EPPs count them. Absent before the backend's first home decision.",
	[]string{"backend", "cluster"}, nil)

// sharesCollector reads the adopted shares at scrape time.
type sharesCollector struct{ shares *clusterscore.Shares }

func (c sharesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- homeSharesDesc }

func (c sharesCollector) Collect(ch chan<- prometheus.Metric) {
	type share struct {
		backend, cluster string
		v                float64
	}
	var all []share
	c.shares.Each(func(backend, cluster string, v float64) { all = append(all, share{backend, cluster, v}) })
	for _, s := range all {
		ch <- prometheus.MustNewConstMetric(homeSharesDesc, prometheus.GaugeValue, s.v, s.backend, s.cluster)
	}
}

var eppHealthDesc = prometheus.NewDesc("mci_sidecar_epp_healthy",
	"gRPC health of each cluster's EPP as the prober last saw it: 1 serving, 0 not serving; absent while unknown.",
	[]string{"cluster", "pool"}, nil)

// eppHealthCollector derives the health gauges at scrape time from the
// current table and the prober, rather than keeping copies up to date.
type eppHealthCollector struct {
	router *routetable.Router
	health *eppprobe.HealthProber
}

func (c *eppHealthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- eppHealthDesc }

func (c *eppHealthCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[[2]string]bool{}
	for _, cl := range c.router.Table().Clusters() {
		k := [2]string{cl.Name, cl.Pool}
		if seen[k] {
			continue
		}
		v := 0.0
		switch healthOf(c.health, cl.Health) {
		case HealthServing:
			v = 1
		case HealthUnknown:
			continue
		}
		seen[k] = true
		ch <- prometheus.MustNewConstMetric(eppHealthDesc, prometheus.GaugeValue, v, cl.Name, cl.Pool)
	}
}
