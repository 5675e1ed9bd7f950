package eppprobe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/transport"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/credexpiry"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/poll"
)

// maxPoolMetricsBytes bounds an EPP's /metrics page; past it the scrape is
// unparseable rather than read as a shorter page.
const maxPoolMetricsBytes = 4 << 20

// MetricsState is what the sidecar knows of a cluster's pool metrics: the
// state label of mci_sidecar_epp_metrics_state.
type MetricsState string

const (
	// MetricsFresh: the pool's gauges were read and are younger than the
	// staleness bound. Only such a cluster is measured for MetricsBased.
	MetricsFresh MetricsState = "fresh"
	// MetricsStale: no fresh gauges and no failure to blame: not scraped
	// yet, or the last good gauges are older than the staleness bound.
	MetricsStale MetricsState = "stale"
	// MetricsUnauthorized: the EPP answered 401 or 403: it wants a bearer
	// token the sidecar does not have, or does not accept the one sent.
	MetricsUnauthorized MetricsState = "unauthorized"
	// MetricsUnreachable: no answer (connection, TLS, timeout, unusable
	// credentials), or an HTTP status other than 200, 401 and 403.
	MetricsUnreachable MetricsState = "unreachable"
	// MetricsUnparseable: the page is not a Prometheus text exposition, is
	// too large, or has no pool gauges (for this pool) under either naming
	// scheme.
	MetricsUnparseable MetricsState = "unparseable"
)

// MetricsStates are all the states, in the order the metric lists them.
var MetricsStates = []MetricsState{MetricsFresh, MetricsStale, MetricsUnauthorized, MetricsUnreachable, MetricsUnparseable}

// PoolScraperOptions configure a PoolScraper. Zero durations take the
// defaults.
type PoolScraperOptions struct {
	// Credentials say how each URL is reached and which bearer token its
	// credentials Secret names; nil: plaintext, and the token file only.
	Credentials       *epptransport.Credentials
	Interval, Timeout time.Duration
	// Staleness is how old gauges may be and still be fresh: MetricsBased's
	// scheduling.Config.MetricsStaleness.
	Staleness time.Duration
	// TokenFile, when set, holds the sidecar's own bearer token (a
	// projected ServiceAccount token with an audience of its own and a
	// short expiry): sent to an EPP whose pool names no token Secret only
	// over verified TLS, and only to an in-cluster EPP (a local pool's,
	// not an ExternalName) or one TokenRecipients names. It is re-read
	// when the kubelet may have rotated it, and at once after a 401.
	TokenFile string
	// TokenRecipients name the EPPs beyond the in-cluster ones that may
	// get the token of TokenFile (still over verified TLS only): a cluster
	// name (every pool's EPP of that cluster, local ExternalName ones
	// included for the local cluster) or cluster/namespace/name (one pool
	// of that cluster). See ParseTokenRecipient.
	TokenRecipients []string
	// PrefixSummaryInterval is how often each EPP is asked for its prompt
	// prefix summary, after a good scrape, at the same URL with the same
	// credentials; 0: DefaultPrefixSummaryInterval; negative: never.
	PrefixSummaryInterval time.Duration
}

// PoolScraper keeps the pool metrics each EPP metrics URL serves, and the
// outcome of its last scrape. A failed scrape keeps the last gauges, whose
// age then makes them stale; the failure is reported at once (State, a log
// line per change of outcome, mci_sidecar_epp_metrics_state).
//
// A scrape sends a bearer token, as upstream EPPs require on /metrics by
// default: the `token` of the cluster's credentials Secret when it has one,
// else the token of TokenFile, else none.
type PoolScraper struct {
	poller    *poll.Poller[scrapeResult]
	client    *http.Client
	timeout   time.Duration
	staleness time.Duration
	// tokenFile is the file token's source; nil: no file token.
	tokenFile transport.ResettableTokenSource
	// recipients are TokenRecipients: cluster names, and
	// cluster/namespace/name of pools.
	recipients map[string]bool
	creds      *epptransport.Credentials

	// clients keeps the client of each URL: the shared one for plaintext,
	// else one with the URL's credentials, made anew when they change.
	clients *epptransport.Conns[*http.Client]

	// expiries caches the exp claim of the tokens sent, so that a token
	// is parsed once, not at every scrape.
	expiriesMu sync.Mutex
	expiries   map[string]time.Time

	// summaryInterval is PrefixSummaryInterval, its default applied;
	// summaryFetches counts the asks by result.
	summaryInterval time.Duration
	summaryFetches  *prometheus.CounterVec
}

