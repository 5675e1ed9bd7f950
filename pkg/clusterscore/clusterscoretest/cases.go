// Package clusterscoretest holds the expected orders of the named cluster
// policies (Weighted, HealthBased, LocalFirst, MetricsBased) over small
// backends: one table that pkg/clusterscore runs against its Pipeline and
// pkg/sidecar against its ClusterPolicy (backends built from a routing
// table, health and metrics through its State), so that the pipeline and
// the sidecar's use of it are held to the same figures.
package clusterscoretest

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Epoch is the time of the requests and of fresh metrics.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Case is a backend of clusters with their weights, health and pool
// metrics, a request, and the order a named policy gives it.
type Case struct {
	Name string
	// Policy is a named configuration of clusterscore.
	Policy string
	// Clusters are the backend's remote clusters, in order; Weights their
	// weights (1 for those not given).
	Clusters []string
	Weights  []int64
	// Local adds the local pool "local", outside the rotation (an
	// InferencePoolImport's local pool of the same name).
	Local       bool
	Criticality scheduling.Criticality
	// Health and Metrics are what is known of each cluster by name.
	Health  map[string]clusterscore.Health
	Metrics map[string]*clusterscore.PoolMetrics
	// WantOrder is the first order of a new backend (nil: not checked);
	// WantErr the error it gives instead.
	WantOrder []string
	WantErr   error
	// WantFirst, when set, counts the first cluster of each of Picks
	// orders of a new backend ("" for an empty order).
	WantFirst map[string]int
	Picks     int
}

// Cases are the cases of every named policy.
func Cases() []Case {
	return slices.Concat(weightedCases(), healthBasedCases(), localFirstCases(), metricsBasedCases(), metricsBasedUnmeasuredCases())
}

// withPolicy sets the policy of cases, their clusters where they give
// none, and how many picks their first-pick shares are counted over.
func withPolicy(policy string, clusters []string, picks int, cases ...Case) []Case {
	for i := range cases {
		cases[i].Policy = policy
		if cases[i].Clusters == nil {
			cases[i].Clusters = clusters
		}
		if cases[i].WantFirst != nil {
			cases[i].Picks = picks
		}
	}
	return cases
}

func weightedCases() []Case {
	return withPolicy(routingpolicy.Weighted, []string{"a", "b", "c"}, 300,
		Case{Name: "equal weights split equally", WantFirst: map[string]int{"a": 100, "b": 100, "c": 100}, WantOrder: []string{"a", "b", "c"}},
		Case{Name: "annotated weights hold exactly", Weights: []int64{3, 1, 2}, WantFirst: map[string]int{"a": 150, "b": 50, "c": 100}, WantOrder: []string{"a", "c", "b"}},
		Case{Name: "weight 0 is never picked nor tried", Weights: []int64{1, 0, 1}, WantFirst: map[string]int{"a": 150, "c": 150}, WantOrder: []string{"a", "c"}},
		Case{Name: "health is ignored", Health: map[string]clusterscore.Health{"a": clusterscore.HealthNotServing}, WantFirst: map[string]int{"a": 100, "b": 100, "c": 100}, WantOrder: []string{"a", "b", "c"}},
		Case{Name: "a backend without clusters has no order", Clusters: []string{}, WantOrder: []string{}},
		Case{Name: "an ejected cluster is dropped though health is ignored, the others share by weight", Health: map[string]clusterscore.Health{"b": clusterscore.HealthEjected}, Weights: []int64{1, 1, 2}, WantFirst: map[string]int{"a": 100, "c": 200}, WantOrder: []string{"c", "a"}},
	)
}

