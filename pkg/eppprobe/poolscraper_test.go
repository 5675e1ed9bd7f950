package eppprobe

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/epptransport/epptransporttest"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/test/tlstest"
)

// ns is the namespace of the tests' pools and Secrets.
const ns = "example"

// gauges is a pool's page under the GIE names.
func gauges(pool string, queue int) string {
	return fmt.Sprintf("inference_pool_average_queue_size{name=%q} %d\ninference_pool_average_kv_cache_utilization{name=%q} 0.5\n", pool, queue, pool)
}

// metricsServer serves page to requests that carry "Bearer <token>" when
// token is set, and records the Authorization headers it got. As
// controller-runtime's authentication filter answers: 401 without the token
// (not authenticated).
type metricsServer struct {
	*httptest.Server
	token atomic.Pointer[string]
	page  atomic.Pointer[string]
	mu    sync.Mutex
	seen  []string
}

func newMetricsServer(t *testing.T, page, token string) *metricsServer {
	m := &metricsServer{}
	m.page.Store(&page)
	m.token.Store(&token)
	m.Server = httptest.NewServer(m)
	t.Cleanup(m.Close)
	return m
}

func (m *metricsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	got := r.Header.Get("Authorization")
	m.mu.Lock()
	m.seen = append(m.seen, got)
	m.mu.Unlock()
	if want := *m.token.Load(); want != "" {
		if got != "Bearer "+want {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
	}
	_, _ = w.Write([]byte(*m.page.Load()))
}

func (m *metricsServer) requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.seen)
}

func (m *metricsServer) lastAuthorization() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.seen) == 0 {
		return ""
	}
	return m.seen[len(m.seen)-1]
}

// logLines collects the Info lines of a logger.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() klog.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

func (l *logLines) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

func runScraper(t *testing.T, s *PoolScraper, logs *logLines) {
	t.Helper()
	ctx := context.Background()
	if logs != nil {
		ctx = klog.NewContext(ctx, logs.logger())
	}
	runUntilTheEnd(t, ctx, s.Run)
}

func writeToken(t *testing.T, path, token string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path+".tmp", []byte(token+"\n"), 0o600))
	// As the kubelet does: the new token appears at once, never half written.
	require.NoError(t, os.Rename(path+".tmp", path))
}

