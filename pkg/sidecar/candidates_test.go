package sidecar

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// referencePick orders b's clusters as pick did before the table made
// the candidates when it was published: every candidate made anew for
// each request from the backend's clusters and the state, the pool
// metrics of each read whatever the policy reads.
func referencePick(b *routetable.Backend, req *clusterscore.Request, st State, ex *clusterscore.Explanation) ([]*routetable.Cluster, error) {
	var cands []clusterscore.Candidate
	candidate := func(c *routetable.Cluster, weight int64, local bool) clusterscore.Candidate {
		cand := []clusterscore.Candidate{{Name: c.Name, Weight: weight, Local: local, Stale: c.Stale}}
		st.Read([]*routetable.Cluster{c}, nil, cand, true)
		return cand[0]
	}
	for _, c := range b.Clusters {
		cands = append(cands, candidate(c, c.Weight, b.Shim && c == b.Local))
	}
	clusters := b.Clusters
	if b.Local != nil && !b.Shim {
		clusters = append(slices.Clip(clusters), b.Local)
		cands = append(cands, candidate(b.Local, 0, true))
	}
	idx, err := b.Scoring().Pick(req, cands, b.Rotation(), nil, ex)
	order := make([]*routetable.Cluster, len(idx))
	for k, i := range idx {
		order[k] = clusters[i]
	}
	return order, err
}

// randomBackendTable is a table of one route to import llm exported by n
// clusters of random weights, some stale, with the local pool llm when
// local, published by a router of its own (its own memory).
func randomBackendTable(t *testing.T, rng *rand.Rand, policy string, n int, local bool) *routetable.Backend {
	clusters := make([]sidecartest.Imported, n)
	ws := make([]string, n)
	for i := range clusters {
		name := fmt.Sprintf("c%02d", rng.IntN(100))
		for slices.ContainsFunc(clusters[:i], func(c sidecartest.Imported) bool { return c.Name == name }) {
			name += "x"
		}
		clusters[i] = sidecartest.Imported{Name: name, Addr: fmt.Sprintf("127.0.%d.%d", 2+i/200, 1+i%200)}
		ws[i] = fmt.Sprintf("%s=%d", name, rng.IntN(4))
	}
	imp := sidecartest.Import("llm", clusters...)
	for i := range imp.Status.Clusters {
		if rng.IntN(5) == 0 {
			imp.Status.Clusters[i].Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonClusterUnreachable}}
		}
	}
	route := sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))),
		routetable.PolicyAnnotation, policy, routetable.ClusterWeightsAnnotation, strings.Join(ws, ","))
	in := routetable.Inputs{Routes: []*gatewayv1.HTTPRoute{route}, Imports: []*v1alpha1.InferencePoolImport{imp}}
	if local {
		in.Pools = []*poolv1.InferencePool{sidecartest.Pool("llm", "")}
		in.Services = []*corev1.Service{sidecartest.EPPService("llm", "127.0.1.1")}
	}
	r := routetable.NewRouter()
	require.NoError(t, r.SetScoring(routetable.Scoring{Thresholds: scheduling.DefaultConfig(), Memory: clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())}))
	tbl, _ := publishTable(r, in) // the stale clusters are reported
	b := tbl.Rules()[0].Backends[0]
	require.Empty(t, b.Invalid)
	return b
}

// randomState is a random health and load of every cluster of b: any
// health, and pool metrics that are absent, fresh, stale or not
// comparable.
func randomState(rng *rand.Rand, b *routetable.Backend, now time.Time) *fakeState {
	st := &fakeState{health: map[string]Health{}, metrics: map[string]*PoolMetrics{}}
	clusters, _ := b.Candidates()
	for _, c := range clusters {
		st.health[c.Name] = []Health{HealthUnknown, HealthServing, HealthServing, HealthNotServing, clusterscore.HealthEjected}[rng.IntN(5)]
		m := &PoolMetrics{AverageQueue: float64(rng.IntN(12)), AverageKVCache: rng.Float64(), ReadyPods: rng.IntN(4), UpdatedAt: now}
		switch rng.IntN(5) {
		case 0:
			continue
		case 1:
			m.UpdatedAt = now.Add(-time.Hour)
		case 2:
			m.AverageKVCache = math.NaN()
		}
		st.metrics[c.Name] = m
	}
	return st
}

