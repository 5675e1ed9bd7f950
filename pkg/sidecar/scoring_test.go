package sidecar

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// observingPolicy reads every hook of the wiring (prompt blocks, session,
// observations) and leads by round-robin, so that a fresh server tries
// cluster-a, then cluster-c.
const observingPolicy = "prefix-cache=1,session=1,in-flight=1,latency=1,errors=1,pick=round-robin"

// promptBody is a completions request of several full prompt blocks.
var promptBody = []byte(`{"model":"chat","prompt":"` + strings.Repeat("You are a helpful assistant. ", 12) + `"}`)

func scoringServer(t *testing.T, a, c *fakeEPP, policy string, cfg ServerConfig) *harness {
	t.Helper()
	return startServerWith(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), routetable.PolicyAnnotation, policy)},
		Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
	}, &fakeState{health: map[string]Health{"cluster-a": HealthServing, "cluster-c": HealthServing}}, cfg)
}

// TestServerTeachesTheClusterThatServed holds the server to calling
// Memory.Served with the cluster whose EPP answered (not the first of the
// order), and Observed.Started/FirstByte/Finished around every attempt,
// in both response phase modes.
func TestServerTeachesTheClusterThatServed(t *testing.T) {
	tests := []struct {
		name   string
		breakA int32
		// status is the upstream's response status.
		status     int
		wantServed string
		wantErrors map[string]bool
	}{
		{name: "the first cluster serves", breakA: eppRoute, wantServed: "cluster-a", wantErrors: map[string]bool{"cluster-a": false, "cluster-c": false}},
		{name: "a failover teaches the cluster that answered", breakA: eppFail, wantServed: "cluster-c", wantErrors: map[string]bool{"cluster-a": true, "cluster-c": false}},
		{name: "a refusal is an error of its cluster", breakA: eppUnavailable, wantServed: "cluster-c", wantErrors: map[string]bool{"cluster-a": true, "cluster-c": false}},
		{name: "a 5xx response is an error of the cluster that served", breakA: eppRoute, status: http.StatusBadGateway, wantServed: "cluster-a", wantErrors: map[string]bool{"cluster-a": true, "cluster-c": false}},
	}
	for _, phase := range []ResponsePhase{ResponsePhaseRelay, ResponsePhaseSkip} {
		for _, tt := range tests {
			t.Run(string(phase)+" "+tt.name, func(t *testing.T) {
				a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
				c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
				a.mode.Store(tt.breakA)
				h := scoringServer(t, a, c, observingPolicy, ServerConfig{ResponsePhase: phase, Session: clusterscore.SessionSpec{Header: "x-session-id"}})

				up := upstreamResponse()
				up.Status = tt.status
				res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: promptBody, Headers: http.Header{"X-Session-Id": {"s1"}}, Response: up})
				require.Nil(t, res.Immediate)

				mem, scope := h.server.mem, ns+"/llm"
				body, err := requestmodel.ReadBody(promptBody)
				require.NoError(t, err)
				_, blocks, err := promptBlocks(PickRequest{Prompt: body.Prompt(), Model: body.Model()}, scope)
				require.NoError(t, err)
				require.NotEmpty(t, blocks)
				matched := make([]int, 2)
				mem.Prefixes.Match(blocks, []uint32{promptprefix.ClusterID("cluster-a"), promptprefix.ClusterID("cluster-c")}, matched)
				want := []int{len(blocks), 0}
				if tt.wantServed == "cluster-c" {
					want = []int{0, len(blocks)}
				}
				assert.Equal(t, want, matched, "the prefix is recorded for the cluster that served")
				assert.Equal(t, tt.wantServed, mem.Sessions.Cluster(scope, "s1", time.Now()), "the session is pinned where it was served")

				// Finished runs as the server's stream ends, just after the
				// gateway's.
				require.Eventually(t, func() bool {
					return mem.Observed.Observe(scope, "cluster-a").InFlight == 0 && mem.Observed.Observe(scope, "cluster-c").InFlight == 0
				}, 5*time.Second, 5*time.Millisecond, "every Started is Finished")
				for cluster, wantErr := range tt.wantErrors {
					o := mem.Observed.Observe(scope, cluster)
					assert.Equal(t, wantErr, o.ErrorRatio > 0, "%s errors: %+v", cluster, o)
				}
				assert.Positive(t, mem.Observed.Observe(scope, tt.wantServed).TTFB, "the first byte of the serving cluster is measured")
			})
		}
	}
}