func TestPoolScraperStates(t *testing.T) {
	// Port 1 is privileged: nothing of a test listens there.
	closedURL := "http://127.0.0.1:1/metrics"
	status := func(code int) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", code) }))
		t.Cleanup(s.Close)
		return s
	}

	tests := []struct {
		name      string
		url       string
		pool      string
		wantState MetricsState
		wantWhy   string
		wantQueue float64
	}{
		{name: "gauges under the GIE names are fresh", url: newMetricsServer(t, gauges("llm", 3), "").URL, pool: "llm", wantState: MetricsFresh, wantQueue: 3},
		{name: "gauges under the llm-d names are fresh", url: newMetricsServer(t, "llm_d_epp_average_queue_size{name=\"llm\"} 4\nllm_d_epp_average_kv_cache_utilization{name=\"llm\"} 0.2\nllm_d_epp_ready_endpoints{name=\"llm\"} 2\n", "").URL, pool: "llm", wantState: MetricsFresh, wantQueue: 4},
		{name: "an EPP that wants another token is unauthorized (401)", url: newMetricsServer(t, gauges("llm", 1), "other-token").URL, pool: "llm", wantState: MetricsUnauthorized, wantWhy: "401 Unauthorized"},
		{name: "an EPP that does not authorize the token is unauthorized (403)", url: status(http.StatusForbidden).URL, pool: "llm", wantState: MetricsUnauthorized, wantWhy: "403 Forbidden"},
		{name: "401 is unauthorized", url: status(http.StatusUnauthorized).URL, pool: "llm", wantState: MetricsUnauthorized, wantWhy: "401 Unauthorized"},
		{name: "another status is unreachable", url: status(http.StatusInternalServerError).URL, pool: "llm", wantState: MetricsUnreachable, wantWhy: "500 Internal Server Error"},
		{name: "a closed port is unreachable", url: closedURL, pool: "llm", wantState: MetricsUnreachable, wantWhy: "connection refused"},
		{name: "a page without pool gauges is unparseable", url: newMetricsServer(t, "go_goroutines 3\n", "").URL, pool: "llm", wantState: MetricsUnparseable, wantWhy: "no pool gauges"},
		{name: "garbage is unparseable", url: newMetricsServer(t, "<html>\x00\xff", "").URL, pool: "llm", wantState: MetricsUnparseable, wantWhy: "parsing pool metrics"},
		{name: "a page without this pool's gauges is unparseable for it", url: newMetricsServer(t, gauges("a", 1)+gauges("b", 2), "").URL, pool: "llm", wantState: MetricsUnparseable, wantWhy: `no pool gauges for pool "llm"`},
	}
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second, Staleness: time.Minute})
	require.NoError(t, err)
	var urls []string
	for _, tt := range tests {
		urls = append(urls, tt.url)
	}
	s.SetTargets(urls)
	runScraper(t, s, nil)

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				state, why, ok := s.State(tt.url, tt.pool, time.Now())
				require.True(ct, ok)
				assert.Equal(ct, tt.wantState, state)
				if tt.wantWhy != "" {
					require.Error(ct, why)
					assert.Contains(ct, why.Error(), tt.wantWhy)
				}
			}, 5*time.Second, 10*time.Millisecond)
			if tt.wantState == MetricsFresh {
				assert.Equal(t, tt.wantQueue, s.Get(tt.url, tt.pool).AverageQueue)
			} else {
				assert.Nil(t, s.Get(tt.url, tt.pool))
			}
		})
	}

	t.Run("a URL not scraped has no state", func(t *testing.T) {
		_, _, ok := s.State("http://127.0.0.1:2/metrics", "llm", time.Now())
		assert.False(t, ok)
		_, _, ok = s.State("", "llm", time.Now())
		assert.False(t, ok)
	})

	t.Run("a URL not scraped yet is stale", func(t *testing.T) {
		idle, err := NewPoolScraper(PoolScraperOptions{})
		require.NoError(t, err)
		idle.SetTargets([]string{closedURL})
		state, why, ok := idle.State(closedURL, "llm", time.Now())
		require.True(t, ok)
		assert.Equal(t, MetricsStale, state)
		assert.ErrorContains(t, why, "not scraped yet")
	})
}

func TestPoolScraperKeepsGaugesOverAFailureUntilTheyAreStale(t *testing.T) {
	m := newMetricsServer(t, gauges("llm", 7), "")
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second, Staleness: time.Minute})
	require.NoError(t, err)
	s.SetTargets([]string{m.URL})
	runScraper(t, s, nil)
	require.Eventually(t, func() bool { g := s.Get(m.URL, "llm"); return g != nil && g.AverageQueue == 7 }, 5*time.Second, 10*time.Millisecond)

	token := "now-required"
	m.token.Store(&token)
	// The failure shows at once, but the gauges still count while fresh...
	require.Eventually(t, func() bool {
		state, _, _ := s.State(m.URL, "llm", time.Now().Add(2*time.Minute))
		return state == MetricsUnauthorized
	}, 5*time.Second, 10*time.Millisecond)
	state, _, _ := s.State(m.URL, "llm", time.Now())
	assert.Equal(t, MetricsFresh, state)
	assert.Equal(t, 7.0, s.Get(m.URL, "llm").AverageQueue)
	// ...and a success after them is stale once they age.
	m.token.Store(new(string))
	require.Eventually(t, func() bool {
		state, _, _ := s.State(m.URL, "llm", time.Now())
		return state == MetricsFresh
	}, 5*time.Second, 10*time.Millisecond)
	m.Close()
	require.Eventually(t, func() bool {
		state, _, _ := s.State(m.URL, "llm", time.Now().Add(2*time.Minute))
		return state == MetricsUnreachable
	}, 5*time.Second, 10*time.Millisecond)
}

