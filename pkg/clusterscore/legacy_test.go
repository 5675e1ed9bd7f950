package clusterscore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/scheduling"
)

// These tests restate pkg/sidecar/policy_test.go against the named
// configurations: the same clusters, health, metrics, weights and expected
// orders, so that the configurations are the policies they replace.

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// backend is the candidates a, b, c, ... with the given weights (1 each
// when none are given), health and metrics, optionally followed by a local
// pool outside the rotation, as the sidecar's adapter passes them.
type backend struct {
	cands []Candidate
	rot   *Rotation
}

func newBackend(names []string, weights []int64, health map[string]Health, metrics map[string]*PoolMetrics, local bool) *backend {
	b := &backend{}
	for i, n := range names {
		w := int64(1)
		if i < len(weights) {
			w = weights[i]
		}
		b.cands = append(b.cands, Candidate{Name: n, Weight: w, Health: health[n], Pool: metrics[n]})
	}
	if local {
		b.cands = append(b.cands, Candidate{Name: "local", Health: health["local"], Local: true})
	}
	b.rot = NewRotation(b.cands)
	return b
}

func mustPipeline(t testing.TB, name string) *Pipeline {
	t.Helper()
	cfg, err := Parse(name)
	require.NoError(t, err)
	p, err := New(cfg, scheduling.DefaultConfig(), NewMemory(DefaultMemoryOptions()))
	require.NoError(t, err)
	return p
}

func (b *backend) order(t testing.TB, p *Pipeline, req Request) ([]string, error) {
	t.Helper()
	idx, err := p.Pick(&req, b.cands, b.rot, nil, nil)
	out := []string{}
	for _, i := range idx {
		out = append(out, b.cands[i].Name)
	}
	return out, err
}

// firstPicks orders n times and counts the first cluster of each order.
func (b *backend) firstPicks(t testing.TB, p *Pipeline, req Request, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		order, err := b.order(t, p, req)
		require.NoError(t, err)
		if len(order) == 0 {
			got[""]++
			continue
		}
		got[order[0]]++
	}
	return got
}

func TestWeighted(t *testing.T) {
	tests := []struct {
		name      string
		weights   []int64
		health    map[string]Health
		wantFirst map[string]int
		wantOrder []string
	}{
		{name: "equal weights split equally", wantFirst: map[string]int{"a": 100, "b": 100, "c": 100}, wantOrder: []string{"a", "b", "c"}},
		{name: "annotated weights hold exactly", weights: []int64{3, 1, 2}, wantFirst: map[string]int{"a": 150, "b": 50, "c": 100}, wantOrder: []string{"a", "c", "b"}},
		{name: "weight 0 is never picked nor tried", weights: []int64{1, 0, 1}, wantFirst: map[string]int{"a": 150, "c": 150}, wantOrder: []string{"a", "c"}},
		{name: "health is ignored", health: map[string]Health{"a": HealthNotServing}, wantFirst: map[string]int{"a": 100, "b": 100, "c": 100}, wantOrder: []string{"a", "b", "c"}},
	}
	p := mustPipeline(t, Weighted)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			order, err := newBackend([]string{"a", "b", "c"}, tt.weights, tt.health, nil, false).order(t, p, Request{})
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, order)
			assert.Equal(t, tt.wantFirst, newBackend([]string{"a", "b", "c"}, tt.weights, tt.health, nil, false).firstPicks(t, p, Request{}, 300))
		})
	}
	t.Run("a backend without clusters has no order", func(t *testing.T) {
		order, err := newBackend(nil, nil, nil, nil, false).order(t, p, Request{})
		require.NoError(t, err)
		assert.Empty(t, order)
	})
}

