package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/scheduling"
)

// How a fake model server answers /metrics.
const (
	serveMetrics int32 = iota
	serve500
	serveGarbage
	serveHang
)

// modelServer is a fake vLLM server on 127.0.0.1 whose load and behaviour a
// test changes while the scraper runs.
type modelServer struct {
	*httptest.Server
	mode     atomic.Int32
	queue    atomic.Int64
	requests atomic.Int64
}

func newModelServer(t *testing.T) *modelServer {
	t.Helper()
	s := &modelServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		switch s.mode.Load() {
		case serve500:
			http.Error(w, "engine dead", http.StatusInternalServerError)
		case serveGarbage:
			_, _ = fmt.Fprint(w, "<html>definitely not metrics</html>\n")
		case serveHang:
			<-r.Context().Done()
		default:
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = fmt.Fprintf(w, `# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} %d
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7e+09
`, s.queue.Load())
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// waitForRequests waits until the server has seen n more requests.
func (s *modelServer) waitForRequests(t *testing.T, n int64) {
	t.Helper()
	target := s.requests.Load() + n
	require.Eventually(t, func() bool { return s.requests.Load() >= target }, 10*time.Second, time.Millisecond,
		"the scraper keeps scraping")
}

// runScraper runs s until the test ends.
func runScraper(t *testing.T, s *Scraper) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
}

func queueIs(s *Scraper, url string, queue int) func() bool {
	return func() bool {
		m := s.Get(url)
		return m != nil && m.WaitingQueue == queue
	}
}

func TestScraperFollowsChangingMetrics(t *testing.T) {
	srv := newModelServer(t)
	s := NewScraper(ScraperOptions{Interval: 5 * time.Millisecond})
	require.NoError(t, s.AddTarget(srv.URL))
	assert.Nil(t, s.Get(srv.URL), "no metrics before the first scrape")
	runScraper(t, s)

	srv.queue.Store(3)
	require.Eventually(t, queueIs(s, srv.URL, 3), 10*time.Second, time.Millisecond)
	first := s.Get(srv.URL)
	assert.Equal(t, 0.5, first.KVCacheUsage)
	assert.True(t, first.ActiveAdapters.Has("sql-lora"))
	assert.Equal(t, 2, first.MaxLoRA)
	assert.WithinDuration(t, time.Now(), first.UpdatedAt, 5*time.Second)

	srv.queue.Store(42)
	require.Eventually(t, queueIs(s, srv.URL, 42), 10*time.Second, time.Millisecond)
	assert.True(t, s.Get(srv.URL).UpdatedAt.After(first.UpdatedAt), "newer metrics carry a newer time")
	assert.Equal(t, 3, first.WaitingQueue, "published metrics are never modified")
}

func TestScraperKeepsLastMetricsWhenScrapesFail(t *testing.T) {
	tests := []struct {
		name string
		mode int32
	}{
		{name: "a server answering 500 keeps its last metrics and their time", mode: serve500},
		{name: "a server answering garbage keeps its last metrics and their time", mode: serveGarbage},
		{name: "a server that hangs past the timeout keeps its last metrics and their time", mode: serveHang},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newModelServer(t)
			srv.queue.Store(7)
			s := NewScraper(ScraperOptions{Interval: 5 * time.Millisecond, Timeout: 50 * time.Millisecond})
			require.NoError(t, s.AddTarget(srv.URL))
			runScraper(t, s)
			require.Eventually(t, queueIs(s, srv.URL, 7), 10*time.Second, time.Millisecond)

			srv.mode.Store(tt.mode)
			srv.queue.Store(0)
			// A scrape may have been under way when the mode changed; from
			// the second request on, all see the failure.
			srv.waitForRequests(t, 1)
			last := s.Get(srv.URL)
			srv.waitForRequests(t, 3)

			got := s.Get(srv.URL)
			assert.Same(t, last, got, "failed scrapes publish nothing")
			assert.Equal(t, 7, got.WaitingQueue, "the last metrics are kept, not reset to an idle-looking zero")

			srv.mode.Store(serveMetrics)
			require.Eventually(t, queueIs(s, srv.URL, 0), 10*time.Second, time.Millisecond, "a recovered server is scraped again")
			assert.True(t, s.Get(srv.URL).UpdatedAt.After(got.UpdatedAt))
		})
	}
}

