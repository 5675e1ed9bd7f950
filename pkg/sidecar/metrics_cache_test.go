package sidecar

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"

	"github.com/mci-dev/mci/pkg/clusterscore"
)

// TestPrefixHomeMetrics counts home placements by backend and result, and
// whether a backend's capacities were taken as alike, through the series
// kept after their first lookup.
func TestPrefixHomeMetrics(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	m.prefixHome("ns/a", clusterscore.HomeDecision{Outcome: clusterscore.HomeDealt, Home: "east", Alike: true})
	m.prefixHome("ns/a", clusterscore.HomeDecision{Outcome: clusterscore.HomeDealt, Home: "east"})
	m.prefixHome("ns/a", clusterscore.HomeDecision{Outcome: clusterscore.HomeScoreOrder})
	m.prefixHome("ns/b", clusterscore.HomeDecision{Outcome: clusterscore.HomeDealt, Home: "west", Alike: true})

	assert.Equal(t, 2.0, testutil.ToFloat64(m.homes.WithLabelValues("ns/a", clusterscore.HomeDealt.String())))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.homes.WithLabelValues("ns/a", clusterscore.HomeScoreOrder.String())))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.homes.WithLabelValues("ns/b", clusterscore.HomeDealt.String())))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.homesAlike.WithLabelValues("ns/a")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.homesAlike.WithLabelValues("ns/b")))

	allocs := testing.AllocsPerRun(100, func() {
		m.prefixHome("ns/a", clusterscore.HomeDecision{Outcome: clusterscore.HomeDealt, Home: "east"})
	})
	assert.Zero(t, allocs, "allocations of a request's home placement counted")
}