func TestHealthBased(t *testing.T) {
	tests := []struct {
		name      string
		health    map[string]Health
		weights   []int64
		wantFirst map[string]int
		wantOrder []string
	}{
		{
			name:      "serving clusters share by weight, unknown ones are the fallback, not-serving ones are skipped",
			health:    map[string]Health{"a": HealthServing, "b": HealthServing, "c": HealthUnknown, "d": HealthNotServing},
			weights:   []int64{1, 3, 1, 1},
			wantFirst: map[string]int{"a": 100, "b": 300},
			wantOrder: []string{"b", "a", "c"},
		},
		{
			name:      "with no serving cluster, the unknown ones share",
			health:    map[string]Health{"c": HealthUnknown, "d": HealthUnknown, "a": HealthNotServing, "b": HealthNotServing},
			wantFirst: map[string]int{"c": 200, "d": 200},
			wantOrder: []string{"c", "d"},
		},
		{
			name:      "with every cluster down there is nothing to try",
			health:    map[string]Health{"a": HealthNotServing, "b": HealthNotServing, "c": HealthNotServing, "d": HealthNotServing},
			wantFirst: map[string]int{"": 400},
			wantOrder: []string{},
		},
	}
	p := mustPipeline(t, HealthBased)
	clusters := []string{"a", "b", "c", "d"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			order, err := newBackend(clusters, tt.weights, tt.health, nil, false).order(t, p, Request{})
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, order)
			assert.Equal(t, tt.wantFirst, newBackend(clusters, tt.weights, tt.health, nil, false).firstPicks(t, p, Request{}, 400))
		})
	}
}

func TestLocalFirst(t *testing.T) {
	tests := []struct {
		name      string
		local     bool
		health    map[string]Health
		wantOrder []string
	}{
		{
			name:      "the local pool first while its EPP serves, then the remote clusters",
			local:     true,
			health:    map[string]Health{"local": HealthServing, "a": HealthServing, "b": HealthServing},
			wantOrder: []string{"local", "a", "b"},
		},
		{
			name:      "a local EPP of unknown health is still first",
			local:     true,
			health:    map[string]Health{"a": HealthServing},
			wantOrder: []string{"local", "a", "b"},
		},
		{
			name:      "the remote clusters when the local EPP fails",
			local:     true,
			health:    map[string]Health{"local": HealthNotServing, "a": HealthNotServing, "b": HealthServing},
			wantOrder: []string{"b"},
		},
		{
			name:      "without a local pool it is HealthBased",
			health:    map[string]Health{"a": HealthNotServing, "b": HealthServing},
			wantOrder: []string{"b"},
		},
	}
	p := mustPipeline(t, LocalFirst)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			order, err := newBackend([]string{"a", "b"}, nil, tt.health, nil, tt.local).order(t, p, Request{})
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, order)
		})
	}

	t.Run("a shim pool's local EPP, one of the rotation, still leads and is not tried twice", func(t *testing.T) {
		b := newBackend([]string{"local", "a"}, nil, map[string]Health{"local": HealthServing, "a": HealthServing}, nil, false)
		b.cands[0].Local = true
		for range 4 {
			order, err := b.order(t, p, Request{})
			require.NoError(t, err)
			assert.Equal(t, []string{"local", "a"}, order)
		}
	})
}

