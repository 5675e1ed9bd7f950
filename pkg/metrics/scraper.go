package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/poll"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// ScraperOptions configures a Scraper. Zero fields take the defaults.
type ScraperOptions struct {
	// Interval is the pause between the end of one scrape of a target and the
	// start of the next. Default 100ms: vLLM queues change within a second,
	// and a scrape is one small HTTP request on a kept-alive connection.
	Interval time.Duration
	// Timeout bounds one scrape. Default 1s. Keep it well below the
	// scheduler's staleness bound so that a hung server turns stale, and so
	// unknown, while its last metrics are still on record.
	Timeout time.Duration
	// MaxResponseBytes bounds the body of a /metrics response. Default 16 MiB,
	// far above what vLLM serves; past it the scrape fails rather than parse
	// a truncated exposition.
	MaxResponseBytes int64
	// Client does the requests. Default: a client of its own that never uses
	// an HTTP proxy from the environment (model servers are scraped
	// directly) and keeps connections alive between scrapes.
	Client *http.Client
}

// Defaults of ScraperOptions.
const (
	DefaultInterval         = 100 * time.Millisecond
	DefaultTimeout          = time.Second
	DefaultMaxResponseBytes = 16 << 20
)

// Scraper keeps the latest metrics of each of a set of vLLM /metrics
// endpoints, on a poll.Poller: each target is scraped by a goroutine of its
// own, so a slow or hung server does not delay the others. Targets can be
// added and removed at any time, before or while Run runs. All methods are
// safe for concurrent use.
type Scraper struct {
	timeout  time.Duration
	maxBytes int64
	client   *http.Client
	poller   *poll.Poller[scheduling.Metrics]

	// mu serializes changes of the target set.
	mu sync.Mutex
	// failing holds the targets whose last scrape failed, so that the
	// changes between failing and succeeding are logged rather than every
	// failure; a target's entry is written only by its own goroutine.
	failing sync.Map
}

// NewScraper returns a scraper with no targets.
func NewScraper(opts ScraperOptions) *Scraper {
	s := &Scraper{
		timeout:  cmp.Or(opts.Timeout, DefaultTimeout),
		maxBytes: opts.MaxResponseBytes,
		client:   opts.Client,
	}
	if s.timeout < 0 {
		s.timeout = DefaultTimeout
	}
	if s.maxBytes <= 0 {
		s.maxBytes = DefaultMaxResponseBytes
	}
	if s.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		s.client = &http.Client{Transport: tr}
	}
	interval := opts.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	s.poller = poll.New(interval, s.scrapeOnce)
	s.poller.Forget = func(url string) { s.failing.Delete(url) }
	return s
}

// Run scrapes the targets until ctx is done, then waits for the scrapes in
// flight to end. It returns an error if the scraper is already running.
func (s *Scraper) Run(ctx context.Context) error {
	if err := s.poller.Run(ctx); err != nil {
		return fmt.Errorf("scraper: %w", err)
	}
	if tr, ok := s.client.Transport.(interface{ CloseIdleConnections() }); ok {
		tr.CloseIdleConnections()
	}
	return nil
}

// validTarget checks that rawURL is an http or https URL with a host.
func validTarget(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("target %q: %w", rawURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("target %q: want an http or https URL with a host", rawURL)
	}
	return nil
}

// AddTarget starts scraping the /metrics endpoint at rawURL (http or https).
// Adding a target that is already there does nothing. Until its first
// successful scrape the target has no metrics.
func (s *Scraper) AddTarget(rawURL string) error {
	if err := validTarget(rawURL); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.poller.Has(rawURL) {
		s.poller.Set(append(s.poller.Keys(), rawURL))
	}
	return nil
}

// RemoveTarget stops scraping rawURL and forgets its metrics.
func (s *Scraper) RemoveTarget(rawURL string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.poller.Has(rawURL) {
		s.poller.Set(slices.DeleteFunc(s.poller.Keys(), func(u string) bool { return u == rawURL }))
	}
}

// SetTargets makes the targets exactly the valid ones of urls: new ones are
// added, missing ones removed, and the others keep their metrics and
// goroutines. Invalid URLs are left out and reported.
func (s *Scraper) SetTargets(urls []string) error {
	var errs []error
	valid := make([]string, 0, len(urls))
	for _, u := range urls {
		if err := validTarget(u); err != nil {
			errs = append(errs, err)
			continue
		}
		valid = append(valid, u)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.poller.Set(valid)
	return errors.Join(errs...)
}

// Targets returns the URLs being scraped, in no particular order.
func (s *Scraper) Targets() []string { return s.poller.Keys() }

// Get returns the latest metrics of a target: nil if it is not a target or
// has never been scraped successfully. After a failed scrape it keeps
// returning the last good metrics with their old UpdatedAt, so that they turn
// stale (unknown to the scheduler) instead of looking idle. The returned
// value must not be modified.
func (s *Scraper) Get(rawURL string) *scheduling.Metrics { return s.poller.Get(rawURL) }

// Snapshot returns the latest metrics of every target, keyed by URL, with nil
// for targets never scraped successfully. The values must not be modified.
func (s *Scraper) Snapshot() map[string]*scheduling.Metrics {
	keys := s.poller.Keys()
	snap := make(map[string]*scheduling.Metrics, len(keys))
	for _, u := range keys {
		snap[u] = s.poller.Get(u)
	}
	return snap
}

// scrapeOnce is the poller's check of one target: an error keeps the last
// metrics, which go stale.
func (s *Scraper) scrapeOnce(ctx context.Context, url string) (*scheduling.Metrics, error) {
	started := time.Now()
	m, err := s.scrape(ctx, url)
	if ctx.Err() != nil {
		// Removed or stopping: an error now says nothing about the server.
		return nil, ctx.Err()
	}
	logger := klog.FromContext(ctx).WithValues("target", url)
	if err != nil {
		if _, failing := s.failing.LoadOrStore(url, struct{}{}); !failing {
			logger.V(2).Info("Scraping model server metrics failed; keeping the last metrics until they go stale", "err", err)
		}
		return nil, err
	}
	if _, failing := s.failing.LoadAndDelete(url); failing {
		logger.V(2).Info("Scraping model server metrics recovered")
	}
	// The server measured these metrics at some point during the scrape;
	// its start is the conservative time for staleness.
	m.UpdatedAt = started
	return m, nil
}

func (s *Scraper) scrape(ctx context.Context, rawURL string) (*scheduling.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, err
	}
	// The text format, which is what vLLM serves and Parse reads.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() {
		// Drain what is left (bounded) so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", rawURL, resp.Status)
	}
	m, err := Parse(LimitReader(resp.Body, s.maxBytes))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", rawURL, err)
	}
	return m, nil
}
