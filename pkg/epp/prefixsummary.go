package epp

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mci-dev/mci/pkg/promptprefix"
)

// PrefixSummaryInterval is how long a built prefix summary is served
// before the next request builds it again: building reads the whole
// prefix index (a few milliseconds), so however many importers ask, it is
// built at most once a second.
const PrefixSummaryInterval = time.Second

// prefixSummary serves the picker's prompt prefix summary on the metrics
// URL to a scraper that accepts promptprefix.SummaryContentType: the
// importing clusters' sidecars, which learn from it the prefixes that
// traffic they do not route left in this pool's servers. It answers 304
// to a scraper that already holds the summary (If-None-Match its ETag), so
// an idle pool costs them a header, not the filter.
type prefixSummary struct {
	picker *Picker
	now    func() time.Time

	mu      sync.Mutex
	builtAt time.Time
	encoded []byte
	etag    string

	blocks, bytes prometheus.Gauge
	served        *prometheus.CounterVec
	sentBytes     prometheus.Counter
}

func newPrefixSummary(picker *Picker, reg prometheus.Registerer) *prefixSummary {
	h := &prefixSummary{
		picker: picker,
		now:    time.Now,
		blocks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_epp_prefix_summary_blocks",
			Help: "Prompt blocks in the prefix summary last built for the importing clusters (at most the summary's bound; the most recent ones).",
		}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mci_epp_prefix_summary_bytes",
			Help: "Size of the prefix summary last built, encoded.",
		}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mci_epp_prefix_summary_requests_total",
			Help: "Requests for the prefix summary, by result: sent, or unchanged (304: the scraper held it already).",
		}, []string{"result"}),
		sentBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mci_epp_prefix_summary_sent_bytes_total",
			Help: "Bytes of prefix summaries sent (the body of each answer that was not a 304): what the summaries cost the network.",
		}),
	}
	reg.MustRegister(h.blocks, h.bytes, h.served, h.sentBytes)
	return h
}

// current returns the summary's encoding and ETag, built again when the
// last one is older than PrefixSummaryInterval.
func (h *prefixSummary) current() ([]byte, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if h.encoded != nil && now.Sub(h.builtAt) < PrefixSummaryInterval {
		return h.encoded, h.etag
	}
	s := h.picker.PrefixSummary(promptprefix.MaxSummaryBlocks)
	// A new slice each time: a response still writing the last one keeps it.
	encoded, _ := s.AppendBinary(make([]byte, 0, s.Bytes()))
	h.encoded, h.builtAt = encoded, now
	h.etag = `"` + strconv.FormatUint(xxhash.Sum64(encoded), 16) + `"`
	h.blocks.Set(float64(s.Blocks()))
	h.bytes.Set(float64(len(encoded)))
	return h.encoded, h.etag
}

func (h *prefixSummary) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	encoded, etag := h.current()
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		h.served.WithLabelValues("unchanged").Inc()
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.served.WithLabelValues("sent").Inc()
	h.sentBytes.Add(float64(len(encoded)))
	w.Header().Set("Content-Type", promptprefix.SummaryContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(encoded)))
	_, _ = w.Write(encoded)
}
