package eppprobe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/promptprefix"
)

// DefaultPrefixSummaryInterval is how often an EPP's prompt prefix summary
// is asked for: at most 32 KiB every 5 s, 6.4 KiB/s a pool, and a header
// when nothing changed.
const DefaultPrefixSummaryInterval = 5 * time.Second

// Results of asking an EPP for its prefix summary: the result label of
// mci_sidecar_epp_prefix_summary_fetches_total.
const (
	// SummaryFetched: a new summary was read.
	SummaryFetched = "fetched"
	// SummaryDelta: the EPP sent the bits that flipped since the summary
	// held, which made the new one.
	SummaryDelta = "delta"
	// SummaryUnchanged: the EPP answered that the summary held is current.
	SummaryUnchanged = "unchanged"
	// SummaryNotPublished: the EPP publishes none (an upstream EPP: it
	// answers its Prometheus exposition, or refuses the media type). Its
	// clusters are scored on this sidecar's own observations alone.
	SummaryNotPublished = "not_published"
	// SummaryRefused: what the EPP sent is not a summary this sidecar
	// reads (ParseSummary's errors), or is too large, or is a delta that
	// does not apply to the summary held (ApplyDelta's errors); the
	// summary held is dropped, so that the next ask is sent it whole.
	SummaryRefused = "refused"
	// SummaryFailed: no answer, or an error status; the summary held is
	// dropped with it.
	SummaryFailed = "failed"
)

// summaryFetch is the outcome of the last time a URL's summary was asked
// for, carried from scrape to scrape until the next one.
type summaryFetch struct {
	summary *promptprefix.Summary
	etag    string
	at      time.Time
	result  string
	err     error
}

// newSummaryFetches is mci_sidecar_epp_prefix_summary_fetches_total.
func newSummaryFetches() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mci_sidecar_epp_prefix_summary_fetches_total",
		Help: "Requests for the EPPs' prompt prefix summaries, by result: fetched (whole), delta (the bits that flipped since the summary held), unchanged, not_published (the EPP publishes none: its clusters are scored on this sidecar's own observations alone), refused (not a summary this sidecar reads), failed.",
	}, []string{"result"})
}

// SummaryFetches is mci_sidecar_epp_prefix_summary_fetches_total, for the
// caller's registry.
func (s *PoolScraper) SummaryFetches() prometheus.Collector { return s.summaryFetches }

// prefixSummary asks url's EPP for its prefix summary when the last ask
// (prev) is an interval old, else carries prev over. It asks only after a
// good scrape of the same URL, with the same client and token.
func (s *PoolScraper) prefixSummary(ctx context.Context, url string, prev summaryFetch, now time.Time) summaryFetch {
	if s.summaryInterval < 0 || (!prev.at.IsZero() && now.Sub(prev.at) < s.summaryInterval) {
		return prev
	}
	f := s.fetchSummary(ctx, url, prev)
	f.at = now
	s.summaryFetches.WithLabelValues(f.result).Inc()
	if f.read() != prev.read() || (!f.read() && f.result != prev.result) {
		logger := klog.FromContext(ctx).WithValues("url", url, "result", f.result)
		switch {
		case f.read():
			logger.Info("Reading the prompt prefix summary of an EPP: its clusters are scored on the prefixes it reports beside this sidecar's own observations", "blocks", f.summary.Blocks())
		case f.result == SummaryNotPublished:
			logger.Info("An EPP publishes no prompt prefix summary: its clusters are scored on this sidecar's own observations alone", "err", f.err)
		default:
			logger.Info("Cannot read the prompt prefix summary of an EPP: its clusters are scored on this sidecar's own observations alone until it can", "err", f.err)
		}
	}
	return f
}

// read reports whether the fetch left a summary read: the EPP's
// summary is read, whichever way it came, and said once until it is not.
func (f summaryFetch) read() bool {
	return f.result == SummaryFetched || f.result == SummaryDelta || f.result == SummaryUnchanged
}

// summaryAccept is what a scraper that holds a summary accepts: the
// summary, or the delta from the one held.
var summaryAccept = promptprefix.SummaryContentType + ", " + promptprefix.SummaryDeltaContentType

// fetchSummary asks once, sending the ETag of the summary held.
func (s *PoolScraper) fetchSummary(ctx context.Context, url string, prev summaryFetch) summaryFetch {
	failed := func(result string, err error) summaryFetch { return summaryFetch{result: result, err: err} }
	client, err := s.clients.Get(url)
	if err != nil {
		return failed(SummaryFailed, err)
	}
	token, _, err := s.bearerToken(url)
	if err != nil {
		return failed(SummaryFailed, err)
	}
	etag, accept := "", promptprefix.SummaryContentType
	if prev.summary != nil {
		etag, accept = prev.etag, summaryAccept
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.get(ctx, client, url, token, accept, etag)
	if err != nil {
		return failed(SummaryFailed, err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode == http.StatusNotModified && etag != "":
		return summaryFetch{summary: prev.summary, etag: etag, result: SummaryUnchanged}
	case resp.StatusCode == http.StatusOK && mediaType == promptprefix.SummaryDeltaContentType:
		// Without a summary held (none asked for) a delta applies to
		// nothing, and is refused as one that does not apply.
		return s.applyDelta(url, resp, prev)
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusNotAcceptable ||
		(resp.StatusCode == http.StatusOK && mediaType != promptprefix.SummaryContentType):
		return failed(SummaryNotPublished, fmt.Errorf("GET %s as %s: %s, %q", url, promptprefix.SummaryContentType, resp.Status, mediaType))
	case resp.StatusCode != http.StatusOK:
		return failed(SummaryFailed, fmt.Errorf("GET %s as %s: %s", url, promptprefix.SummaryContentType, resp.Status))
	}
	return readSummary(url, resp, SummaryFetched, promptprefix.ParseSummary)
}

// applyDelta reads the delta an EPP sent and applies it to the summary
// held.
func (s *PoolScraper) applyDelta(url string, resp *http.Response, prev summaryFetch) summaryFetch {
	return readSummary(url, resp, SummaryDelta, func(data []byte) (*promptprefix.Summary, error) {
		return promptprefix.ApplyDelta(prev.summary, data)
	})
}

// readSummary reads the body of an answer with a summary or a delta, and
// makes the summary with parse.
func readSummary(url string, resp *http.Response, result string, parse func([]byte) (*promptprefix.Summary, error)) summaryFetch {
	failed := func(result string, err error) summaryFetch { return summaryFetch{result: result, err: err} }
	data, err := io.ReadAll(io.LimitReader(resp.Body, promptprefix.MaxSummaryBytes+1))
	if err != nil {
		return failed(SummaryFailed, fmt.Errorf("GET %s: reading the summary: %w", url, err))
	}
	summary, err := parse(data)
	if err != nil {
		if errors.Is(err, promptprefix.ErrBadSummary) {
			return failed(SummaryRefused, fmt.Errorf("GET %s: %w", url, err))
		}
		return failed(SummaryFailed, err)
	}
	return summaryFetch{summary: summary, etag: resp.Header.Get("ETag"), result: result}
}
