package sidecar

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Defaults of the health prober and the metrics scraper.
const (
	DefaultHealthInterval = time.Second
	DefaultHealthTimeout  = 500 * time.Millisecond
	DefaultScrapeInterval = time.Second
	DefaultScrapeTimeout  = 500 * time.Millisecond
)

// HealthService is the gRPC health service the prober asks about: the
// ext_proc service, which upstream EPPs and mci-epp both report. An EPP that
// does not know it (NotFound) is asked about the server as a whole ("").
var HealthService = extprocv3.ExternalProcessor_ServiceDesc.ServiceName

// HealthProber keeps the gRPC health of each EPP health address: one Check
// per interval, bounded by a timeout, on a connection kept per address. A
// failed ext_proc stream marks an EPP NotServing at once (MarkFailed) until
// its next successful check, so failover does not wait for the next probe.
type HealthProber struct {
	poller  *poller[Health]
	timeout time.Duration
	// creds say how each address is reached; nil: plaintext.
	creds *Credentials

	mu    sync.Mutex
	conns map[string]probeConn
}

// probeConn is a connection to a health address and the version of the
// credentials it was made with.
type probeConn struct {
	version string
	conn    *grpc.ClientConn
}

// NewHealthProber returns a prober with no targets. Zero durations take the
// defaults.
func NewHealthProber(interval, timeout time.Duration) *HealthProber {
	h := &HealthProber{timeout: timeout, conns: map[string]probeConn{}}
	if interval <= 0 {
		interval = DefaultHealthInterval
	}
	if h.timeout <= 0 {
		h.timeout = DefaultHealthTimeout
	}
	h.poller = newPoller(interval, h.check)
	h.poller.forget = h.closeConn
	return h
}

