package sidecar

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/clusterscore/clusterscoretest"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
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

func (f *fakeState) Read(clusters []*routetable.Cluster, at []int, cands []clusterscore.Candidate, pools bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range cands {
		c := clusters[placeOf(at, k)]
		cands[k].Health = f.health[c.Name]
		if pools {
			cands[k].Pool = f.metrics[c.Name]
		}
	}
}

// setHealth changes a cluster's health while requests may run.
func (f *fakeState) setHealth(cluster string, h Health) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.health[cluster] = h
}

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
// the local pool llm, built and published as the sidecar does, by a
// router of its own.
func testTable(policy string, local bool, names []string, weights ...int64) *routetable.Table {
	return testTableIn(routetable.NewRouter(), policy, local, names, weights...)
}

// testTableIn is testTable published by router, whose policies share its
// memory.
func testTableIn(router *routetable.Router, policy string, local bool, names []string, weights ...int64) *routetable.Table {
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
		routetable.PolicyAnnotation, policy, routetable.ClusterWeightsAnnotation, strings.Join(ws, ","))
	in := routetable.Inputs{Routes: []*gatewayv1.HTTPRoute{r}, Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", clusters...)}}
	if local {
		in.Pools = []*poolv1.InferencePool{sidecartest.Pool("llm", "")}
		in.Services = []*corev1.Service{sidecartest.EPPService("llm", "127.0.1.1")}
	}
	tbl, _ := publishTable(router, in)
	return tbl
}

// testBackend is the backend of testTable's route.
func testBackend(policy string, local bool, names []string, weights ...int64) *routetable.Backend {
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
			r := routetable.NewRouter()
			st := &fakeState{health: tc.Health, metrics: tc.Metrics}
			clusterscoretest.Check(t, tc, func() func() ([]string, error) {
				b := testTableIn(r, tc.Policy, tc.Local, tc.Clusters, tc.Weights...).Rules()[0].Backends[0]
				p := testPolicy(b)
				return func() ([]string, error) {
					order, err := p.Order(b, PickRequest{Criticality: tc.Criticality, Now: clusterscoretest.Epoch}, st)
					return names(order), err
				}
			})
		})
	}
}

// testPolicy is the policy of b, a backend of a published table, as the
// server takes it for a request.
func testPolicy(b *routetable.Backend) *ClusterPolicy {
	p := policyOf(b, clusterscore.SessionSpec{})
	return &p
}

func TestPolicyNeedsTheSessionOnlyWhereTheSidecarReadsOne(t *testing.T) {
	b := testBackend("prefix-cache=3,session=1", false, []string{"a"})
	withSessions := policyOf(b, clusterscore.SessionSpec{Header: "x-session-id"})
	assert.Equal(t, Needs{Criticality: true, PoolMetrics: true, Prompt: true, Session: true}, withSessions.Needs(), "the default filters read metrics and criticality")
	assert.Equal(t, Needs{Criticality: true, PoolMetrics: true, Prompt: true}, testPolicy(b).Needs())
	assert.Equal(t, "prefix-cache=3,session=1", testPolicy(b).Name())
}

func TestRetainForgetsTheObservationsOfClustersAndPoolsThatLeft(t *testing.T) {
	s := &Server{mem: clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())}
	obs := s.mem.Observed
	for _, c := range []string{"a", "b"} {
		obs.Started(ns+"/llm", c, time.Now())
	}
	obs.Started(ns+"/gone", "a", time.Now())
	s.retainObserved(testTable(routingpolicy.Weighted, false, []string{"a"}))
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
		policy    string
		local     bool
		wantSet   []string
		wantNeeds Needs
	}{
		{policy: routingpolicy.Weighted, local: true, wantSet: []string{"a", "c"}},
		{policy: routingpolicy.HealthBased, wantSet: []string{"a", "c"}},
		{policy: routingpolicy.LocalFirst, local: true, wantSet: []string{"a", "c", "local"}},
		{policy: routingpolicy.LocalFirst, wantSet: []string{"a", "c"}},
		{policy: routingpolicy.MetricsBased, local: true, wantSet: []string{"a", "c"}, wantNeeds: Needs{Criticality: true, PoolMetrics: true, Observed: true}},
		{policy: routingpolicy.PrefixAffinity, wantSet: []string{"a", "c"}, wantNeeds: Needs{Criticality: true, PoolMetrics: true, Prompt: true, Opens: true, Observed: true}},
		{policy: "in-flight=1,filters=health", wantSet: []string{"a", "b", "c"}, wantNeeds: Needs{Observed: true}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s local=%v", tt.policy, tt.local), func(t *testing.T) {
			b := testBackend(tt.policy, tt.local, []string{"a", "b", "c"}, 1, 0, 2)
			p := testPolicy(b)
			assert.Equal(t, tt.wantSet, names(p.FailOpen(b)))
			assert.Equal(t, tt.wantNeeds, p.Needs())
		})
	}
}