// maxCachedExpiries bounds expiries: tokens rotate, and a few are in use
// at a time (the token file's, one per token Secret).
const maxCachedExpiries = 64

// tokenExpiry is token's exp claim when it is a JWT, else zero.
func (s *PoolScraper) tokenExpiry(token string) time.Time {
	if token == "" {
		return time.Time{}
	}
	s.expiriesMu.Lock()
	defer s.expiriesMu.Unlock()
	if at, ok := s.expiries[token]; ok {
		return at
	}
	if s.expiries == nil || len(s.expiries) >= maxCachedExpiries {
		s.expiries = map[string]time.Time{}
	}
	at := credexpiry.JWT(token)
	s.expiries[token] = at
	return at
}

// scrapeResult is the outcome of a URL's last scrape and the last good
// gauges, which a failure keeps.
type scrapeResult struct {
	state MetricsState
	// err says why the last scrape failed; nil when it did not.
	err error
	// pools are the last good gauges by pool name; nil before any.
	pools map[string]*metrics.PoolMetrics
	// only is the gauges of the one pool when pools has one (what an EPP
	// serves, most of the time): poolOf's answer for any name, read
	// without a look-up by a pick over 1,000 clusters.
	only *metrics.PoolMetrics
	// token says which token the last scrape sent.
	token string
	// withheld, when set, says why the sidecar's own token was not sent
	// (a Withheld* reason); "" when it was, or none was asked.
	withheld string
	// cluster and pool name the target whose own token was withheld.
	cluster, pool string
	// tokenExpiry is when the token sent expires, when it is a JWT.
	tokenExpiry time.Time
	// summary is the last ask for the EPP's prefix summary, which the
	// pools of a good scrape carry (PoolMetrics.Prefixes).
	summary summaryFetch
}

// NewPoolScraper returns a scraper with no targets. It fails only when
// TokenFile is set and cannot be read.
func NewPoolScraper(o PoolScraperOptions) (*PoolScraper, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	s := &PoolScraper{
		client:    &http.Client{Transport: tr},
		timeout:   positiveOr(o.Timeout, DefaultScrapeTimeout),
		staleness: o.Staleness,
		creds:     o.Credentials,

		summaryInterval: o.PrefixSummaryInterval,
		summaryFetches:  newSummaryFetches(),
	}
	if s.summaryInterval == 0 {
		s.summaryInterval = DefaultPrefixSummaryInterval
	}
	if len(o.TokenRecipients) > 0 {
		s.recipients = map[string]bool{}
		for _, r := range o.TokenRecipients {
			if err := ParseTokenRecipient(r); err != nil {
				return nil, err
			}
			s.recipients[r] = true
		}
	}
	s.clients = epptransport.NewConns(o.Credentials, 0, s.newClient, s.closeClient)
	if o.TokenFile != "" {
		if _, err := os.ReadFile(o.TokenFile); err != nil {
			return nil, fmt.Errorf("the token file for EPP metrics: %w", err)
		}
		s.tokenFile = transport.NewCachedFileTokenSource(o.TokenFile)
	}
	s.poller = poll.New(positiveOr(o.Interval, DefaultScrapeInterval), s.scrape)
	s.poller.Forget = s.clients.Forget
	return s, nil
}

// Run scrapes until ctx ends.
func (s *PoolScraper) Run(ctx context.Context) error {
	defer func() {
		s.clients.Close()
		s.client.CloseIdleConnections()
	}()
	return s.poller.Run(ctx)
}

// newClient is the client that scrapes url with the credentials t: the
// shared one for plaintext, else one of its own.
func (s *PoolScraper) newClient(_ string, t *epptransport.EndpointTLS) (*http.Client, error) {
	if t.Config == nil {
		return s.client, nil
	}
	tr := s.client.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = t.Config
	return &http.Client{Transport: tr}, nil
}

// closeClient lets a URL's own client go; the shared one stays.
func (s *PoolScraper) closeClient(c *http.Client) {
	if c != s.client {
		c.CloseIdleConnections()
	}
}

// SetTargets makes the scraped URLs exactly urls.
func (s *PoolScraper) SetTargets(urls []string) { s.poller.Set(urls) }

