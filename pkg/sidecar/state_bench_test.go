package sidecar

import (
	"fmt"
	"testing"

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
// cluster a target of both, with no finding yet, and in the choice), the
// look-ups and their locks alone, which BenchmarkDecideAtScale's state
// (maps under a mutex) stands in for. parallel runs a pick on each of
// GOMAXPROCS goroutines at once, as the gateway's streams do.
func BenchmarkLiveStateRead(b *testing.B) {
	for _, n := range []int{100, 1000} {
		clusters := make([]*routetable.Cluster, n)
		var health, metrics []string
		for i := range clusters {
			c := &routetable.Cluster{Name: fmt.Sprintf("cluster-%04d", i), Pool: "default/llm",
				Health: fmt.Sprintf("127.1.%d.%d:9003", i>>8, i&255), Metrics: fmt.Sprintf("http://127.1.%d.%d:9090/metrics", i>>8, i&255)}
			clusters[i] = c
			health, metrics = append(health, c.Health), append(metrics, c.Metrics)
		}
		prober := eppprobe.NewHealthProber(eppprobe.HealthProberOptions{})
		prober.SetTargets(health)
		scraper, err := eppprobe.NewPoolScraper(eppprobe.PoolScraperOptions{})
		require.NoError(b, err)
		scraper.SetTargets(metrics)
		st := ejectingState{State: newLiveState(prober, scraper),
			w: newOutlierWatch(&OutlierConfig{Detection: outlier.DefaultConfig(), FirstByte: outlier.DefaultFirstByteConfig()}, nil, logr.Discard())}
		// Every cluster seen once, as after the first pick.
		st.Read(clusters, make([]clusterscore.Candidate, n), true)
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			cands := make([]clusterscore.Candidate, n)
			for b.Loop() {
				st.Read(clusters, cands, true)
			}
		})
		b.Run(fmt.Sprintf("clusters=%d/parallel", n), func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				cands := make([]clusterscore.Candidate, n)
				for pb.Next() {
					st.Read(clusters, cands, true)
				}
			})
		})
	}
}