func TestMetricsBased(t *testing.T) {
	fresh := func(queue, kv float64, ready int) *PoolMetrics {
		return &PoolMetrics{AverageQueue: queue, AverageKVCache: kv, ReadyPods: ready, UpdatedAt: epoch}
	}
	stale := func(queue, kv float64) *PoolMetrics {
		return &PoolMetrics{AverageQueue: queue, AverageKVCache: kv, ReadyPods: 3, UpdatedAt: epoch.Add(-time.Minute)}
	}
	tests := []struct {
		name        string
		criticality scheduling.Criticality
		weights     []int64
		health      map[string]Health
		metrics     map[string]*PoolMetrics
		// wantOrder is the first order; wantFirst, when set, counts the
		// first cluster of 60 orders instead.
		wantOrder []string
		wantFirst map[string]int
		wantErr   error
	}{
		{
			name:      "a critical request goes to the cluster with the shortest queue, then by KV cache",
			metrics:   map[string]*PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(2, 0.9, 3), "c": fresh(2, 0.1, 3)},
			wantOrder: []string{"c", "b", "a"},
		},
		{
			name:        "a sheddable request goes only to clusters with capacity",
			criticality: scheduling.Sheddable,
			metrics:     map[string]*PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(5, 0.5, 3), "c": fresh(1, 0.95, 3)},
			wantOrder:   []string{"b"},
		},
		{
			name:        "a sheddable request is shed when every cluster is measured and saturated",
			criticality: scheduling.Sheddable,
			metrics:     map[string]*PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(6, 0.5, 3), "c": fresh(1, 0.95, 3)},
			wantErr:     ErrShed,
		},
		{
			name:        "a critical request is never shed, even when every cluster is saturated",
			criticality: scheduling.Critical,
			metrics:     map[string]*PoolMetrics{"a": fresh(80, 0.9, 3), "b": fresh(60, 0.99, 3), "c": fresh(70, 0.95, 3)},
			wantOrder:   []string{"b", "c", "a"},
		},
		{
			name:        "a sheddable request goes to an unmeasured cluster rather than be shed",
			criticality: scheduling.Sheddable,
			metrics:     map[string]*PoolMetrics{"a": fresh(30, 0.2, 3), "b": stale(0, 0)},
			wantOrder:   []string{"b", "c"},
		},
		{
			name:        "a sheddable request goes to measured clusters with capacity, then to unmeasured ones, never to saturated ones",
			criticality: scheduling.Sheddable,
			metrics:     map[string]*PoolMetrics{"a": fresh(30, 0.2, 3), "b": fresh(1, 0.1, 3)},
			wantOrder:   []string{"b", "c"},
		},
		{
			name:      "unmeasured clusters come after measured ones with capacity and before saturated ones",
			metrics:   map[string]*PoolMetrics{"a": fresh(40, 0.7, 3), "b": fresh(3, 0.5, 3)},
			wantOrder: []string{"b", "c", "a"},
		},
		{
			name:      "an unmeasured cluster is not taken for idle: a measured one with capacity wins every time",
			metrics:   map[string]*PoolMetrics{"a": fresh(4, 0.7, 3), "b": stale(0, 0)},
			wantFirst: map[string]int{"a": 60},
		},
		{
			name:      "when every measured cluster is saturated, the unmeasured ones take the traffic by weight",
			weights:   []int64{1, 2, 1},
			metrics:   map[string]*PoolMetrics{"a": fresh(70, 0.9, 3)},
			wantFirst: map[string]int{"b": 40, "c": 20},
		},
		{
			name:      "unmeasured clusters that are serving come before those of unknown health",
			health:    map[string]Health{"b": HealthServing},
			metrics:   map[string]*PoolMetrics{"a": fresh(2, 0.1, 3)},
			wantOrder: []string{"a", "b", "c"},
		},
		{
			// Not in pkg/sidecar's table: there the serving cluster also
			// comes first by name.
			name:      "an unmeasured serving cluster comes before one of unknown health whatever the names",
			health:    map[string]Health{"c": HealthServing},
			metrics:   map[string]*PoolMetrics{"a": fresh(2, 0.1, 3)},
			wantOrder: []string{"a", "c", "b"},
		},
		{
			name:      "a cluster whose pool has no ready pod is skipped",
			metrics:   map[string]*PoolMetrics{"a": fresh(0, 0, 0), "b": fresh(1, 0.5, 2), "c": fresh(2, 0.5, -1)},
			wantOrder: []string{"b", "c"},
		},
		{
			name:      "a cluster whose EPP is not serving is skipped, measured or not",
			health:    map[string]Health{"a": HealthNotServing, "c": HealthNotServing},
			metrics:   map[string]*PoolMetrics{"a": fresh(0, 0, 3), "b": fresh(10, 0.5, 3)},
			wantOrder: []string{"b"},
		},
		{
			name:      "without fresh metrics the order is HealthBased's",
			health:    map[string]Health{"a": HealthNotServing, "b": HealthServing},
			metrics:   map[string]*PoolMetrics{"b": stale(0, 0)},
			wantOrder: []string{"b", "c"},
		},
		{
			name:      "no cluster left is an empty order, not an error",
			health:    map[string]Health{"a": HealthNotServing, "b": HealthNotServing, "c": HealthNotServing},
			wantOrder: []string{},
		},
	}
	p := mustPipeline(t, MetricsBased)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBackend([]string{"a", "b", "c"}, tt.weights, tt.health, tt.metrics, false)
			req := Request{Criticality: tt.criticality, Now: epoch}
			if tt.wantFirst != nil {
				assert.Equal(t, tt.wantFirst, b.firstPicks(t, p, req, 60))
				return
			}
			order, err := b.order(t, p, req)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, order)
		})
	}
}
