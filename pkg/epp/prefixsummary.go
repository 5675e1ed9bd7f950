package epp

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
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

// PrefixSummaryHistory is how many summaries built lately are kept (at
// most 32 KiB each), so that a scraper holding one of them is sent how the
// current one differs from it: the builds of the last few seconds, which
// a sidecar asking every 5 s holds, whoever else asks between.
const PrefixSummaryHistory = 8

// prefixSummary serves the picker's prompt prefix summary on the metrics
// URL to a scraper that accepts promptprefix.SummaryContentType: the
// importing clusters' sidecars, which learn from it the prefixes that
// traffic they do not route left in this pool's servers. It answers 304
// to a scraper that already holds the summary (If-None-Match its ETag), so
// an idle pool costs them a header, not the filter; and to one that holds
// a summary built lately and accepts promptprefix.SummaryDeltaContentType,
// the bits that flipped since, where they are fewer than the filter's
// bytes.
type prefixSummary struct {
	picker *Picker
	now    func() time.Time

	mu      sync.Mutex
	builtAt time.Time
	encoded []byte
	etag    string
	// built are the summaries built lately, the current one last.
	built []builtSummary
	// deltas are the deltas to the current summary from the ETags that
	// asked, made once however many scrapers hold the same one.
	deltas map[string][]byte

	blocks, bytes prometheus.Gauge
	served        *prometheus.CounterVec
	sentBytes     prometheus.Counter
}

// builtSummary is a summary built, by the ETag it was served with.
type builtSummary struct {
	summary *promptprefix.Summary
	etag    string
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
			Help: "Requests for the prefix summary, by result: sent (whole), delta (the bits that flipped since the summary the scraper held), or unchanged (304: the scraper held it already).",
		}, []string{"result"}),
		sentBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mci_epp_prefix_summary_sent_bytes_total",
			Help: "Bytes of prefix summaries and their deltas sent (the body of each answer that was not a 304): what the summaries cost the network.",
		}),
	}
	reg.MustRegister(h.blocks, h.bytes, h.served, h.sentBytes)
	return h
}

// current returns the summary's encoding and ETag, built again when the
// last one is older than PrefixSummaryInterval, and the delta to it from
// the summary of ETag held, when one was built lately, the scraper
// accepts deltas and the delta is the smaller; nil otherwise.
func (h *prefixSummary) current(held string, acceptsDelta bool) (encoded []byte, etag string, delta []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if h.encoded == nil || now.Sub(h.builtAt) >= PrefixSummaryInterval {
		h.build(now)
	}
	if !acceptsDelta || held == "" || held == h.etag {
		return h.encoded, h.etag, nil
	}
	if d, ok := h.deltas[held]; ok {
		return h.encoded, h.etag, d
	}
	for _, b := range h.built[:len(h.built)-1] {
		if b.etag != held {
			continue
		}
		// Kept when none could be made too, so that it is tried once:
		// at most one a summary kept, whatever the scrapers send.
		delta, _ = h.built[len(h.built)-1].summary.AppendDelta(nil, b.summary)
		h.deltas[held] = delta
		break
	}
	return h.encoded, h.etag, delta
}

// build builds the summary again, keeping the last ones built.
func (h *prefixSummary) build(now time.Time) {
	s := h.picker.PrefixSummary(promptprefix.MaxSummaryBlocks)
	// A new slice each time: a response still writing the last one keeps it.
	encoded, _ := s.AppendBinary(make([]byte, 0, s.Bytes()))
	etag := `"` + strconv.FormatUint(xxhash.Sum64(encoded), 16) + `"`
	h.encoded, h.builtAt = encoded, now
	h.blocks.Set(float64(s.Blocks()))
	h.bytes.Set(float64(len(encoded)))
	if etag == h.etag {
		return
	}
	h.etag, h.deltas = etag, map[string][]byte{}
	if len(h.built) == PrefixSummaryHistory {
		h.built = slices.Delete(h.built, 0, 1)
	}
	h.built = append(h.built, builtSummary{summary: s, etag: etag})
}

func (h *prefixSummary) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	held := r.Header.Get("If-None-Match")
	encoded, etag, delta := h.current(held, acceptsDeltas(r.Header.Values("Accept")))
	w.Header().Set("ETag", etag)
	contentType, result := promptprefix.SummaryContentType, "sent"
	switch {
	case held == etag:
		h.served.WithLabelValues("unchanged").Inc()
		w.WriteHeader(http.StatusNotModified)
		return
	case delta != nil:
		encoded, contentType, result = delta, promptprefix.SummaryDeltaContentType, "delta"
	}
	h.served.WithLabelValues(result).Inc()
	h.sentBytes.Add(float64(len(encoded)))
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(encoded)))
	_, _ = w.Write(encoded)
}

// acceptsDeltas reports whether the Accept header lists
// promptprefix.SummaryDeltaContentType.
func acceptsDeltas(accept []string) bool {
	for _, values := range accept {
		for v := range strings.SplitSeq(values, ",") {
			mediaType, _, _ := strings.Cut(v, ";")
			if strings.TrimSpace(mediaType) == promptprefix.SummaryDeltaContentType {
				return true
			}
		}
	}
	return false
}