// Get returns the latest gauges of pool (the series labelled with its name,
// or the only series) at url, fresh or not; nil when none were read.
func (s *PoolScraper) Get(url, pool string) *metrics.PoolMetrics {
	if url == "" {
		return nil
	}
	r := s.poller.Get(url)
	if r == nil {
		return nil
	}
	return r.gauges(pool)
}

// MetricsRef reads the gauges of one pool at one URL without looking the
// URL up (poll.Ref): see PoolScraper.Refs.
type MetricsRef struct {
	r    poll.Ref[scrapeResult]
	pool string
}

// Get answers as PoolScraper.Get does for the URL and pool the Ref was
// made for, while the scraper's Version is the one Refs returned.
func (r MetricsRef) Get() *metrics.PoolMetrics {
	v := r.r.Load()
	if v == nil {
		return nil
	}
	return v.gauges(r.pool)
}

// Refs sets out[i] to the MetricsRef of the pool and URL target(i) names
// for each i below len(out), and returns the version of the scraper's
// targets they read (Version): a reader of the same pools at every
// request (the clusters of a backend) looks them up once a change of
// the targets.
func (s *PoolScraper) Refs(target func(i int) (url, pool string), out []MetricsRef) (version uint64) {
	refs := make([]poll.Ref[scrapeResult], len(out))
	version = s.poller.Refs(func(i int) string {
		url, _ := target(i)
		return url
	}, refs)
	for i, r := range refs {
		_, pool := target(i)
		out[i] = MetricsRef{r: r, pool: pool}
	}
	return version
}

// Version changes whenever the scraped URLs do (SetTargets).
func (s *PoolScraper) Version() uint64 { return s.poller.Version() }

// gauges are r's gauges of pool (poolOf).
func (r *scrapeResult) gauges(pool string) *metrics.PoolMetrics {
	if r.only != nil {
		return r.only
	}
	return poolOf(r.pools, pool)
}

func poolOf(pools map[string]*metrics.PoolMetrics, pool string) *metrics.PoolMetrics {
	if m, ok := pools[pool]; ok {
		return m
	}
	if len(pools) == 1 {
		for _, m := range pools {
			return m
		}
	}
	return nil
}

// State returns the state of pool's metrics at url at time now, and why
// when they are not fresh. ok is false when url is not scraped.
func (s *PoolScraper) State(url, pool string, now time.Time) (state MetricsState, why error, ok bool) {
	if url == "" || !s.poller.Has(url) {
		return "", nil, false
	}
	r := s.poller.Get(url)
	if r == nil {
		return MetricsStale, errors.New("not scraped yet"), true
	}
	m := r.gauges(pool)
	switch {
	case m != nil && (s.staleness <= 0 || !m.UpdatedAt.Before(now.Add(-s.staleness))):
		return MetricsFresh, nil, true
	case r.state != MetricsFresh:
		return r.state, r.err, true
	case m == nil:
		return MetricsUnparseable, fmt.Errorf("the EPP serves no pool gauges for pool %q (it serves %q)", pool, metrics.PoolNames(r.pools)), true
	default:
		return MetricsStale, fmt.Errorf("the last pool gauges were read at %s", m.UpdatedAt.Format(time.RFC3339)), true
	}
}

// scrape reads url once. It always records an outcome (the poller keeps
// the last value), carrying the last good gauges over a failure, and logs
// the outcome when it differs from the previous one.
func (s *PoolScraper) scrape(ctx context.Context, url string) (*scrapeResult, error) {
	prev := s.poller.Get(url)
	r := s.read(ctx, url)
	if ctx.Err() != nil {
		// Removed or stopping: the outcome says nothing about the EPP.
		return nil, ctx.Err()
	}
	if r.state != MetricsFresh && prev != nil {
		r.pools = prev.pools
	}
	if r.state == MetricsFresh {
		// The pools were parsed just now, seen by no reader yet.
		var last summaryFetch
		if prev != nil {
			last = prev.summary
		}
		r.summary = s.prefixSummary(ctx, url, last, time.Now())
		for _, m := range r.pools {
			m.Prefixes = r.summary.summary
		}
	} else if prev != nil {
		r.summary = prev.summary
	}
	if len(r.pools) == 1 {
		for _, m := range r.pools {
			r.only = m
		}
	}
	if prev == nil || prev.state != r.state || prev.token != r.token || countsRouted(prev.pools) != countsRouted(r.pools) {
		logOutcome(klog.FromContext(ctx), url, r)
	}
	if r.withheld != "" && (prev == nil || prev.withheld != r.withheld) {
		klog.FromContext(ctx).Info("The sidecar's own metrics token is not sent to this EPP: it goes only over verified TLS, to an in-cluster EPP or one --epp-metrics-token-recipients names (see docs/tls.md, \"Metrics behind authentication\")",
			"url", url, "cluster", r.cluster, "pool", r.pool, "reason", r.withheld)
	}
	return r, nil
}

