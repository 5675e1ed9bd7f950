package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// series is one replica's samples every 10s from t0: watches served and
// live heap (MiB) per sample.
func series(t0 time.Time, watches []float64, liveMiB []float64) []sample {
	out := make([]sample, len(watches))
	for i := range watches {
		out[i] = sample{At: t0.Add(time.Duration(i) * 10 * time.Second), PID: 7, Watches: watches[i], NextGC: 2 * liveMiB[i] * (1 << 20), Goroutines: 330 + watches[i], FDs: 16}
	}
	return out
}

func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestWatchesMovedFindsWhereTheEndLevelBegan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name    string
		watches []float64
		moved   bool
		at      int // index of the sample it reports
	}{
		{name: "flat", watches: repeat(17, 30)},
		{name: "flat but for a one-sample blip", watches: append(append(repeat(17, 10), 12), repeat(17, 19)...)},
		{name: "within tolerance", watches: append(repeat(17, 15), repeat(19, 15)...)},
		{name: "the cluster's watches moved onto it", watches: append(repeat(0, 12), repeat(18, 18)...), moved: true, at: 11},
		{name: "they moved away", watches: append(repeat(18, 20), repeat(0, 10)...), moved: true, at: 19},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			life := series(t0, c.watches, repeat(12, len(c.watches)))
			at, moved := watchesMoved(life, time.Minute)
			require.Equal(t, c.moved, moved)
			if moved {
				assert.Equal(t, life[c.at].At, at)
			}
		})
	}
}

func TestCompareJudgesAReplicaFromWhenItsClusterWatchesMovedOntoIt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// 0 watches and 12 MiB for 5 minutes, then the cluster's 40 watches
	// and 15 MiB for 15 minutes, flat: no growth of its own.
	watches := append(repeat(0, 30), repeat(40, 90)...)
	live := append(repeat(12, 30), repeat(15, 90)...)
	s := &scraped{Name: "cluster-c-mci-apiserver", Cluster: "cluster-c", samples: series(t0, watches, live)}
	g := s.compare(t0, 2*time.Minute, 30*time.Second, true, 5*time.Minute)
	require.True(t, g.Judged, g.Why)
	assert.Empty(t, g.Failures)
	require.NotNil(t, g.Rebaselined)
	assert.Equal(t, t0.Add(290*time.Second), *g.Rebaselined)
	assert.InDelta(t, 15, g.LiveStartMiB, 0.01)
	assert.InDelta(t, 40, g.WatchesStart, 0.01)

	// The same figures without the watches (mci-sidecar, say) are growth.
	s = &scraped{Name: "cluster-b-mci-sidecar", samples: series(t0, watches, live)}
	g = s.compare(t0, 2*time.Minute, 30*time.Second, true, 5*time.Minute)
	assert.Nil(t, g.Rebaselined)
	assert.Len(t, g.Failures, 2, "live heap and goroutines grew: %v", g.Failures)

	// Growth after the move is still growth.
	live = append(repeat(12, 30), append(repeat(15, 45), repeat(18, 45)...)...)
	s = &scraped{Name: "cluster-c-mci-apiserver", Cluster: "cluster-c", samples: series(t0, watches, live)}
	g = s.compare(t0, 2*time.Minute, 30*time.Second, true, 5*time.Minute)
	require.Len(t, g.Failures, 1)
	assert.Contains(t, g.Failures[0], "live heap 15.0 MiB -> 18.0 MiB")
}

func TestWatchTotalsAddTheReplicasOfACluster(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r0 := &scraped{Name: "cluster-c-mci-apiserver", Cluster: "cluster-c", samples: series(t0, append(repeat(0, 30), repeat(40, 90)...), repeat(12, 120))}
	r1 := &scraped{Name: "cluster-c-mci-apiserver-1", Cluster: "cluster-c", samples: series(t0, append(repeat(40, 30), repeat(0, 90)...), repeat(12, 120))}
	sidecar := &scraped{Name: "cluster-b-mci-sidecar", samples: series(t0, repeat(0, 120), repeat(12, 120))}
	got := watchTotals([]*scraped{r0, r1, sidecar}, t0, 2*time.Minute)
	assert.Equal(t, []watchTotal{{Cluster: "cluster-c", Start: 40, End: 40}}, got)
}

func TestCompareReportsAReplicaRestartedTooLateForItsSamplesToSettle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// 200s of its first process, then two samples of a process started
	// then, both within the settle time of its start.
	s := &scraped{Name: "cluster-b-mci-apiserver", Cluster: "cluster-b", samples: series(t0, repeat(18, 20), repeat(12, 20))}
	restarted := series(t0.Add(200*time.Second), repeat(18, 2), repeat(12, 2))
	for i := range restarted {
		restarted[i].PID = 8
	}
	s.samples = append(s.samples, restarted...)
	g := s.compare(t0, 2*time.Minute, 30*time.Second, true, 5*time.Minute)
	assert.False(t, g.Judged)
	assert.Equal(t, "too few samples of its last process", g.Why)
}
