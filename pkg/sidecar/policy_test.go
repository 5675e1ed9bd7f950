package sidecar

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// fakeState is health and metrics by cluster name.
type fakeState struct {
	health  map[string]Health
	metrics map[string]*PoolMetrics
	failed  []string
}

func (f *fakeState) Health(c *routetable.Cluster) Health            { return f.health[c.Name] }
func (f *fakeState) PoolMetrics(c *routetable.Cluster) *PoolMetrics { return f.metrics[c.Name] }
func (f *fakeState) Failed(c *routetable.Cluster)                   { f.failed = append(f.failed, c.Name) }

// testTable is a table of one route to import llm of clusters a, b, c,
// ... with the given weights (1 each when none are given), and optionally
// the local pool llm, built as the sidecar builds it.
func testTable(policy routetable.Policy, local bool, names []string, weights ...int64) *routetable.Table {
	var clusters []imported
	var ws []string
	for i, n := range names {
		clusters = append(clusters, imported{name: n, addr: fmt.Sprintf("127.0.2.%d", i+1)})
		w := int64(1)
		if i < len(weights) {
			w = weights[i]
		}
		ws = append(ws, fmt.Sprintf("%s=%d", n, w))
	}
	r := annotate(route("r", 0, nil, rule(nil, importRef("llm", nil))),
		routetable.PolicyAnnotation, string(policy), routetable.ClusterWeightsAnnotation, strings.Join(ws, ","))
	in := routetable.Inputs{Routes: []*gatewayv1.HTTPRoute{r}, Imports: []*v1alphaImport{importOf("llm", clusters...)}}
	if local {
		in.Pools = []*poolv1.InferencePool{pool("llm", "")}
		in.Services = []*corev1.Service{eppService("llm", "127.0.1.1")}
	}
	tbl, _ := buildTable(in)
	return tbl
}

// testBackend is the backend of testTable's route.
func testBackend(policy routetable.Policy, local bool, names []string, weights ...int64) *routetable.Backend {
	return testTable(policy, local, names, weights...).Rules()[0].Backends[0]
}

func names(cs []*routetable.Cluster) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// firstPicks orders n times and counts the first cluster of each order.
func firstPicks(t *testing.T, p *ClusterPolicy, b *routetable.Backend, st State, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		order, err := p.Order(b, PickRequest{Now: epoch}, st)
		require.NoError(t, err)
		if len(order) == 0 {
			got[""]++
			continue
		}
		got[order[0].Name]++
	}
	return got
}

func TestWeighted(t *testing.T) {
	tests := []struct {
		name      string
		weights   []int64
		health    map[string]Health
		wantFirst map[string]int
		wantOrder []string // the first order
	}{
		{
			name:      "equal weights split equally",
			wantFirst: map[string]int{"a": 100, "b": 100, "c": 100},
			wantOrder: []string{"a", "b", "c"},
		},
		{
			name:      "annotated weights hold exactly",
			weights:   []int64{3, 1, 2},
			wantFirst: map[string]int{"a": 150, "b": 50, "c": 100},
			wantOrder: []string{"a", "c", "b"},
		},
		{
			name:      "weight 0 is never picked nor tried",
			weights:   []int64{1, 0, 1},
			wantFirst: map[string]int{"a": 150, "c": 150},
			wantOrder: []string{"a", "c"},
		},
		{
			name:      "health is ignored",
			health:    map[string]Health{"a": HealthNotServing},
			wantFirst: map[string]int{"a": 100, "b": 100, "c": 100},
			wantOrder: []string{"a", "b", "c"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &fakeState{health: tt.health}
			order, err := testPolicy(t, routetable.PolicyWeighted).Order(testBackend(routetable.PolicyWeighted, false, []string{"a", "b", "c"}, tt.weights...), PickRequest{}, st)
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, names(order))
			assert.Equal(t, tt.wantFirst, firstPicks(t, testPolicy(t, routetable.PolicyWeighted), testBackend(routetable.PolicyWeighted, false, []string{"a", "b", "c"}, tt.weights...), st, 300))
		})
	}

	t.Run("a backend without clusters has no order", func(t *testing.T) {
		order, err := testPolicy(t, routetable.PolicyWeighted).Order(testBackend(routetable.PolicyWeighted, false, nil), PickRequest{}, &fakeState{})
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &fakeState{health: tt.health}
			clusters := []string{"a", "b", "c", "d"}
			order, err := testPolicy(t, routetable.PolicyHealthBased).Order(testBackend(routetable.PolicyHealthBased, false, clusters, tt.weights...), PickRequest{}, st)
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, names(order))
			assert.Equal(t, tt.wantFirst, firstPicks(t, testPolicy(t, routetable.PolicyHealthBased), testBackend(routetable.PolicyHealthBased, false, clusters, tt.weights...), st, 400))
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			order, err := testPolicy(t, routetable.PolicyLocalFirst).Order(testBackend(routetable.PolicyLocalFirst, tt.local, []string{"a", "b"}), PickRequest{}, &fakeState{health: tt.health})
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, names(order))
		})
	}
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
		clusters    []string // default a, b, c
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clusters := tt.clusters
			if clusters == nil {
				clusters = []string{"a", "b", "c"}
			}
			p := testPolicy(t, routetable.PolicyMetricsBased)
			b := testBackend(routetable.PolicyMetricsBased, false, clusters, tt.weights...)
			st := &fakeState{health: tt.health, metrics: tt.metrics}
			req := PickRequest{Criticality: tt.criticality, Now: epoch}
			if tt.wantFirst != nil {
				got := map[string]int{}
				for range 60 {
					order, err := p.Order(b, req, st)
					require.NoError(t, err)
					require.NotEmpty(t, order)
					got[order[0].Name]++
				}
				assert.Equal(t, tt.wantFirst, got)
				return
			}
			order, err := p.Order(b, req, st)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantOrder, names(order))
		})
	}
}