func TestPoolScraperSendsTheTokenFileAndFollowsItsRotation(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken(t, tokenFile, "first")
	m, url, creds := verifiedMetricsServer(t, "first")
	creds.SetTargets([]epptransport.Target{inClusterTarget(url)})
	logs := &logLines{}
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second, Staleness: time.Minute, TokenFile: tokenFile, Credentials: creds})
	require.NoError(t, err)
	s.SetTargets([]string{url})
	runScraper(t, s, logs)
	// The outcome of the last scrape.
	fresh := func() bool { r := s.poller.Get(url); return r != nil && r.state == MetricsFresh }
	require.Eventually(t, fresh, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "Bearer first", m.lastAuthorization())

	// The EPP's cluster now accepts only a rotated token, which the
	// kubelet writes: the 401 makes the sidecar read the file again.
	second := "second"
	m.token.Store(&second)
	writeToken(t, tokenFile, "second")
	require.Eventually(t, func() bool { return m.lastAuthorization() == "Bearer second" && fresh() }, 5*time.Second, 10*time.Millisecond)
	scraped := m.requests()
	require.Eventually(t, func() bool { return m.requests() >= scraped+3 }, 5*time.Second, 10*time.Millisecond, "a few more scrapes")
	assert.Equal(t, 2, logs.count(`"state"="fresh"`), "one line per change of state, not per scrape: %q", logs.lines)
	assert.LessOrEqual(t, logs.count(`"state"="unauthorized"`), 1, "%q", logs.lines)
	assert.Zero(t, logs.count("own metrics token is not sent"), "%q", logs.lines)

	t.Run("a token file that cannot be read fails the scraper's construction", func(t *testing.T) {
		_, err := NewPoolScraper(PoolScraperOptions{TokenFile: filepath.Join(t.TempDir(), "missing")})
		assert.ErrorContains(t, err, "the token file for EPP metrics")
	})

	t.Run("without a token file no token is sent", func(t *testing.T) {
		open := newMetricsServer(t, gauges("llm", 1), "")
		s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond})
		require.NoError(t, err)
		s.SetTargets([]string{open.URL})
		runScraper(t, s, nil)
		require.Eventually(t, func() bool { return s.Get(open.URL, "llm") != nil }, 5*time.Second, 10*time.Millisecond)
		assert.Empty(t, open.lastAuthorization())
	})
}

// verifiedMetricsServer is an EPP's /metrics over TLS that wants token
// (none: any), the URL it is scraped at, and credentials that verify it
// (the pool's credentials Secret "epp-creds", with a CA and no token).
func verifiedMetricsServer(t *testing.T, token string) (*metricsServer, string, *epptransport.Credentials) {
	t.Helper()
	serving := tlstest.NewServing(t, "127.0.0.1", "127.0.0.1")
	cert, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	require.NoError(t, err)
	m := &metricsServer{}
	page := gauges("llm", 2)
	m.page.Store(&page)
	m.token.Store(&token)
	m.Server = httptest.NewUnstartedServer(m)
	m.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	m.StartTLS()
	t.Cleanup(m.Close)
	kube := kubefake.NewSimpleClientset(epptransporttest.Secret(ns, "epp-creds", map[string][]byte{"ca.crt": serving.CAPEM}))
	return m, m.URL + "/metrics", epptransporttest.Run(t, kube, ns)
}

// inClusterTarget is url as the metrics port of a local pool's EPP
// reached at its Service's own address, over TLS verified with the pool's
// credentials Secret.
func inClusterTarget(url string) epptransport.Target {
	return epptransport.Target{Addr: url, Cluster: "cluster-a", Pool: ns + "/llm", Port: eppaddr.PortMetrics, Local: true,
		Transport: eppaddr.PortTransport{TLS: true, Secret: types.NamespacedName{Namespace: ns, Name: "epp-creds"}, Namespace: ns}}
}

