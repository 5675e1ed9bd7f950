package sidecar

import (
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/outlier"
	"github.com/mci-dev/mci/pkg/routetable"
)

// OutlierConfig configures the outlier detection of the clusters
// (pkg/outlier): which results eject a cluster and for how long, and the
// first-byte bound.
type OutlierConfig struct {
	Detection outlier.Config
	// FirstByte bounds the wait for a response's first byte; a zero
	// Ceiling sets no bound.
	FirstByte outlier.FirstByteConfig
	// Clock is the time of the detection and of the first-byte bounds;
	// nil: the real one.
	Clock clock.WithDelayedExecution
}

// outlierMetrics are the metrics of outlier detection.
type outlierMetrics struct {
	ejected    *prometheus.GaugeVec
	ejections  *prometheus.CounterVec
	overflows  *prometheus.CounterVec
	firstBytes *prometheus.CounterVec
	lastResort *prometheus.CounterVec
}

func (m *Metrics) outlierMetrics() []prometheus.Collector {
	m.outlier = outlierMetrics{
		ejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mci_sidecar_outlier_ejected",
			Help: "1 while outlier detection keeps a cluster of a pool (namespace/name) out of the choice of new requests, its responses having failed; 0 once its ejection time is over (it takes a probe request again) or it returned.",
		}, []string{"pool", "cluster"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_outlier_ejections_total",
			Help: "Ejections of a cluster by outlier detection, by reason: consecutive_5xx, consecutive_gateway_failure (502, 503, 504, no first byte within the bound), success_rate (well below the pool's other clusters'), failed_probe (the first request after an ejection failed).",
		}, []string{"reason"}),
		overflows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_outlier_ejections_withheld_total",
			Help: "Ejections outlier detection withheld, by reason: a cluster's responses failed, but --outlier-max-ejection-percent of its pool's clusters were ejected already (never all of them), so it stayed in the choice. Counted once until the cluster is ejected or succeeds.",
		}, []string{"reason"}),
		firstBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_first_byte_timeouts_total",
			Help: "Requests routed to a cluster whose response's first byte did not come within the cluster's bound (its recent times to first byte, --outlier-first-byte-*): each counts as a gateway failure of the cluster for outlier detection.",
		}, []string{"cluster"}),
		lastResort: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_sidecar_outlier_last_resort_requests_total",
			Help: "Requests of a backend routed to clusters outlier detection had ejected, because the backend's policy kept no other cluster (every other not serving, not ready, without the model or saturated): ejected clusters are the last resort, not left out.",
		}, []string{"backend"}),
	}
	for _, r := range outlier.Reasons {
		m.outlier.ejections.WithLabelValues(string(r))
		m.outlier.overflows.WithLabelValues(string(r))
	}
	return []prometheus.Collector{m.outlier.ejected, m.outlier.ejections, m.outlier.overflows, m.outlier.firstBytes, m.outlier.lastResort}
}

// outlierLastResort counts a request of backend routed to ejected
// clusters, no other being kept.
func (m *Metrics) outlierLastResort(backend string) {
	if m == nil {
		return
	}
	m.outlier.lastResort.WithLabelValues(backend).Inc()
}

// outlierWatch is the sidecar's outlier detection: it learns what became
// of each request a cluster took (the status of its response, or no first
// byte within the cluster's bound), takes the clusters it ejects out of
// the choice (ejectingState), and says each change once, in a log line
// and the metrics. What a cluster's EPP does (failing, refusing) is not
// its business: passive health takes a failed EPP out until its next good
// probe, and the health checks bring it back within about a second, which
// an ejection would hold back.
type outlierWatch struct {
	det     *outlier.Detector
	clock   clock.WithDelayedExecution
	now     func() time.Time
	bounded bool
	metrics *Metrics
	logger  logr.Logger
	// notInByBackend keeps what the detector does not know to be in the
	// choice of each backend's clusters (notIn).
	notInByBackend byBackend[*backendNotIn]
}

// newOutlierWatch returns the detection cfg configures; nil for none.
func newOutlierWatch(cfg *OutlierConfig, metrics *Metrics, logger logr.Logger) *outlierWatch {
	if cfg == nil {
		return nil
	}
	w := &outlierWatch{clock: cfg.Clock, bounded: cfg.FirstByte.Ceiling > 0, metrics: metrics, logger: logger}
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	w.now = w.clock.Now
	w.det = outlier.New(cfg.Detection, cfg.FirstByte, w.changed)
	return w
}

func outlierKey(c *routetable.Cluster) outlier.Key {
	return outlier.Key{Pool: c.Pool, Cluster: c.Name}
}

// changed says a change of a cluster's ejection: a log line, the metrics.
func (w *outlierWatch) changed(e outlier.Event) {
	m := w.metrics
	switch e.Kind {
	case outlier.EventEjected:
		if m != nil {
			m.outlier.ejected.WithLabelValues(e.Pool, e.Cluster).Set(1)
			m.outlier.ejections.WithLabelValues(string(e.Reason)).Inc()
		}
		w.logger.Info("Cluster ejected: its responses fail; new requests go to the pool's other clusters (mci_sidecar_outlier_ejected is 1)",
			"pool", e.Pool, "cluster", e.Cluster, "reason", e.Reason, "for", e.For, "ejections", e.Ejections)
	case outlier.EventProbing:
		if m != nil {
			m.outlier.ejected.WithLabelValues(e.Pool, e.Cluster).Set(0)
		}
		w.logger.Info("Cluster's ejection is over: it takes one request at a time until one succeeds", "pool", e.Pool, "cluster", e.Cluster)
	case outlier.EventReturned:
		w.logger.Info("Cluster returned: a request after its ejection succeeded", "pool", e.Pool, "cluster", e.Cluster)
	case outlier.EventOverflow:
		w.logger.Info("Cluster's responses fail, but it stays in the choice: as many of its pool's clusters as --outlier-max-ejection-percent allows are ejected already (counted in mci_sidecar_outlier_ejections_withheld_total; said again after it is ejected or succeeds)",
			"pool", e.Pool, "cluster", e.Cluster, "reason", e.Reason)
	}
	if e.Kind == outlier.EventOverflow && m != nil {
		m.outlier.overflows.WithLabelValues(string(e.Reason)).Inc()
	}
}