func TestFailedScrapesMakeTheTargetStaleToTheScheduler(t *testing.T) {
	srv := newModelServer(t)
	s := NewScraper(ScraperOptions{Interval: 5 * time.Millisecond})
	require.NoError(t, s.AddTarget(srv.URL))
	runScraper(t, s)
	require.Eventually(t, func() bool { return s.Get(srv.URL) != nil }, 10*time.Second, time.Millisecond)

	srv.mode.Store(serve500)
	srv.waitForRequests(t, 2)
	m := s.Get(srv.URL)

	cfg := scheduling.DefaultConfig()
	sched := scheduling.New(cfg, nil)
	busy := &scheduling.Metrics{WaitingQueue: 500, KVCacheUsage: 0.99, UpdatedAt: m.UpdatedAt.Add(cfg.MetricsStaleness)}
	i, err := sched.Schedule(scheduling.Request{Criticality: scheduling.Critical}, []*scheduling.Metrics{m, busy}, m.UpdatedAt.Add(cfg.MetricsStaleness+time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, 1, i, "once the staleness bound has passed, the failing server loses even to a busy one")
}

func TestAHungTargetDoesNotDelayTheOthers(t *testing.T) {
	hung, healthy := newModelServer(t), newModelServer(t)
	hung.mode.Store(serveHang)
	s := NewScraper(ScraperOptions{Interval: 5 * time.Millisecond, Timeout: time.Minute})
	require.NoError(t, s.SetTargets([]string{hung.URL, healthy.URL}))
	runScraper(t, s)

	// The hung server gets exactly one request, which may already have
	// arrived: wait for it by count, not for one more.
	require.Eventually(t, func() bool { return hung.requests.Load() >= 1 }, 10*time.Second, time.Millisecond,
		"the hung server is scraped")
	for q := range 5 {
		healthy.queue.Store(int64(q + 1))
		require.Eventually(t, queueIs(s, healthy.URL, q+1), 10*time.Second, time.Millisecond)
	}
	assert.Nil(t, s.Get(hung.URL))
	assert.Equal(t, int64(1), hung.requests.Load(), "the hung scrape is still the only one")
}

func TestTargetsComeAndGoWhileRunning(t *testing.T) {
	a, b := newModelServer(t), newModelServer(t)
	a.queue.Store(1)
	b.queue.Store(2)
	s := NewScraper(ScraperOptions{Interval: 5 * time.Millisecond})
	require.NoError(t, s.AddTarget(a.URL))
	runScraper(t, s)
	require.Eventually(t, queueIs(s, a.URL, 1), 10*time.Second, time.Millisecond)

	require.NoError(t, s.AddTarget(b.URL), "a target added while running")
	require.Eventually(t, queueIs(s, b.URL, 2), 10*time.Second, time.Millisecond)
	require.NoError(t, s.AddTarget(b.URL), "adding a target twice is harmless")
	assert.ElementsMatch(t, []string{a.URL, b.URL}, s.Targets())

	s.RemoveTarget(a.URL)
	assert.Nil(t, s.Get(a.URL), "a removed target has no metrics")
	snap := s.Snapshot()
	assert.Len(t, snap, 1)
	assert.Equal(t, 2, snap[b.URL].WaitingQueue)

	// A scrape of a in flight at removal may still land; none follows.
	b.waitForRequests(t, 5)
	seen := a.requests.Load()
	b.waitForRequests(t, 5)
	assert.Equal(t, seen, a.requests.Load(), "a removed target is not scraped any more")

	require.NoError(t, s.SetTargets([]string{a.URL}))
	assert.Equal(t, []string{a.URL}, s.Targets())
	require.Eventually(t, queueIs(s, a.URL, 1), 10*time.Second, time.Millisecond, "a target added back is scraped again")
	assert.Nil(t, s.Get(b.URL))
}

func TestRunStopsPromptlyWithAScrapeInFlight(t *testing.T) {
	srv := newModelServer(t)
	srv.mode.Store(serveHang)
	s := NewScraper(ScraperOptions{Timeout: time.Minute})
	require.NoError(t, s.AddTarget(srv.URL))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	srv.waitForRequests(t, 1)

	assert.Error(t, s.Run(ctx), "a second Run is refused")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

func TestAddTargetRejectsWhatIsNotAnHTTPURL(t *testing.T) {
	s := NewScraper(ScraperOptions{})
	for _, u := range []string{"", "10.0.0.1:8000/metrics", "ftp://host/metrics", "http:///metrics", "http://[::1"} {
		assert.Error(t, s.AddTarget(u), "%q", u)
	}
	assert.Empty(t, s.Targets())
}

func TestScrapeRefusesAnOversizedResponse(t *testing.T) {
	srv := newModelServer(t)
	s := NewScraper(ScraperOptions{MaxResponseBytes: 100})
	_, err := s.scrape(context.Background(), srv.URL)
	require.Error(t, err)
	assert.Contains(t, err.Error(), ErrTooLarge.Error())

	s = NewScraper(ScraperOptions{})
	m, err := s.scrape(context.Background(), srv.URL)
	require.NoError(t, err)
	assert.Equal(t, 0.5, m.KVCacheUsage)
}

func TestLimitedReaderReadsABodyOfExactlyTheLimit(t *testing.T) {
	body := strings.Repeat("x", 10)
	got, err := io.ReadAll(&limitedReader{r: strings.NewReader(body), left: 10})
	require.NoError(t, err)
	assert.Equal(t, body, string(got))

	_, err = io.ReadAll(&limitedReader{r: strings.NewReader(body), left: 9})
	assert.ErrorIs(t, err, ErrTooLarge)
}