// TestPrecomputedCandidatesDecideAsPerRequestOnes holds the candidates
// the table makes when it is published (Backend.Candidates, filled in by
// pick) to the ones pick made for every request before: over random
// tables (clusters, weights, stale clusters, a local pool), random states
// and every named policy, the two give the same decision, with the same
// explanation (verdicts, tiers, scores, home) and FailOpen's fallback,
// each from a table and a memory of its own that the same requests went
// through. The precomputed candidates are ranked, so that beyond a
// handful, up to a fleet's 1,000, they are sorted by rank
// (clusterscore.RankCandidates) where the per-request ones are compared
// by name. Where the max-score picker breaks a tie at the top at random
// and no home leads, the orders without the two leads are compared (the
// rest is the score order in both); the chain picker's, which draws all
// along, as sets.
func TestPrecomputedCandidatesDecideAsPerRequestOnes(t *testing.T) {
	policies := routingpolicy.Names
	now := sidecartest.Epoch
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 150 {
		policy := policies[trial%len(policies)]
		n := 1 + rng.IntN(8)
		switch {
		case trial%25 == 0:
			n = 900 + rng.IntN(200) // a fleet's
		case trial%3 == 0:
			n = 17 + rng.IntN(40) // beyond a pick's stack scratch, sorted by rank
		}
		local := rng.IntN(2) == 0
		seed := rng.Uint64()
		ours := randomBackendTable(t, rand.New(rand.NewPCG(seed, 1)), policy, n, local)
		ref := randomBackendTable(t, rand.New(rand.NewPCG(seed, 1)), policy, n, local)
		picker := ours.Scoring().Config().Picker
		// Only round-robin orders without a draw: the others break ties
		// (max-score, two choices) or pick in the filter chain's way
		// (chain) at random.
		random := picker != routingpolicy.PickRoundRobin
		for req := range 12 {
			st := randomState(rng, ours, now)
			body := groupPromptBody(rng.IntN(4), 64+rng.IntN(64))
			crit := []scheduling.Criticality{scheduling.Critical, scheduling.Standard, scheduling.Sheddable}[rng.IntN(3)]

			var exOurs, exRef clusterscore.Explanation
			p := policyOf(ours, clusterscore.SessionSpec{})
			// Every candidate, as the reference orders them: a sample
			// of many (pick) is another order, held to its own
			// (clusterscore's TestSampledPicksKeepTheKeysHome).
			got := p.request(ours, PickRequest{Criticality: crit, Now: now, Body: body})
			clusters, static := ours.Candidates()
			errOurs := p.pickAmong(clusters, static, nil, st, &got, ours.Rotation(), &exOurs)

			rreq := clusterscore.Request{Criticality: crit, Now: now, Scope: ref.Scope()}
			if ref.Scoring().Needs().Prompt {
				rreq.ModelBlocks, rreq.Blocks, _ = promptBlocks(PickRequest{Body: body}, rreq.Scope)
			}
			want, errRef := referencePick(ref, &rreq, st, &exRef)

			what := fmt.Sprintf("trial %d (%s, %d clusters, local %v) request %d", trial, policy, n, local, req)
			require.Equal(t, errRef, errOurs, what)
			require.Equal(t, exRef.String(), exOurs.String(), what)
			require.Equal(t, rreq.Home, got.req.Home, what)
			require.Equal(t, rreq.LastResort, got.req.LastResort, what)
			switch {
			case random && rreq.Home.Home == "" && picker == routingpolicy.PickChain:
				require.ElementsMatch(t, names(want), names(got.order), what)
			case random && rreq.Home.Home == "" && len(want) > 0 && len(got.order) > 0:
				// The tables are apart: clusters are told by name.
				leads := []string{want[0].Name, got.order[0].Name}
				led := func(name string) bool { return slices.Contains(leads, name) }
				require.Equal(t, slices.DeleteFunc(names(want), led), slices.DeleteFunc(names(got.order), led), what)
				require.ElementsMatch(t, names(want), names(got.order), what)
			default:
				require.Equal(t, names(want), names(got.order), what)
			}
			// FailOpen's fallback: the clusters left out, looked up in a
			// set beyond a handful, as searched in the order before.
			wantFallback := slices.DeleteFunc(p.FailOpen(ref), func(c *routetable.Cluster) bool { return slices.Contains(want, c) })
			require.Equal(t, names(wantFallback), names(withoutOrdered(p.FailOpen(ours), got.order)), what)
			if len(want) > 0 {
				// The same request served by the same cluster in both
				// memories, so that they stay alike.
				ours.Scoring().Memory().Served(&got.req, want[0].Name)
				ref.Scoring().Memory().Served(&rreq, want[0].Name)
			}
		}
	}
}