// retain forgets the clusters t no longer has.
func (w *outlierWatch) retain(t *routetable.Table) {
	if w == nil {
		return
	}
	keep := map[outlier.Key]bool{}
	for _, c := range t.Clusters() {
		keep[outlierKey(c)] = true
	}
	w.det.Retain(func(k outlier.Key) bool {
		if !keep[k] && w.metrics != nil {
			w.metrics.outlier.ejected.DeleteLabelValues(k.Pool, k.Cluster)
		}
		return keep[k]
	})
}

// routed starts following a request c took, until its first byte.
func (w *outlierWatch) routed(c *routetable.Cluster) *outlierRequest {
	if w == nil {
		return nil
	}
	k, now := outlierKey(c), w.clock.Now()
	w.det.Sent(k, now)
	r := &outlierRequest{w: w, key: k, sent: now}
	if w.bounded {
		bound := w.det.FirstByteBound(k)
		deadline := now.Add(bound)
		// The callback does not read the clock: a fake one calls it
		// with its lock held.
		r.timer = w.clock.AfterFunc(bound, func() { r.timedOut(deadline) })
	}
	return r
}

// outlierRequest is one request a cluster took, followed until its first
// byte, which tells its result, or its bound, which makes it a gateway
// failure: exactly one result, or none when the stream ends without
// either.
type outlierRequest struct {
	w     *outlierWatch
	key   outlier.Key
	sent  time.Time
	timer clock.Timer

	mu   sync.Mutex
	done bool
}

// firstByte notes the response headers, of status code (0: unreadable).
func (r *outlierRequest) firstByte(code int) {
	now := r.w.clock.Now()
	r.mu.Lock()
	first := !r.done
	r.done = true
	r.mu.Unlock()
	r.stop()
	// A first byte after the bound still tells how long the cluster
	// takes.
	r.w.det.FirstByte(r.key, now.Sub(r.sent), now)
	switch {
	case !first:
	case code == 0:
		r.w.det.NoResult(r.key)
	default:
		r.w.det.Record(r.key, outlier.ResultOfStatus(code), now)
	}
}

func (r *outlierRequest) timedOut(deadline time.Time) {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	r.done = true
	r.mu.Unlock()
	if m := r.w.metrics; m != nil {
		m.outlier.firstBytes.WithLabelValues(r.key.Cluster).Inc()
	}
	r.w.logger.V(2).Info("No first byte within the cluster's bound: a gateway failure of the cluster", "pool", r.key.Pool, "cluster", r.key.Cluster, "bound", deadline.Sub(r.sent))
	r.w.det.Record(r.key, outlier.GatewayFailure, deadline)
}

// end ends the request's stream: without a first byte, nothing is known of
// it.
func (r *outlierRequest) end() {
	r.mu.Lock()
	first := !r.done
	r.done = true
	r.mu.Unlock()
	r.stop()
	if first {
		r.w.det.NoResult(r.key)
	}
}

func (r *outlierRequest) stop() {
	if r.timer != nil {
		r.timer.Stop()
	}
}

// ejectingState is the State the policies read, in which a cluster that
// outlier detection ejected is HealthEjected: every policy drops it
// (clusterscore), and a FailOpen backend tries it last.
type ejectingState struct {
	State
	w *outlierWatch
}

func (s ejectingState) Read(clusters []*routetable.Cluster, at []int, cands []clusterscore.Candidate, pools bool) {
	s.State.Read(clusters, at, cands, pools)
	notIn := s.w.notIn(clusters)
	if at == nil {
		for _, i := range notIn {
			if s.w.det.Ejected(outlierKey(clusters[i]), s.w.now) {
				cands[i].Health = clusterscore.HealthEjected
			}
		}
		return
	}
	for k, i := range at {
		if _, in := slices.BinarySearch(notIn, i); in && s.w.det.Ejected(outlierKey(clusters[i]), s.w.now) {
			cands[k].Health = clusterscore.HealthEjected
		}
	}
}

// notIn are the indices of the clusters that the detector does not know
// to be in the choice (Detector.NotIn): kept for each backend while the
// detector's Changes stay, so that a pick asks Ejected of those few only.
func (w *outlierWatch) notIn(clusters []*routetable.Cluster) []int {
	if len(clusters) == 0 {
		return nil
	}
	if kept, ok := w.notInByBackend.load(clusters); ok && kept.n == len(clusters) && kept.version == w.det.Changes() {
		return kept.notIn
	}
	kept := &backendNotIn{n: len(clusters)}
	kept.notIn, kept.version = w.det.NotIn(len(clusters), func(i int) outlier.Key { return outlierKey(clusters[i]) }, nil)
	w.notInByBackend.store(clusters, kept)
	return kept.notIn
}

// backendNotIn is what Detector.NotIn found of a backend's n clusters at
// one version of the detector's clusters.
type backendNotIn struct {
	n       int
	version uint64
	notIn   []int
}