// countsRouted reports whether an EPP's pools carry its counts of the
// requests it routed by relaying cluster (mci-epp's).
func countsRouted(pools map[string]*metrics.PoolMetrics) bool {
	for _, m := range pools {
		if m.RelayedRequests != nil {
			return true
		}
	}
	return false
}

func logOutcome(logger klog.Logger, url string, r *scrapeResult) {
	logger = logger.WithValues("url", url, "state", r.state, "token", r.token)
	switch r.state {
	case MetricsFresh:
		schemes := map[string]bool{}
		for _, m := range r.pools {
			schemes[m.Scheme] = true
		}
		// Without its counts of routed requests, PrefixAffinity deals
		// the pool's keys as if this sidecar's traffic were all of it
		// (docs/routing.md, "Traffic the sidecar does not place").
		logger.Info("Reading the pool metrics of an EPP", "pools", metrics.PoolNames(r.pools), "schemes", len(schemes),
			"countsRoutedRequests", countsRouted(r.pools))
	case MetricsUnauthorized:
		logger.Info("An EPP refuses the sidecar its pool metrics: its clusters are unmeasured for MetricsBased until it accepts the token sent (see docs/tls.md, \"Metrics behind authentication\")", "err", r.err)
	default:
		logger.Info("Cannot read the pool metrics of an EPP: its clusters are unmeasured for MetricsBased until it can", "err", r.err)
	}
}