// TestPoolScraperSendsItsOwnTokenOnlyOverVerifiedTLSToInClusterEPPs: the
// token of the token file never goes in plaintext or over TLS it cannot
// verify, nor to an ExternalName EPP Service (a name a tenant chose) or
// another cluster's EPP unless --epp-metrics-token-recipients names them;
// each refusal is logged once and shown by reason in
// mci_sidecar_epp_metrics_token_withheld.
func TestPoolScraperSendsItsOwnTokenOnlyOverVerifiedTLSToInClusterEPPs(t *testing.T) {
	unverified := eppaddr.PortTransport{TLS: true}
	tests := []struct {
		name       string
		plaintext  bool // the EPP serves plaintext HTTP
		target     func(epptransport.Target) epptransport.Target
		recipients []string
		withheld   string // "": the token is sent
	}{
		{name: "an in-cluster EPP over verified TLS gets it", target: func(tg epptransport.Target) epptransport.Target { return tg }},
		{name: "an in-cluster EPP in plaintext gets none", plaintext: true, withheld: WithheldPlaintext,
			target: func(tg epptransport.Target) epptransport.Target { tg.Transport = eppaddr.PortTransport{}; return tg }},
		{name: "an in-cluster EPP over TLS not verified gets none", withheld: WithheldUnverified,
			target: func(tg epptransport.Target) epptransport.Target { tg.Transport = unverified; return tg }},
		{name: "a local pool whose EPP Service is an ExternalName gets none", withheld: WithheldExternalName,
			target: func(tg epptransport.Target) epptransport.Target { tg.ExternalName = true; return tg }},
		{name: "another cluster's EPP gets none", withheld: WithheldRemote,
			target: func(tg epptransport.Target) epptransport.Target { tg.Cluster, tg.Local = "cluster-b", false; return tg }},
		{name: "another cluster's EPP in plaintext gets none, even when named", plaintext: true, recipients: []string{"cluster-b"}, withheld: WithheldPlaintext,
			target: func(tg epptransport.Target) epptransport.Target {
				tg.Cluster, tg.Local, tg.Transport = "cluster-b", false, eppaddr.PortTransport{}
				return tg
			}},
		{name: "another cluster's EPP named by its cluster gets it", recipients: []string{"cluster-b"},
			target: func(tg epptransport.Target) epptransport.Target { tg.Cluster, tg.Local = "cluster-b", false; return tg }},
		{name: "an ExternalName EPP named by its pool gets it", recipients: []string{"cluster-a/" + ns + "/llm"},
			target: func(tg epptransport.Target) epptransport.Target { tg.ExternalName = true; return tg }},
		{name: "another pool named does not name this one", recipients: []string{"cluster-b/" + ns + "/other"}, withheld: WithheldRemote,
			target: func(tg epptransport.Target) epptransport.Target { tg.Cluster, tg.Local = "cluster-b", false; return tg }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tokenFile := filepath.Join(t.TempDir(), "token")
			writeToken(t, tokenFile, "sidecar-token")
			m, url, creds := verifiedMetricsServer(t, "")
			if tc.plaintext {
				m = newMetricsServer(t, gauges("llm", 2), "")
				url = m.URL + "/metrics"
			}
			creds.SetTargets([]epptransport.Target{tc.target(inClusterTarget(url))})
			logs := &logLines{}
			s, err := NewPoolScraper(PoolScraperOptions{Interval: 10 * time.Millisecond, Timeout: time.Second, Staleness: time.Minute,
				TokenFile: tokenFile, TokenRecipients: tc.recipients, Credentials: creds})
			require.NoError(t, err)
			reg := prometheus.NewRegistry()
			reg.MustRegister(s.StateCollector(func() []ScrapedPool { return []ScrapedPool{{Cluster: "cluster-x", Pool: ns + "/llm", URL: url}} }))
			s.SetTargets([]string{url})
			runScraper(t, s, logs)
			require.Eventually(t, func() bool { return m.requests() >= 5 }, 5*time.Second, 10*time.Millisecond)

			want := ""
			if tc.withheld != "" {
				want = fmt.Sprintf("# HELP mci_sidecar_epp_metrics_token_withheld %s\n# TYPE mci_sidecar_epp_metrics_token_withheld gauge\n"+
					"mci_sidecar_epp_metrics_token_withheld{cluster=\"cluster-x\",pool=\"%s/llm\",reason=\"%s\"} 1\n", tokenWithheldHelp, ns, tc.withheld)
				assert.Empty(t, m.lastAuthorization(), "no Authorization header")
				assert.Equal(t, 1, logs.count(`"reason"="`+tc.withheld+`"`), "said once: %q", logs.lines)
			} else {
				assert.Equal(t, "Bearer sidecar-token", m.lastAuthorization())
				assert.Zero(t, logs.count("own metrics token is not sent"), "%q", logs.lines)
			}
			assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "mci_sidecar_epp_metrics_token_withheld"))
		})
	}
}