func healthBasedCases() []Case {
	return withPolicy(routingpolicy.HealthBased, []string{"a", "b", "c", "d"}, 400,
		Case{
			Name:      "serving clusters share by weight, unknown ones are the fallback, not-serving ones are skipped",
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthServing, "b": clusterscore.HealthServing, "c": clusterscore.HealthUnknown, "d": clusterscore.HealthNotServing},
			Weights:   []int64{1, 3, 1, 1},
			WantFirst: map[string]int{"a": 100, "b": 300},
			WantOrder: []string{"b", "a", "c"},
		},
		Case{
			Name:      "with no serving cluster, the unknown ones share",
			Health:    map[string]clusterscore.Health{"c": clusterscore.HealthUnknown, "d": clusterscore.HealthUnknown, "a": clusterscore.HealthNotServing, "b": clusterscore.HealthNotServing},
			WantFirst: map[string]int{"c": 200, "d": 200},
			WantOrder: []string{"c", "d"},
		},
		Case{
			Name:      "with every cluster down there is nothing to try",
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthNotServing, "b": clusterscore.HealthNotServing, "c": clusterscore.HealthNotServing, "d": clusterscore.HealthNotServing},
			WantFirst: map[string]int{"": 400},
			WantOrder: []string{},
		},
		Case{
			Name:      "an ejected cluster is skipped as a not-serving one is, the serving ones sharing its part",
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthServing, "b": clusterscore.HealthEjected, "c": clusterscore.HealthServing, "d": clusterscore.HealthServing},
			WantFirst: map[string]int{"a": 134, "c": 133, "d": 133},
			WantOrder: []string{"a", "c", "d"},
		},
	)
}

func localFirstCases() []Case {
	return withPolicy(routingpolicy.LocalFirst, []string{"a", "b"}, 0,
		Case{
			Name:      "the local pool first while its EPP serves, then the remote clusters",
			Local:     true,
			Health:    map[string]clusterscore.Health{"local": clusterscore.HealthServing, "a": clusterscore.HealthServing, "b": clusterscore.HealthServing},
			WantOrder: []string{"local", "a", "b"},
		},
		Case{
			Name:      "a local EPP of unknown health is still first",
			Local:     true,
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthServing},
			WantOrder: []string{"local", "a", "b"},
		},
		Case{
			Name:      "the remote clusters when the local EPP fails",
			Local:     true,
			Health:    map[string]clusterscore.Health{"local": clusterscore.HealthNotServing, "a": clusterscore.HealthNotServing, "b": clusterscore.HealthServing},
			WantOrder: []string{"b"},
		},
		Case{
			Name:      "the remote clusters when the local pool is ejected",
			Local:     true,
			Health:    map[string]clusterscore.Health{"local": clusterscore.HealthEjected, "a": clusterscore.HealthServing, "b": clusterscore.HealthServing},
			WantOrder: []string{"a", "b"},
		},
		Case{
			Name:      "without a local pool it is HealthBased",
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthNotServing, "b": clusterscore.HealthServing},
			WantOrder: []string{"b"},
		},
	)
}

// fresh and stale are pool metrics scraped at the requests' time and a
// minute before.
func fresh(queue, kv float64, ready int) *clusterscore.PoolMetrics {
	return &clusterscore.PoolMetrics{AverageQueue: queue, AverageKVCache: kv, ReadyPods: ready, UpdatedAt: Epoch}
}

func stale(queue, kv float64) *clusterscore.PoolMetrics {
	return &clusterscore.PoolMetrics{AverageQueue: queue, AverageKVCache: kv, ReadyPods: 3, UpdatedAt: Epoch.Add(-time.Minute)}
}

// metricsBasedCases: measured clusters, by criticality.
func metricsBasedCases() []Case {
	return withPolicy(routingpolicy.MetricsBased, []string{"a", "b", "c"}, 60, []Case{
		{
			Name:      "a critical request goes to the cluster with the shortest queue, then by KV cache",
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(2, 0.9, 3), "c": fresh(2, 0.1, 3)},
			WantOrder: []string{"c", "b", "a"},
		},
		{
			Name:        "a sheddable request goes only to clusters with capacity",
			Criticality: scheduling.Sheddable,
			Metrics:     map[string]*clusterscore.PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(5, 0.5, 3), "c": fresh(1, 0.95, 3)},
			WantOrder:   []string{"b"},
		},
		{
			Name:        "a sheddable request is shed when every cluster is measured and saturated",
			Criticality: scheduling.Sheddable,
			Metrics:     map[string]*clusterscore.PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(6, 0.5, 3), "c": fresh(1, 0.95, 3)},
			WantErr:     clusterscore.ErrShed,
		},
		{
			Name:        "a critical request is never shed, even when every cluster is saturated",
			Criticality: scheduling.Critical,
			Metrics:     map[string]*clusterscore.PoolMetrics{"a": fresh(80, 0.9, 3), "b": fresh(60, 0.99, 3), "c": fresh(70, 0.95, 3)},
			WantOrder:   []string{"b", "c", "a"},
		},
		{
			Name:        "a sheddable request goes to an unmeasured cluster rather than be shed",
			Criticality: scheduling.Sheddable,
			Metrics:     map[string]*clusterscore.PoolMetrics{"a": fresh(30, 0.2, 3), "b": stale(0, 0)},
			WantOrder:   []string{"b", "c"},
		},
		{
			Name:        "a sheddable request goes to measured clusters with capacity, then to unmeasured ones, never to saturated ones",
			Criticality: scheduling.Sheddable,
			Metrics:     map[string]*clusterscore.PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(1, 0.1, 3)},
			WantOrder:   []string{"b", "c"},
		},
	}...)
}