// testPolicy compiles a policy as the server does, with a memory of its
// own.
func testPolicy(t testing.TB, p routetable.Policy) *ClusterPolicy {
	t.Helper()
	cp, err := NewPolicySet(scheduling.DefaultConfig(), nil, clusterscore.SessionSpec{}).Get(p)
	require.NoError(t, err)
	return cp
}

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		in      string
		want    routetable.Policy
		wantErr bool
	}{
		{in: "LocalFirst", want: routetable.PolicyLocalFirst},
		{in: " PrefixAffinity ", want: routetable.PolicyPrefixAffinity},
		{in: "prefix-cache=3,in-flight=1,pick=two-choices", want: "prefix-cache=3,in-flight=1,pick=two-choices"},
		{in: "session=1, filters=health+weight", want: "session=1, filters=health+weight"},
		{in: "RoundRobin", wantErr: true},
		{in: "", wantErr: true},
		{in: "prefix-cache=0", wantErr: true},
		{in: "pick=two-choices", wantErr: true},
		{in: "prefix-cache=1,prefix-cache=2", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := routetable.ParsePolicy(tt.in)
			if tt.wantErr {
				assert.ErrorIs(t, err, clusterscore.ErrSyntax)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestPolicySet(t *testing.T) {
	ps := NewPolicySet(scheduling.DefaultConfig(), nil, clusterscore.SessionSpec{Header: "x-session-id"})
	for _, p := range routetable.Policies {
		cp, err := ps.Get(p)
		require.NoError(t, err, p)
		assert.Equal(t, string(p), cp.Name())
		again, _ := ps.Get(p)
		assert.Same(t, cp, again, "compiled once")
	}
	inline, err := ps.Get("prefix-cache=3,session=1")
	require.NoError(t, err)
	assert.Equal(t, Needs{Criticality: true, PoolMetrics: true, Prompt: true, Session: true}, inline.Needs(), "the default filters read metrics and criticality")

	bad, err := ps.Get("no-such-policy")
	require.Error(t, err)
	assert.Equal(t, string(routetable.PolicyHealthBased), bad.Name(), "a policy that does not compile is the default")

	// Retain drops the policies no table names, and the observations of
	// the clusters and pools it no longer has.
	obs := ps.Memory().Observed
	for _, c := range []string{"a", "b"} {
		obs.Started(ns+"/llm", c)
	}
	obs.Started(ns+"/gone", "a")
	ps.Retain(testTable(routetable.PolicyWeighted, false, []string{"a"}))
	ps.mu.RLock()
	assert.Len(t, ps.compiled, 1)
	ps.mu.RUnlock()
	assert.EqualValues(t, 1, obs.Observe(ns+"/llm", "a").InFlight, "kept")
	assert.Zero(t, obs.Observe(ns+"/llm", "b").InFlight, "a cluster that left the backend is forgotten")
	assert.Zero(t, obs.Observe(ns+"/gone", "a").InFlight, "a pool that left the table is forgotten")
}

// TestPolicyFailOpenAndNeeds holds each policy to the FailOpen set and the
// needs the server and the sidecar derive from its configuration. Weight 0
// is out of every policy now, MetricsBased's FailOpen included (it tried
// measured clusters of weight 0 before).
func TestPolicyFailOpenAndNeeds(t *testing.T) {
	tests := []struct {
		policy    routetable.Policy
		local     bool
		wantSet   []string
		wantNeeds Needs
	}{
		{policy: routetable.PolicyWeighted, local: true, wantSet: []string{"a", "c"}},
		{policy: routetable.PolicyHealthBased, wantSet: []string{"a", "c"}},
		{policy: routetable.PolicyLocalFirst, local: true, wantSet: []string{"a", "c", "local"}},
		{policy: routetable.PolicyLocalFirst, wantSet: []string{"a", "c"}},
		{policy: routetable.PolicyMetricsBased, local: true, wantSet: []string{"a", "c"}, wantNeeds: Needs{Criticality: true, PoolMetrics: true, Observed: true}},
		{policy: routetable.PolicyPrefixAffinity, wantSet: []string{"a", "c"}, wantNeeds: Needs{Criticality: true, PoolMetrics: true, Prompt: true, Observed: true}},
		{policy: "in-flight=1,filters=health", wantSet: []string{"a", "b", "c"}, wantNeeds: Needs{Observed: true}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s local=%v", tt.policy, tt.local), func(t *testing.T) {
			p := testPolicy(t, tt.policy)
			assert.Equal(t, tt.wantSet, names(p.FailOpen(testBackend(tt.policy, tt.local, []string{"a", "b", "c"}, 1, 0, 2))))
			assert.Equal(t, tt.wantNeeds, p.Needs())
		})
	}
}