func TestPoolScraperLogsOncePerChangeOfState(t *testing.T) {
	m := newMetricsServer(t, gauges("llm", 1), "wanted")
	logs := &logLines{}
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 10 * time.Millisecond, Timeout: time.Second})
	require.NoError(t, err)
	s.SetTargets([]string{m.URL})
	runScraper(t, s, logs)
	require.Eventually(t, func() bool { return m.requests() > 10 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, logs.count(`"state"="unauthorized"`), "%q", logs.lines)
	m.token.Store(new(string))
	require.Eventually(t, func() bool { return logs.count(`"state"="fresh"`) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 2, logs.count(`"state"=`), "one line per change of state: %q", logs.lines)
	assert.Equal(t, 1, logs.count(`"result"="not_published"`), "and one for the prefix summary this EPP does not publish: %q", logs.lines)
}

func TestPoolScraperSendsTheTokenOfTheCredentialsSecret(t *testing.T) {
	serving := tlstest.NewServing(t, "127.0.0.1", "127.0.0.1")
	cert, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	require.NoError(t, err)
	m := &metricsServer{}
	page, token := gauges("llm", 2), "secret-token"
	m.page.Store(&page)
	m.token.Store(&token)
	m.Server = httptest.NewUnstartedServer(m)
	m.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	m.StartTLS()
	t.Cleanup(m.Close)
	url := m.URL + "/metrics"

	kube := kubefake.NewSimpleClientset(epptransporttest.Secret(ns, "epp-creds", map[string][]byte{"ca.crt": serving.CAPEM, epptransport.SecretTokenKey: []byte("secret-token\n")}))
	creds := epptransporttest.Run(t, kube, ns)
	creds.SetTargets([]epptransport.Target{{Addr: url, Cluster: "cluster-a", Port: eppaddr.PortMetrics, Transport: eppaddr.PortTransport{TLS: true, Secret: types.NamespacedName{Namespace: ns, Name: "epp-creds"}, Namespace: ns}}})

	// The Secret's token wins over the token file.
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken(t, tokenFile, "file-token")
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second, Staleness: time.Minute, TokenFile: tokenFile, Credentials: creds})
	require.NoError(t, err)
	s.SetTargets([]string{url})
	runScraper(t, s, nil)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		state, why, _ := s.State(url, "llm", time.Now())
		assert.Equal(ct, MetricsFresh, state, "%v", why)
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "Bearer secret-token", m.lastAuthorization())

	tok, secret, err := creds.MetricsToken("http://127.0.0.1:1/metrics")
	require.NoError(t, err)
	assert.Empty(t, tok+secret, "a URL without a Secret has no Secret token")
}

func TestTheExpiryOfTheMetricsTokenSentIsExported(t *testing.T) {
	exp := time.Unix(2000000000, 0)
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(exp)}).SignedString([]byte("key"))
	require.NoError(t, err)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken(t, tokenFile, token)
	_, url, creds := verifiedMetricsServer(t, token)
	creds.SetTargets([]epptransport.Target{inClusterTarget(url)})
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second, Staleness: time.Minute, TokenFile: tokenFile, Credentials: creds})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.StateCollector(func() []ScrapedPool { return []ScrapedPool{{Cluster: "cluster-a", Pool: ns + "/llm", URL: url}} }))
	s.SetTargets([]string{url})
	runScraper(t, s, nil)
	want := fmt.Sprintf("# HELP mci_sidecar_epp_metrics_token_expiry_timestamp_seconds %s\n# TYPE mci_sidecar_epp_metrics_token_expiry_timestamp_seconds gauge\n"+
		"mci_sidecar_epp_metrics_token_expiry_timestamp_seconds{cluster=\"cluster-a\",pool=\"%s/llm\",source=\"file\"} 2e+09\n", tokenExpiryHelp, ns)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, testutil.GatherAndCompare(reg, strings.NewReader(want), "mci_sidecar_epp_metrics_token_expiry_timestamp_seconds"))
	}, 5*time.Second, 10*time.Millisecond)
}