// metricsBasedUnmeasuredCases: clusters without fresh metrics, and
// clusters that cannot serve.
func metricsBasedUnmeasuredCases() []Case {
	return withPolicy(routingpolicy.MetricsBased, []string{"a", "b", "c"}, 60, []Case{
		{
			Name:      "unmeasured clusters come after measured ones with capacity and before saturated ones",
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(40, 0.7, 3), "b": fresh(3, 0.5, 3)},
			WantOrder: []string{"b", "c", "a"},
		},
		{
			Name:      "an unmeasured cluster is not taken for idle: a measured one with capacity wins every time",
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(4, 0.7, 3), "b": stale(0, 0)},
			WantFirst: map[string]int{"a": 60},
		},
		{
			Name:      "when every measured cluster is saturated, the unmeasured ones take the traffic by weight",
			Weights:   []int64{1, 2, 1},
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(70, 0.9, 3)},
			WantFirst: map[string]int{"b": 40, "c": 20},
		},
		{
			Name:      "unmeasured clusters that are serving come before those of unknown health",
			Health:    map[string]clusterscore.Health{"b": clusterscore.HealthServing},
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(2, 0.1, 3)},
			WantOrder: []string{"a", "b", "c"},
		},
		{
			Name:      "an unmeasured serving cluster comes before one of unknown health whatever the names",
			Health:    map[string]clusterscore.Health{"c": clusterscore.HealthServing},
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(2, 0.1, 3)},
			WantOrder: []string{"a", "c", "b"},
		},
		{
			Name:      "a cluster whose pool has no ready pod is skipped",
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(0, 0, 0), "b": fresh(1, 0.5, 2), "c": fresh(2, 0.5, -1)},
			WantOrder: []string{"b", "c"},
		},
		{
			Name:      "a cluster whose EPP is not serving is skipped, measured or not",
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthNotServing, "c": clusterscore.HealthNotServing},
			Metrics:   map[string]*clusterscore.PoolMetrics{"a": fresh(0, 0, 3), "b": fresh(10, 0.5, 3)},
			WantOrder: []string{"b"},
		},
		{
			Name:      "without fresh metrics the order is HealthBased's",
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthNotServing, "b": clusterscore.HealthServing},
			Metrics:   map[string]*clusterscore.PoolMetrics{"b": stale(0, 0)},
			WantOrder: []string{"b", "c"},
		},
		{
			Name:      "no cluster left is an empty order, not an error",
			Health:    map[string]clusterscore.Health{"a": clusterscore.HealthNotServing, "b": clusterscore.HealthNotServing, "c": clusterscore.HealthNotServing},
			WantOrder: []string{},
		}}...)
}

// Check holds a case to its expectations. newOrder makes a new backend of
// the case and returns what orders its clusters for the case's request
// (their names, in order).
func Check(t *testing.T, c Case, newOrder func() func() ([]string, error)) {
	t.Helper()
	order, err := newOrder()()
	if c.WantErr != nil {
		assert.ErrorIs(t, err, c.WantErr)
		return
	}
	require.NoError(t, err)
	if c.WantOrder != nil {
		assert.Equal(t, c.WantOrder, order, "the first order")
	}
	if c.WantFirst == nil {
		return
	}
	next := newOrder()
	got := map[string]int{}
	for range c.Picks {
		order, err := next()
		require.NoError(t, err)
		first := ""
		if len(order) > 0 {
			first = order[0]
		}
		got[first]++
	}
	assert.Equal(t, c.WantFirst, got, "the first cluster of %d orders", c.Picks)
}
