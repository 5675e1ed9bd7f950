package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/outlier"
	"github.com/mci-dev/mci/pkg/routetable"
)

// BenchmarkLiveStateRead is what a pick reads of the running sidecar's
// state for a backend of 100 or 1,000 clusters: the health prober's and
// the pool scraper's findings and the outlier detector's ejections (every
// cluster probed, here marked failed, scraped once from a loopback
// server, and in the choice), the look-ups and their locks alone, which
// BenchmarkDecideAtScale's state (maps under a mutex) stands in for.
// parallel runs a pick on each of GOMAXPROCS goroutines at once, as the
// gateway's streams do.
func BenchmarkLiveStateRead(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "inference_pool_average_queue_size{name=\"llm\"} 1\ninference_pool_average_kv_cache_utilization{name=\"llm\"} 0.5\n")
	}))
	defer srv.Close()
	for _, n := range []int{100, 1000} {
		clusters := make([]*routetable.Cluster, n)
		var health, metrics []string
		for i := range clusters {
			c := &routetable.Cluster{Name: fmt.Sprintf("cluster-%04d", i), Pool: "default/llm",
				Health: fmt.Sprintf("127.1.%d.%d:9003", i>>8, i&255), Metrics: fmt.Sprintf("%s/metrics/%d", srv.URL, i)}
			clusters[i] = c
			health, metrics = append(health, c.Health), append(metrics, c.Metrics)
		}
		prober := eppprobe.NewHealthProber(eppprobe.HealthProberOptions{})
		prober.SetTargets(health)
		for _, addr := range health {
			prober.MarkFailed(addr)
		}
		scraper, err := eppprobe.NewPoolScraper(eppprobe.PoolScraperOptions{Interval: time.Hour, Timeout: 10 * time.Second})
		require.NoError(b, err)
		scraper.SetTargets(metrics)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- scraper.Run(ctx) }()
		scraped := 0
		require.Eventually(b, func() bool {
			for scraped < n && scraper.Get(clusters[scraped].Metrics, "llm") != nil {
				scraped++
			}
			return scraped == n
		}, time.Minute, 10*time.Millisecond)
		st := ejectingState{State: newLiveState(prober, scraper),
			w: newOutlierWatch(&OutlierConfig{Detection: outlier.DefaultConfig(), FirstByte: outlier.DefaultFirstByteConfig()}, nil, logr.Discard())}
		// Every cluster seen once, as after the first pick.
		st.Read(clusters, nil, make([]clusterscore.Candidate, n), true)
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			cands := make([]clusterscore.Candidate, n)
			for b.Loop() {
				st.Read(clusters, nil, cands, true)
			}
		})
		b.Run(fmt.Sprintf("clusters=%d/parallel", n), func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				cands := make([]clusterscore.Candidate, n)
				for pb.Next() {
					st.Read(clusters, nil, cands, true)
				}
			})
		})
		cancel()
		require.NoError(b, <-done)
	}
}