// read scrapes url once and classifies the outcome.
func (s *PoolScraper) read(ctx context.Context, url string) *scrapeResult {
	started := time.Now()
	var withheld, cluster, pool string
	var expiry time.Time
	fail := func(state MetricsState, token string, err error) *scrapeResult {
		return &scrapeResult{state: state, err: err, token: token, withheld: withheld, cluster: cluster, pool: pool, tokenExpiry: expiry}
	}
	// Credentials that cannot be used (a TLS Secret, a token Secret) fail
	// the metrics port alone, counted with the connection failures.
	client, err := s.clients.Get(url)
	if err != nil {
		s.creds.Failed(url, err)
		return fail(MetricsUnreachable, "", err)
	}
	token, tokenSource, err := s.bearerToken(url)
	if tokenSource == tokenWithheld {
		withheld, cluster, pool = s.withhold(url)
	}
	if err != nil {
		s.creds.Failed(url, err)
		return fail(MetricsUnreachable, tokenSource, err)
	}
	expiry = s.tokenExpiry(token)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.get(ctx, client, url, token, "text/plain;version=0.0.4", "")
	if err != nil {
		return fail(MetricsUnreachable, tokenSource, err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		if resp.StatusCode == http.StatusUnauthorized && tokenSource == tokenFromFile {
			// As client-go does: the kubelet may have rotated the token
			// since it was read; the next scrape reads the file again.
			s.tokenFile.ResetTokenOlderThan(time.Now())
		}
		return fail(MetricsUnauthorized, tokenSource, fmt.Errorf("GET %s: %s", url, resp.Status))
	default:
		return fail(MetricsUnreachable, tokenSource, fmt.Errorf("GET %s: %s", url, resp.Status))
	}
	pools, state, err := pagePools(resp.Body, url)
	if err != nil {
		return fail(state, tokenSource, err)
	}
	for _, m := range pools {
		// The EPP computed them at some point during the scrape; its start
		// is the conservative time for staleness.
		m.UpdatedAt = started
	}
	return &scrapeResult{state: MetricsFresh, pools: pools, token: tokenSource, withheld: withheld, cluster: cluster, pool: pool, tokenExpiry: expiry}
}

// pagePools reads the pool gauges of the page of url's answer, or says
// why it cannot (the state, and the error).
func pagePools(body io.Reader, url string) (map[string]*metrics.PoolMetrics, MetricsState, error) {
	page, err := io.ReadAll(metrics.LimitReader(body, maxPoolMetricsBytes))
	if errors.Is(err, metrics.ErrTooLarge) {
		return nil, MetricsUnparseable, fmt.Errorf("GET %s: the page is larger than %d bytes", url, maxPoolMetricsBytes)
	}
	if err != nil {
		return nil, MetricsUnreachable, fmt.Errorf("GET %s: reading the page: %w", url, err)
	}
	pools, err := metrics.ParsePool(bytes.NewReader(page))
	if err != nil {
		return nil, MetricsUnparseable, fmt.Errorf("GET %s: %w", url, err)
	}
	return pools, MetricsFresh, nil
}

// get sends a GET of url accepting the media type accept, with the bearer
// token when there is one and If-None-Match etag when set.
func (s *PoolScraper) get(ctx context.Context, client *http.Client, url, token, accept, etag string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	return client.Do(req)
}

// Where a scrape's bearer token came from, for logs.
const (
	tokenNone     = "none"
	tokenFromFile = "file"
	// tokenWithheld: the token file's token is not sent to this URL.
	tokenWithheld = "none (own token withheld)"
)

// Why the sidecar's own token is withheld from an EPP: the reason label of
// mci_sidecar_epp_metrics_token_withheld.
const (
	// WithheldPlaintext: the metrics port is reached in plaintext.
	WithheldPlaintext = "plaintext"
	// WithheldUnverified: the metrics port is reached with TLS whose
	// certificate is not verified.
	WithheldUnverified = "tls-unverified"
	// WithheldRemote: the EPP is another cluster's (an import's), which
	// --epp-metrics-token-recipients does not name.
	WithheldRemote = "remote-cluster"
	// WithheldExternalName: the local pool's EPP Service is an
	// ExternalName, which --epp-metrics-token-recipients does not name.
	WithheldExternalName = "external-name"
	// WithheldUnknown: the URL is no EPP of the routing table.
	WithheldUnknown = "unknown-target"
)

// ParseTokenRecipient checks an entry of TokenRecipients: a cluster name,
// or cluster/namespace/name.
func ParseTokenRecipient(r string) error {
	parts := strings.Split(r, "/")
	if (len(parts) != 1 && len(parts) != 3) || slices.Contains(parts, "") {
		return fmt.Errorf("metrics token recipient %q: want a cluster name or cluster/namespace/name", r)
	}
	return nil
}

// withhold says why the token file's token may not go to url ("" when it
// may), and the cluster and pool of url. It goes only over verified TLS
// (the Secret that the pool names, or a BackendTLSPolicy), and only to an
// in-cluster EPP or one the recipients name.
func (s *PoolScraper) withhold(url string) (reason, cluster, pool string) {
	tg, ok := s.creds.TargetOf(url)
	if !ok {
		return WithheldUnknown, "", ""
	}
	switch tg.Transport.Kind() {
	case eppaddr.TransportKindPlaintext:
		return WithheldPlaintext, tg.Cluster, tg.Pool
	case eppaddr.TransportKindUnverified:
		return WithheldUnverified, tg.Cluster, tg.Pool
	}
	switch {
	case tg.InCluster() || s.recipients[tg.Cluster] || s.recipients[tg.Cluster+"/"+tg.Pool]:
		return "", tg.Cluster, tg.Pool
	case tg.Local:
		return WithheldExternalName, tg.Cluster, tg.Pool
	default:
		return WithheldRemote, tg.Cluster, tg.Pool
	}
}

// bearerToken returns the token to send to url and where it comes from:
// the `token` of its credentials Secret, else the token file, else none.
func (s *PoolScraper) bearerToken(url string) (token, source string, err error) {
	token, ref, err := s.creds.MetricsToken(url)
	switch {
	case err != nil:
		return "", "secret " + ref, err
	case token != "":
		return token, "secret " + ref, nil
	case s.tokenFile != nil:
		if why, _, _ := s.withhold(url); why != "" {
			return "", tokenWithheld, nil
		}
		t, err := s.tokenFile.Token()
		if err != nil {
			return "", tokenFromFile, fmt.Errorf("reading the token file for EPP metrics: %w", err)
		}
		return strings.TrimSpace(t.AccessToken), tokenFromFile, nil
	default:
		return "", tokenNone, nil
	}
}

const eppMetricsStateHelp = "State of each cluster's pool metrics as MetricsBased sees them, one-hot over the state label: fresh (measured), stale, unauthorized (the EPP answered 401/403), unreachable, unparseable. Only clusters of MetricsBased backends are scraped."

var eppMetricsStateDesc = prometheus.NewDesc("mci_sidecar_epp_metrics_state", eppMetricsStateHelp, []string{"cluster", "pool", "state"}, nil)

const tokenWithheldHelp = "1 for each cluster's pool whose EPP metrics scrapes would carry the sidecar's own token (--epp-metrics-token-file; the pool names no token Secret) but do not, by reason: plaintext or tls-unverified (the token goes over verified TLS only), remote-cluster or external-name (nor --epp-metrics-token-recipients names it), unknown-target."

const routedCountedHelp = "1 for each cluster's pool whose EPP counts the requests it routes by the cluster that relayed them (mci-epp), against which PrefixAffinity levels the shares of its keys; 0 for one that does not (an upstream EPP), whose cluster is dealt its capacity's share as if this sidecar's traffic were all it serves. Only while its pool metrics are fresh."

var routedCountedDesc = prometheus.NewDesc("mci_sidecar_epp_routed_requests_counted", routedCountedHelp, []string{"cluster", "pool"}, nil)

var tokenWithheldDesc = prometheus.NewDesc("mci_sidecar_epp_metrics_token_withheld", tokenWithheldHelp, []string{"cluster", "pool", "reason"}, nil)

const tokenExpiryHelp = "When the bearer token the sidecar sends each cluster's pool's EPP for its metrics expires, in seconds since the epoch, when the token is a JWT, by where it comes from: secret (the pool's token Secret; rotate it before then) or file (--epp-metrics-token-file, which the kubelet renews on its own)."

var tokenExpiryDesc = prometheus.NewDesc("mci_sidecar_epp_metrics_token_expiry_timestamp_seconds", tokenExpiryHelp, []string{"cluster", "pool", "source"}, nil)

// tokenSourceLabel is the source label of a token's expiry: secret or
// file.
func tokenSourceLabel(source string) string {
	if source == tokenFromFile {
		return "file"
	}
	return "secret"
}

// ScrapedPool is a cluster's pool and the metrics URL of its EPP: a series
// of mci_sidecar_epp_metrics_state when the URL is scraped.
type ScrapedPool struct {
	// Cluster names the cluster; Pool is the pool's "namespace/name".
	Cluster, Pool string
	// URL is the EPP's metrics URL.
	URL string
}

// stateCollector derives the state gauges at scrape time from the pools
// the sidecar routes to and the scraper.
type stateCollector struct {
	pools   func() []ScrapedPool
	scraper *PoolScraper
}

// StateCollector is mci_sidecar_epp_metrics_state: for each distinct
// cluster and pool of pools() whose URL s scrapes, the state of its metrics
// (one-hot). pools is called at each collection.
func (s *PoolScraper) StateCollector(pools func() []ScrapedPool) prometheus.Collector {
	return &stateCollector{pools: pools, scraper: s}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- eppMetricsStateDesc
	ch <- tokenWithheldDesc
	ch <- tokenExpiryDesc
	ch <- routedCountedDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	seen := map[[2]string]bool{}
	for _, p := range c.pools() {
		k := [2]string{p.Cluster, p.Pool}
		if seen[k] {
			continue
		}
		_, pool, _ := strings.Cut(p.Pool, "/")
		state, _, ok := c.scraper.State(p.URL, pool, now)
		if !ok {
			continue
		}
		seen[k] = true
		for _, s := range MetricsStates {
			v := 0.0
			if s == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(eppMetricsStateDesc, prometheus.GaugeValue, v, p.Cluster, p.Pool, string(s))
		}
		r := c.scraper.poller.Get(p.URL)
		if r == nil {
			continue
		}
		if m := poolOf(r.pools, pool); m != nil && state == MetricsFresh {
			counted := 0.0
			if m.RelayedRequests != nil {
				counted = 1
			}
			ch <- prometheus.MustNewConstMetric(routedCountedDesc, prometheus.GaugeValue, counted, p.Cluster, p.Pool)
		}
		if r.withheld != "" {
			ch <- prometheus.MustNewConstMetric(tokenWithheldDesc, prometheus.GaugeValue, 1, p.Cluster, p.Pool, r.withheld)
		}
		if !r.tokenExpiry.IsZero() {
			ch <- prometheus.MustNewConstMetric(tokenExpiryDesc, prometheus.GaugeValue, float64(r.tokenExpiry.Unix()), p.Cluster, p.Pool, tokenSourceLabel(r.token))
		}
	}
}