// TestServerExplainsDecisionsOnlyWhenAsked: the scores header comes with
// ExplainDecisions only.
func TestServerExplainsDecisionsOnlyWhenAsked(t *testing.T) {
	for _, explain := range []bool{false, true} {
		for _, phase := range []ResponsePhase{ResponsePhaseRelay, ResponsePhaseSkip} {
			t.Run(string(phase)+map[bool]string{false: " off", true: " on"}[explain], func(t *testing.T) {
				a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
				c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
				h := scoringServer(t, a, c, routingpolicy.PrefixAffinity, ServerConfig{ResponsePhase: phase, ExplainDecisions: explain})
				res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: promptBody, Response: upstreamResponse()})
				require.Nil(t, res.Immediate)
				require.NotNil(t, res.Response)
				got := res.Response.Headers.Get(ScoresHeader)
				if !explain {
					assert.Empty(t, got)
					return
				}
				assert.True(t, strings.HasPrefix(got, "PrefixAffinity "), got)
				assert.Contains(t, got, "cluster-a:kept,tier=0,load=0,prefix-cache=")
				assert.Contains(t, got, "cluster-c:kept")
			})
		}
	}
}

// TestServerRoutesUnparseablePromptsWithoutAffinity: a body whose prompt
// cannot be read is routed all the same, and counted; a body without a
// prompt is not counted.
func TestServerRoutesUnparseablePromptsWithoutAffinity(t *testing.T) {
	tests := []struct {
		name string
		body string
		want float64
	}{
		{name: "a prompt", body: string(promptBody)},
		{name: "no prompt", body: `{"model":"chat","input":"embed me"}`},
		{name: "not JSON", body: `{"model":"chat","prompt":`, want: 1},
		{name: "a prompt of the wrong type", body: `{"model":"chat","messages":{"role":"user"}}`, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
			c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
			h := scoringServer(t, a, c, routingpolicy.PrefixAffinity, ServerConfig{})
			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: []byte(tt.body)})
			require.Nil(t, res.Immediate)
			assert.NotEmpty(t, res.Destination)
			assert.Equal(t, tt.want, testutil.ToFloat64(h.metrics.unparseable))
		})
	}
}

// TestBackendRotationCarriesOver: a backend's rotation survives a rebuild
// that keeps its clusters and weights, so that the split stays exact
// however often the table is rebuilt (the route changes: the sidecar's
// Incremental recompiles it), and starts afresh when they change.
func TestBackendRotationCarriesOver(t *testing.T) {
	x := routetable.NewIncremental(routetable.Inputs{DefaultPolicy: routingpolicy.Named()[routingpolicy.Weighted]})
	x.SetImport(sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.0.1"}, sidecartest.Imported{Name: "cluster-c", Addr: "127.0.0.2"}))
	build := func(weights string) *routetable.Table {
		r := sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))
		if weights != "" {
			r = sidecartest.Annotate(r, routetable.ClusterWeightsAnnotation, weights)
		}
		x.SetRoute(r)
		tbl, changed := x.Table()
		require.True(t, changed)
		return tbl
	}
	backend := func(r *routetable.Router) *routetable.Backend { return r.Table().Rules()[0].Backends[0] }

	r := routetable.NewRouter()
	counts := map[string]int{}
	for range 100 {
		r.Publish(build("cluster-a=1,cluster-c=3"))
		order, err := testPolicy(backend(r)).Order(backend(r), PickRequest{Now: sidecartest.Epoch}, &fakeState{})
		require.NoError(t, err)
		counts[order[0].Name]++
	}
	assert.Equal(t, map[string]int{"cluster-a": 25, "cluster-c": 75}, counts, "a rebuild between every request keeps the split exact")

	first := backend(r).Rotation()
	r.Publish(build("cluster-a=1,cluster-c=3"))
	assert.Same(t, first, backend(r).Rotation())
	r.Publish(build("cluster-a=1,cluster-c=1"))
	assert.NotSame(t, first, backend(r).Rotation(), "changed weights start afresh")
}

// TestServerCountsPrefixHomes: a request with a prompt under PrefixAffinity
// has a home, counted by the lead decision; one without a full prompt block
// is counted as having no key; without the clusters' ready pods
// the homes assume equal capacities, which the gauge says.
func TestServerCountsPrefixHomes(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	h := scoringServer(t, a, c, routingpolicy.PrefixAffinity, ServerConfig{})
	const n = 5
	for range n {
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: promptBody, Response: upstreamResponse()})
		require.Nil(t, res.Immediate)
	}
	res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: []byte(`{"model":"chat","prompt":"hi"}`), Response: upstreamResponse()})
	require.Nil(t, res.Immediate)
	backend := routetable.InferencePoolImportKind + " " + ns + "/llm"
	withHome := 0.0
	for _, o := range clusterscore.HomeOutcomes() {
		if o != clusterscore.HomeNoKey {
			withHome += testutil.ToFloat64(h.metrics.homes.WithLabelValues(backend, o.String()))
		}
	}
	assert.Equal(t, float64(n), withHome, "every request with a full prompt block has a home")
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.homes.WithLabelValues(backend, "no_key")), "a prompt shorter than a block has none, and is counted as such")
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.homes.WithLabelValues(backend, "dealt")), "the first request of a prompt is dealt")
	assert.Equal(t, float64(n-1), testutil.ToFloat64(h.metrics.homes.WithLabelValues(backend, "home")), "the next ones go home")
	assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.homesAlike.WithLabelValues(backend)), "no cluster reports its ready pods")
}
