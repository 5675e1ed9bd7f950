package sidecar

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/clusterscore/clusterscoretest"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// fakeState is health and metrics by cluster name.
type fakeState struct {
	health  map[string]Health
	metrics map[string]*PoolMetrics
	// failed is written by concurrent requests: read it with failures
	// while any may still run.
	mu     sync.Mutex
	failed []string
}

func (f *fakeState) Health(c *routetable.Cluster) Health            { return f.health[c.Name] }
func (f *fakeState) PoolMetrics(c *routetable.Cluster) *PoolMetrics { return f.metrics[c.Name] }
func (f *fakeState) Failed(c *routetable.Cluster) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, c.Name)
}

func (f *fakeState) failures() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.failed)
}

// testTable is a table of one route to import llm of clusters a, b, c,
// ... with the given weights (1 each when none are given), and optionally
// the local pool llm, built as the sidecar builds it.
func testTable(policy routetable.Policy, local bool, names []string, weights ...int64) *routetable.Table {
	var clusters []sidecartest.Imported
	var ws []string
	for i, n := range names {
		clusters = append(clusters, sidecartest.Imported{Name: n, Addr: fmt.Sprintf("127.0.2.%d", i+1)})
		w := int64(1)
		if i < len(weights) {
			w = weights[i]
		}
		ws = append(ws, fmt.Sprintf("%s=%d", n, w))
	}
	r := sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))),
		routetable.PolicyAnnotation, string(policy), routetable.ClusterWeightsAnnotation, strings.Join(ws, ","))
	in := routetable.Inputs{Routes: []*gatewayv1.HTTPRoute{r}, Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", clusters...)}}
	if local {
		in.Pools = []*poolv1.InferencePool{sidecartest.Pool("llm", "")}
		in.Services = []*corev1.Service{sidecartest.EPPService("llm", "127.0.1.1")}
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

// TestNamedPolicies holds the sidecar's ClusterPolicy to
// clusterscoretest's cases, the figures clusterscore's pipelines are held
// to: each backend is built from a routing table (testTable), its health
// and metrics reach the policy through State.
func TestNamedPolicies(t *testing.T) {
	for _, tc := range clusterscoretest.Cases() {
		t.Run(tc.Policy+"/"+tc.Name, func(t *testing.T) {
			policy := routetable.Policy(tc.Policy)
			p := testPolicy(t, policy)
			st := &fakeState{health: tc.Health, metrics: tc.Metrics}
			clusterscoretest.Check(t, tc, func() func() ([]string, error) {
				b := testBackend(policy, tc.Local, tc.Clusters, tc.Weights...)
				return func() ([]string, error) {
					order, err := p.Order(b, PickRequest{Criticality: tc.Criticality, Now: clusterscoretest.Epoch}, st)
					return names(order), err
				}
			})
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
	for _, name := range clusterscore.Names {
		p := routetable.Policy(name)
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