// Run probes until ctx ends.
func (h *HealthProber) Run(ctx context.Context) error {
	err := h.poller.Run(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	for addr, c := range h.conns {
		_ = c.conn.Close()
		delete(h.conns, addr)
	}
	return err
}

// SetTargets makes the probed addresses exactly addrs.
func (h *HealthProber) SetTargets(addrs []string) { h.poller.set(addrs) }

// Health returns what is known of addr; HealthUnknown for "" or an address
// not probed yet.
func (h *HealthProber) Health(addr string) Health {
	if addr == "" {
		return HealthUnknown
	}
	if v := h.poller.get(addr); v != nil {
		return *v
	}
	return HealthUnknown
}

var notServing = HealthNotServing

// MarkFailed records that the EPP at health address addr just failed.
func (h *HealthProber) MarkFailed(addr string) {
	if addr != "" {
		h.poller.put(addr, &notServing)
	}
}

// conn returns the connection to addr with its current credentials; one
// made with other ones is closed (only addr's own poll uses it).
func (h *HealthProber) conn(addr string) (*grpc.ClientConn, error) {
	t, err := h.creds.forTarget(addr)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.conns[addr]
	if old.conn != nil && old.version == t.version {
		return old.conn, nil
	}
	if old.conn != nil {
		_ = old.conn.Close()
		delete(h.conns, addr)
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(t.grpc))
	if err != nil {
		return nil, err
	}
	h.conns[addr] = probeConn{version: t.version, conn: c}
	return c, nil
}

func (h *HealthProber) closeConn(addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.conns[addr]; c.conn != nil {
		_ = c.conn.Close()
		delete(h.conns, addr)
	}
}

func (h *HealthProber) check(ctx context.Context, addr string) (*Health, error) {
	result := HealthNotServing
	conn, err := h.conn(addr)
	if err != nil {
		return &result, nil
	}
	client := healthpb.NewHealthClient(conn)
	ask := func(service string) (*healthpb.HealthCheckResponse, error) {
		ctx, cancel := context.WithTimeout(ctx, h.timeout)
		defer cancel()
		return client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	}
	resp, err := ask(HealthService)
	if status.Code(err) == codes.NotFound {
		resp, err = ask("")
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
		result = HealthServing
	}
	return &result, nil
}

// The pool-level gauges of an EPP, as upstream EPPs and mci-epp name them.
const (
	PoolQueueMetric     = "inference_pool_average_queue_size"
	PoolKVCacheMetric   = "inference_pool_average_kv_cache_utilization"
	PoolReadyPodsMetric = "inference_pool_ready_pods"
	// poolNameLabel names the pool of a series.
	poolNameLabel = "name"
)

// PoolScraper keeps the pool metrics each EPP metrics URL serves. A failed
// scrape keeps the last metrics, whose age then makes them stale.
type PoolScraper struct {
	poller  *poller[map[string]*PoolMetrics]
	client  *http.Client
	timeout time.Duration
	// creds say how each URL is reached; nil: plaintext.
	creds *Credentials

	// tlsClients are the clients of the URLs scraped over TLS, each with
	// the credentials of one version.
	mu         sync.Mutex
	tlsClients map[string]scrapeClient
}

// scrapeClient is an HTTP client for one URL and the version of its
// credentials.
type scrapeClient struct {
	version string
	client  *http.Client
}

// NewPoolScraper returns a scraper with no targets. Zero durations take the
// defaults.
func NewPoolScraper(interval, timeout time.Duration) *PoolScraper {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	s := &PoolScraper{client: &http.Client{Transport: tr}, timeout: timeout, tlsClients: map[string]scrapeClient{}}
	if interval <= 0 {
		interval = DefaultScrapeInterval
	}
	if s.timeout <= 0 {
		s.timeout = DefaultScrapeTimeout
	}
	s.poller = newPoller(interval, s.scrape)
	s.poller.forget = s.forget
	return s
}

// Run scrapes until ctx ends.
func (s *PoolScraper) Run(ctx context.Context) error {
	defer func() {
		s.client.CloseIdleConnections()
		s.mu.Lock()
		defer s.mu.Unlock()
		for url, c := range s.tlsClients {
			c.client.CloseIdleConnections()
			delete(s.tlsClients, url)
		}
	}()
	return s.poller.Run(ctx)
}

// clientFor returns the client that scrapes url with its current
// credentials: the shared one for plaintext, else one of its own, made
// anew when the credentials change.
func (s *PoolScraper) clientFor(url string) (*http.Client, error) {
	t, err := s.creds.forTarget(url)
	if err != nil {
		return nil, err
	}
	if t.config == nil {
		return s.client, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.tlsClients[url]
	if old.client != nil && old.version == t.version {
		return old.client, nil
	}
	if old.client != nil {
		old.client.CloseIdleConnections()
	}
	tr := s.client.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = t.config
	c := &http.Client{Transport: tr}
	s.tlsClients[url] = scrapeClient{version: t.version, client: c}
	return c, nil
}

// forget drops the client of a URL no longer scraped.
func (s *PoolScraper) forget(url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.tlsClients[url]; ok {
		c.client.CloseIdleConnections()
		delete(s.tlsClients, url)
	}
}

// SetTargets makes the scraped URLs exactly urls.
func (s *PoolScraper) SetTargets(urls []string) { s.poller.set(urls) }

// Get returns the latest metrics of pool (the series labelled with its
// name, or the only series) at url; nil when unknown.
func (s *PoolScraper) Get(url, pool string) *PoolMetrics {
	if url == "" {
		return nil
	}
	byPool := s.poller.get(url)
	if byPool == nil {
		return nil
	}
	if m, ok := (*byPool)[pool]; ok {
		return m
	}
	if len(*byPool) == 1 {
		for _, m := range *byPool {
			return m
		}
	}
	return nil
}

// scrape reads another exposition than metrics.Scraper's (pool gauges by
// pool, not one model server's vLLM metrics): only the GET is alike.
func (s *PoolScraper) scrape(ctx context.Context, url string) (*map[string]*PoolMetrics, error) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	client, err := s.clientFor(url)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	m, err := ParsePoolMetrics(io.LimitReader(resp.Body, 4<<20), started)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return &m, nil
}

// ParsePoolMetrics reads the pool gauges from a Prometheus text exposition,
// by the pool name label of their series ("" for a series without one). A
// pool needs the queue and KV cache gauges; the ready pods gauge is
// optional (-1 when absent). Other metrics are ignored.
func ParsePoolMetrics(r io.Reader, at time.Time) (map[string]*PoolMetrics, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	// Keep the lines of the three gauges only: an EPP's page is mostly
	// histograms, and a malformed line elsewhere must not hide the load.
	var kept strings.Builder
	for line := range strings.SplitSeq(string(body), "\n") {
		t := line
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			t = rest
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			t = rest
		}
		if strings.HasPrefix(t, PoolQueueMetric) || strings.HasPrefix(t, PoolKVCacheMetric) || strings.HasPrefix(t, PoolReadyPodsMetric) {
			kept.WriteString(line)
			kept.WriteByte('\n')
		}
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(kept.String()))
	if err != nil {
		return nil, fmt.Errorf("parsing pool metrics: %w", err)
	}
	out := map[string]*PoolMetrics{}
	get := func(name string) *PoolMetrics {
		m := out[name]
		if m == nil {
			m = &PoolMetrics{AverageQueue: math.NaN(), AverageKVCache: math.NaN(), ReadyPods: -1, UpdatedAt: at}
			out[name] = m
		}
		return m
	}
	each := func(family string, f func(*PoolMetrics, float64)) {
		mf := families[family]
		if mf == nil {
			return
		}
		for _, s := range mf.GetMetric() {
			f(get(labelValue(s, poolNameLabel)), sampleValue(s))
		}
	}
	each(PoolQueueMetric, func(m *PoolMetrics, v float64) { m.AverageQueue = v })
	each(PoolKVCacheMetric, func(m *PoolMetrics, v float64) { m.AverageKVCache = v })
	each(PoolReadyPodsMetric, func(m *PoolMetrics, v float64) {
		if v >= 0 && !math.IsInf(v, 0) {
			m.ReadyPods = int(min(v, math.MaxInt32))
		}
	})
	for name, m := range out {
		if math.IsNaN(m.AverageQueue) || math.IsNaN(m.AverageKVCache) {
			delete(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s and %s series", PoolQueueMetric, PoolKVCacheMetric)
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

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}

// liveState is the State of the running sidecar.
type liveState struct {
	health  *HealthProber
	metrics *PoolScraper
}

func (s liveState) Health(c *Cluster) Health {
	if s.health == nil {
		return HealthUnknown
	}
	return s.health.Health(c.Health)
}

func (s liveState) PoolMetrics(c *Cluster) *PoolMetrics {
	if s.metrics == nil {
		return nil
	}
	_, pool, _ := strings.Cut(c.Pool, "/")
	return s.metrics.Get(c.Metrics, pool)
}

// Failed marks the cluster's EPP NotServing until its next good probe.
func (s liveState) Failed(c *Cluster) {
	if s.health != nil {
		s.health.MarkFailed(c.Health)
	}
}
