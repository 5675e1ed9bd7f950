package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/routetable"
)

// The live state keeps each backend's references to the prober's and the
// scraper's findings from pick to pick: they must read what the prober
// and the scraper know now, and be made again when either one's targets
// change, or a pick would read a cluster's health or load as it was.
func TestLiveStateReadsWhatTheProberAndScraperKnowAfterTheirTargetsChange(t *testing.T) {
	queue := 3
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "inference_pool_average_queue_size{name=\"llm\"} %d\ninference_pool_average_kv_cache_utilization{name=\"llm\"} 0.5\n", queue)
	}))
	t.Cleanup(srv.Close)
	prober := eppprobe.NewHealthProber(eppprobe.HealthProberOptions{})
	scraper, err := eppprobe.NewPoolScraper(eppprobe.PoolScraperOptions{Interval: time.Hour, Timeout: time.Second})
	require.NoError(t, err)
	clusters := []*routetable.Cluster{
		{Name: "a", Pool: "default/llm", Health: "127.0.0.1:1", Metrics: srv.URL + "/a"},
		{Name: "b", Pool: "default/llm", Health: "127.0.0.1:2", Metrics: srv.URL + "/b"},
	}
	prober.SetTargets([]string{"127.0.0.1:1", "127.0.0.1:2"})
	st := newLiveState(prober, scraper)
	read := func() []clusterscore.Candidate {
		cands := make([]clusterscore.Candidate, len(clusters))
		st.Read(clusters, nil, cands, true)
		return cands
	}
	health := func(cands []clusterscore.Candidate) []Health { return []Health{cands[0].Health, cands[1].Health} }

	got := read()
	assert.Equal(t, []Health{HealthUnknown, HealthUnknown}, health(got), "not probed yet")
	assert.Nil(t, got[0].Pool, "not scraped yet")

	prober.MarkFailed("127.0.0.1:1")
	assert.Equal(t, []Health{HealthNotServing, HealthUnknown}, health(read()), "the references kept read the prober's latest finding")

	prober.SetTargets([]string{"127.0.0.1:2"})
	prober.SetTargets([]string{"127.0.0.1:1", "127.0.0.1:2"})
	assert.Equal(t, []Health{HealthUnknown, HealthUnknown}, health(read()),
		"an address removed and probed again is a new target: its old finding is not read")

	scraper.SetTargets([]string{srv.URL + "/a"})
	runScraper(t, scraper)
	require.Eventually(t, func() bool { return read()[0].Pool != nil }, 5*time.Second, 10*time.Millisecond,
		"the scraper's new targets are read")
	got = read()
	assert.Equal(t, 3.0, got[0].Pool.AverageQueue)
	assert.Nil(t, got[1].Pool, "not a target")
	assert.Same(t, got[0].Pool, scraper.Get(srv.URL+"/a", "llm"))

	scraper.SetTargets([]string{srv.URL + "/b"})
	assert.Nil(t, read()[0].Pool, "a URL no longer scraped has no gauges")

	other := []*routetable.Cluster{clusters[1], clusters[0]}
	cands := make([]clusterscore.Candidate, 2)
	st.Read(other, nil, cands, true)
	assert.Equal(t, []Health{HealthUnknown, HealthUnknown}, []Health{cands[0].Health, cands[1].Health})
	require.Eventually(t, func() bool { st.Read(other, nil, cands, true); return cands[0].Pool != nil }, 5*time.Second, 10*time.Millisecond,
		"another backend's clusters have references of their own")
	prober.MarkFailed("127.0.0.1:2")
	st.Read(other, nil, cands, true)
	assert.Equal(t, HealthNotServing, cands[0].Health)
	assert.Nil(t, cands[1].Pool)
}

// runScraper runs s until the test ends.
func runScraper(t *testing.T, s *eppprobe.PoolScraper) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}