func TestEPPMetricsStateMetric(t *testing.T) {
	m := newMetricsServer(t, gauges("llm", 1), "wanted")
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second})
	require.NoError(t, err)
	pools := []ScrapedPool{
		{Cluster: "cluster-a", Pool: ns + "/llm", URL: m.URL},
		{Cluster: "cluster-a", Pool: ns + "/llm", URL: m.URL},
		{Cluster: "cluster-c", Pool: ns + "/llm", URL: "http://127.0.0.1:1/not-scraped"},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.StateCollector(func() []ScrapedPool { return pools }))
	s.SetTargets([]string{m.URL})
	runScraper(t, s, nil)
	want := func(state MetricsState) string {
		var b strings.Builder
		b.WriteString("# HELP mci_sidecar_epp_metrics_state " + eppMetricsStateHelp + "\n")
		b.WriteString("# TYPE mci_sidecar_epp_metrics_state gauge\n")
		for _, s := range MetricsStates {
			v := 0
			if s == state {
				v = 1
			}
			fmt.Fprintf(&b, "mci_sidecar_epp_metrics_state{cluster=\"cluster-a\",pool=\"%s/llm\",state=\"%s\"} %d\n", ns, s, v)
		}
		return b.String()
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, testutil.GatherAndCompare(reg, strings.NewReader(want(MetricsUnauthorized)), "mci_sidecar_epp_metrics_state"))
	}, 5*time.Second, 10*time.Millisecond)
	m.token.Store(new(string))
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		assert.NoError(ct, testutil.GatherAndCompare(reg, strings.NewReader(want(MetricsFresh)), "mci_sidecar_epp_metrics_state"))
	}, 5*time.Second, 10*time.Millisecond)
}

// TestParsePoolOfMCIEPP reads the gauges as pkg/epp serves them, under
// each naming scheme it can serve.
func TestParsePoolOfMCIEPP(t *testing.T) {
	tests := []struct {
		name       string
		schemes    []metrics.PoolScheme
		wantScheme string
		wantNames  []string
		wantAbsent []string
	}{
		{name: "by default the GIE names", wantScheme: "inference_pool", wantNames: []string{"inference_pool_ready_pods"}, wantAbsent: []string{"llm_d_epp_ready_endpoints"}},
		{name: "the llm-d names", schemes: []metrics.PoolScheme{metrics.LLMDScheme}, wantScheme: "llm_d_epp", wantNames: []string{"llm_d_epp_ready_endpoints"}, wantAbsent: []string{"inference_pool_ready_pods"}},
		{name: "both, as llm-d serves them", schemes: []metrics.PoolScheme{metrics.LLMDScheme, metrics.GIEScheme}, wantScheme: "inference_pool", wantNames: []string{"llm_d_epp_ready_endpoints", "inference_pool_ready_pods"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			p := epp.NewPool("llm", nil, nil)
			require.NoError(t, p.SetEndpoints([]epp.Endpoint{{Name: "a", Address: "127.0.0.1:1"}}))
			epp.NewMetrics(reg, p, time.Second, 0, tt.schemes...)
			srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			defer srv.Close()
			resp, err := http.Get(srv.URL)
			require.NoError(t, err)
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			for _, n := range tt.wantNames {
				assert.Contains(t, string(body), n+`{name="llm"} 1`)
			}
			for _, n := range tt.wantAbsent {
				assert.NotContains(t, string(body), n)
			}
			got, err := metrics.ParsePool(bytes.NewReader(body))
			require.NoError(t, err)
			require.Contains(t, got, "llm")
			assert.Equal(t, 1, got["llm"].ReadyPods)
			assert.Equal(t, tt.wantScheme, got["llm"].Scheme)
		})
	}
}

// The metrics token Secret sends its token to a plaintext /metrics (an
// upstream EPP at its default flags) and changes no transport; one that
// cannot be used fails the metrics port alone, counted with the connection
// failures, and is never replaced by another token.
func TestPoolScraperSendsTheMetricsTokenSecret(t *testing.T) {
	tokenRef := types.NamespacedName{Namespace: ns, Name: "epp-metrics-token"}
	tests := []struct {
		name      string
		secret    map[string][]byte // nil: no Secret
		wantState MetricsState
		wantAuth  string
	}{
		{name: "the Secret's token is sent", secret: map[string][]byte{epptransport.SecretTokenKey: []byte("the-token\n")}, wantState: MetricsFresh, wantAuth: "Bearer the-token"},
		{name: "a missing Secret fails the scrape, nothing is sent", wantState: MetricsUnreachable},
		{name: "a Secret without a token fails the scrape", secret: map[string][]byte{"ca.crt": []byte("unused")}, wantState: MetricsUnreachable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMetricsServer(t, gauges("llm", 2), "the-token")
			url := m.URL + "/metrics"
			kube := kubefake.NewSimpleClientset()
			if tc.secret != nil {
				kube = kubefake.NewSimpleClientset(epptransporttest.Secret(ns, tokenRef.Name, tc.secret))
			}
			creds := epptransporttest.Run(t, kube, ns)
			reg := prometheus.NewRegistry()
			creds.RegisterMetrics(reg)
			creds.SetTargets([]epptransport.Target{{Addr: url, Cluster: "cluster-a", Port: eppaddr.PortMetrics, Token: tokenRef}})
			tokenFile := filepath.Join(t.TempDir(), "token")
			writeToken(t, tokenFile, "file-token")
			s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second, Staleness: time.Minute, TokenFile: tokenFile, Credentials: creds})
			require.NoError(t, err)
			s.SetTargets([]string{url})
			runScraper(t, s, nil)
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				state, why, _ := s.State(url, "llm", time.Now())
				assert.Equal(ct, tc.wantState, state, "%v", why)
			}, 5*time.Second, 10*time.Millisecond)
			failures := connectionFailures(t, reg, "cluster-a", eppaddr.PortMetrics)
			if tc.wantState == MetricsFresh {
				assert.Equal(t, tc.wantAuth, m.lastAuthorization())
				assert.Zero(t, failures)
				return
			}
			assert.Zero(t, m.requests(), "the EPP is never scraped without the token its pool names")
			assert.Positive(t, failures, "counted with the connection failures")
		})
	}
}

