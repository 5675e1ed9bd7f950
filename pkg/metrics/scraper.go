package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

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
// endpoints. Each target is scraped by a goroutine of its own, so a slow or
// hung server does not delay the others. Targets can be added and removed at
// any time, before or while Run runs. All methods are safe for concurrent use.
type Scraper struct {
	interval time.Duration
	timeout  time.Duration
	maxBytes int64
	client   *http.Client

	mu      sync.RWMutex
	targets map[string]*target
	// runCtx is the context of the running Run, nil when not running.
	runCtx context.Context
	wg     sync.WaitGroup
}

type target struct {
	url     string
	cancel  context.CancelFunc
	metrics atomic.Pointer[scheduling.Metrics]
	// failing is only used by the target's own goroutine, to log the
	// changes between failing and succeeding rather than every failure.
	failing bool
}

// NewScraper returns a scraper with no targets.
func NewScraper(opts ScraperOptions) *Scraper {
	s := &Scraper{
		interval: opts.Interval,
		timeout:  opts.Timeout,
		maxBytes: opts.MaxResponseBytes,
		client:   opts.Client,
		targets:  map[string]*target{},
	}
	if s.interval <= 0 {
		s.interval = DefaultInterval
	}
	if s.timeout <= 0 {
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
	return s
}

// Run scrapes the targets until ctx is done, then waits for the scrapes in
// flight to end. It returns an error if the scraper is already running.
func (s *Scraper) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.runCtx != nil {
		s.mu.Unlock()
		return errors.New("scraper is already running")
	}
	s.runCtx = ctx
	for _, t := range s.targets {
		s.start(t)
	}
	s.mu.Unlock()

	<-ctx.Done()

	s.mu.Lock()
	s.runCtx = nil
	s.mu.Unlock()
	s.wg.Wait()
	if s.client.Transport != nil {
		if tr, ok := s.client.Transport.(interface{ CloseIdleConnections() }); ok {
			tr.CloseIdleConnections()
		}
	}
	return nil
}

// AddTarget starts scraping the /metrics endpoint at rawURL (http or https).
// Adding a target that is already there does nothing. Until its first
// successful scrape the target has no metrics.
func (s *Scraper) AddTarget(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("target %q: %w", rawURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("target %q: want an http or https URL with a host", rawURL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.targets[rawURL]; ok {
		return nil
	}
	t := &target{url: rawURL}
	s.targets[rawURL] = t
	if s.runCtx != nil {
		s.start(t)
	}
	return nil
}

// RemoveTarget stops scraping rawURL and forgets its metrics.
func (s *Scraper) RemoveTarget(rawURL string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.targets[rawURL]; ok {
		delete(s.targets, rawURL)
		if t.cancel != nil {
			t.cancel()
		}
	}
}

// SetTargets makes the targets exactly urls: new ones are added, missing ones
// removed, and the others keep their metrics and goroutines.
func (s *Scraper) SetTargets(urls []string) error {
	want := make(map[string]bool, len(urls))
	for _, u := range urls {
		want[u] = true
	}
	var errs []error
	for _, u := range urls {
		errs = append(errs, s.AddTarget(u))
	}
	for _, u := range s.Targets() {
		if !want[u] {
			s.RemoveTarget(u)
		}
	}
	return errors.Join(errs...)
}

// Targets returns the URLs being scraped, in no particular order.
func (s *Scraper) Targets() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	urls := make([]string, 0, len(s.targets))
	for u := range s.targets {
		urls = append(urls, u)
	}
	return urls
}

// Get returns the latest metrics of a target: nil if it is not a target or
// has never been scraped successfully. After a failed scrape it keeps
// returning the last good metrics with their old UpdatedAt, so that they turn
// stale (unknown to the scheduler) instead of looking idle. The returned
// value must not be modified.
func (s *Scraper) Get(rawURL string) *scheduling.Metrics {
	s.mu.RLock()
	t := s.targets[rawURL]
	s.mu.RUnlock()
	if t == nil {
		return nil
	}
	return t.metrics.Load()
}

// Snapshot returns the latest metrics of every target, keyed by URL, with nil
// for targets never scraped successfully. The values must not be modified.
func (s *Scraper) Snapshot() map[string]*scheduling.Metrics {
	s.mu.RLock()
	defer s.mu.RUnlock()
	snap := make(map[string]*scheduling.Metrics, len(s.targets))
	for u, t := range s.targets {
		snap[u] = t.metrics.Load()
	}
	return snap
}

// start runs t's scrape loop under the running context. s.mu must be held
// for writing and s.runCtx set.
func (s *Scraper) start(t *target) {
	ctx, cancel := context.WithCancel(s.runCtx)
	t.cancel = cancel
	logger := klog.FromContext(ctx).WithValues("target", t.url)
	ctx = klog.NewContext(ctx, logger)
	s.wg.Go(func() {
		defer cancel()
		// Sliding: the interval starts when a scrape ends, so scrapes of one
		// target never overlap however slow the server is.
		wait.UntilWithContext(ctx, func(ctx context.Context) { s.scrapeOnce(ctx, t) }, s.interval)
	})
}

func (s *Scraper) scrapeOnce(ctx context.Context, t *target) {
	started := time.Now()
	m, err := s.scrape(ctx, t.url)
	if ctx.Err() != nil {
		// Removed or stopping: an error now says nothing about the server.
		return
	}
	logger := klog.FromContext(ctx)
	if err != nil {
		if !t.failing {
			logger.V(2).Info("Scraping model server metrics failed; keeping the last metrics until they go stale", "err", err)
			t.failing = true
		}
		return
	}
	if t.failing {
		logger.V(2).Info("Scraping model server metrics recovered")
		t.failing = false
	}
	// The server measured these metrics at some point during the scrape;
	// its start is the conservative time for staleness.
	m.UpdatedAt = started
	t.metrics.Store(m)
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