// connectionFailures reads mci_sidecar_epp_connection_failures_total of a
// cluster's port from reg.
func connectionFailures(t *testing.T, reg *prometheus.Registry, cluster, port string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, f := range families {
		if f.GetName() != "mci_sidecar_epp_connection_failures_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["cluster"] == cluster && labels["port"] == port {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// A MetricsRef reads what Get reads for its URL and pool, the latest
// scrape's, until the scraped URLs change (Version).
func TestMetricsRefsReadWhatGetReads(t *testing.T) {
	m := newMetricsServer(t, gauges("llm", 7), "")
	s, err := NewPoolScraper(PoolScraperOptions{Interval: 20 * time.Millisecond, Timeout: time.Second})
	require.NoError(t, err)
	s.SetTargets([]string{m.URL})
	targets := [][2]string{{m.URL, "llm"}, {m.URL, "other"}, {"http://127.0.0.1:1/metrics", "llm"}, {"", "llm"}}
	refs := make([]MetricsRef, len(targets))
	version := s.Refs(func(i int) (string, string) { return targets[i][0], targets[i][1] }, refs)
	runScraper(t, s, nil)
	require.Eventually(t, func() bool { g := refs[0].Get(); return g != nil && g.AverageQueue == 7 }, 5*time.Second, 10*time.Millisecond)
	for i, tt := range targets {
		assert.Same(t, s.Get(tt[0], tt[1]), refs[i].Get(), "%v", tt)
	}

	page := gauges("llm", 9)
	m.page.Store(&page)
	require.Eventually(t, func() bool { return refs[0].Get().AverageQueue == 9 }, 5*time.Second, 10*time.Millisecond, "a Ref reads the latest scrape")
	assert.Equal(t, version, s.Version())
	s.SetTargets(nil)
	assert.NotEqual(t, version, s.Version(), "a change of the URLs changes the version")
}

// A pool's gauges are its series, or the only series of an EPP that
// serves one whatever its name; of an EPP that serves several, an
// unknown pool has none.
func TestPoolScraperFindsAPoolsGaugesByNameOrAsTheOnlyOnes(t *testing.T) {
	one := newMetricsServer(t, gauges("llm", 7), "")
	two := newMetricsServer(t, gauges("a", 1)+gauges("b", 2), "")
	s, err := NewPoolScraper(PoolScraperOptions{Interval: time.Hour, Timeout: time.Second})
	require.NoError(t, err)
	s.SetTargets([]string{one.URL, two.URL})
	runScraper(t, s, nil)
	require.Eventually(t, func() bool { return s.Get(one.URL, "llm") != nil && s.Get(two.URL, "a") != nil }, 5*time.Second, 10*time.Millisecond)
	queue := func(url, pool string) float64 {
		if g := s.Get(url, pool); g != nil {
			return g.AverageQueue
		}
		return -1
	}
	assert.Equal(t, 7.0, queue(one.URL, "llm"))
	assert.Equal(t, 7.0, queue(one.URL, "other"), "the only series, whatever its name")
	assert.Equal(t, 1.0, queue(two.URL, "a"))
	assert.Equal(t, 2.0, queue(two.URL, "b"))
	assert.Equal(t, -1.0, queue(two.URL, "other"), "of several, none is taken for another")
}
