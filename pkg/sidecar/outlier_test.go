package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/outlier"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// requestEvery is the pace of the simulated load: 50 requests a second,
// one at a time, on the detection's fake clock.
const requestEvery = 20 * time.Millisecond

// fleet is three clusters of import llm behind a sidecar with the default
// outlier detection on a fake clock, and model servers behind their
// destinations: cluster-a's exporter rewrites the model "chat" to its own
// name for it, "chat-a"; cluster-b and cluster-c serve "chat" as named.
type fleet struct {
	h     *harness
	state *fakeState
	clock *testingclock.FakeClock
	// clusterOf is the cluster of each destination, served the model
	// each serves.
	clusterOf, served map[string]string
	// wrongModel counts the requests whose forwarded body named another
	// model than the one its destination serves.
	wrongModel int
	// held are the exchanges left waiting for their first byte.
	held []*envoyclient.Exchange
}

func startFleet(t *testing.T, policy string) *fleet {
	t.Helper()
	epps := map[string]*fakeEPP{}
	f := &fleet{clock: testingclock.NewFakeClock(sidecartest.Epoch), clusterOf: map[string]string{}, served: map[string]string{}}
	var clusters []sidecartest.Imported
	for i, name := range []string{"cluster-a", "cluster-b", "cluster-c"} {
		dest := fmt.Sprintf("10.%d.0.1:8000", i+1)
		e := startFakeEPP(t, "epp-"+name, dest)
		f.clusterOf[dest], f.served[dest] = name, "chat"
		if name == "cluster-a" {
			e.rewriteModel.Store(ptr.To("chat-a"))
			f.served[dest] = "chat-a"
		}
		epps[name] = e
		host, port := hostPort(t, e.addr)
		clusters = append(clusters, sidecartest.Imported{Name: name, Addr: host, Port: port})
	}
	route := sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))
	if policy != "" {
		route = sidecartest.Annotate(route, routetable.PolicyAnnotation, policy)
	}
	f.state = &fakeState{health: map[string]Health{"cluster-a": HealthServing, "cluster-b": HealthServing, "cluster-c": HealthServing}}
	f.h = startServerWith(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{route},
		Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", clusters...)},
	}, f.state, ServerConfig{
		ExplainDecisions: true,
		Outlier:          &OutlierConfig{Detection: outlier.DefaultConfig(), FirstByte: outlier.DefaultFirstByteConfig(), Clock: f.clock},
	})
	t.Cleanup(func() {
		for _, x := range f.held {
			x.Reset()
		}
	})
	return f
}

// headerSink keeps the response's status and headers as the gateway
// passes them on.
type headerSink struct {
	status  int
	headers http.Header
}

func (s *headerSink) WriteHeaders(status int, h http.Header) error {
	s.status, s.headers = status, h
	return nil
}
func (s *headerSink) WriteBody([]byte) error          { return nil }
func (s *headerSink) WriteTrailers(http.Header) error { return nil }

// request sends one request, which the gateway forwards to the model
// server of its destination; respond says what that cluster's servers do:
// the status they answer at once, or 0 to hang before the first byte. It
// returns the cluster that took the request and the decision's
// explanation, and steps the clock by requestEvery.
func (f *fleet) request(t *testing.T, respond func(cluster string) int) (cluster, explanation string) {
	t.Helper()
	// A held exchange outlives this call: the client's message timeout
	// bounds the request phase.
	x, err := f.h.client.Start(context.Background(), envoyclient.Request{Path: "/v1/completions", Body: chatBody})
	require.NoError(t, err)
	require.Nil(t, x.Result.Immediate)
	cluster = f.clusterOf[x.Result.Destination]
	require.NotEmpty(t, cluster, "destination %q", x.Result.Destination)
	body, err := requestmodel.ParseBody(x.Result.Body)
	require.NoError(t, err)
	if body.Model() != f.served[x.Result.Destination] {
		f.wrongModel++
	}
	status := respond(cluster)
	if status == 0 {
		f.held = append(f.held, x)
	} else {
		sink := &headerSink{}
		_, err := x.Respond(envoyclient.Response{Status: status, Body: []byte(`{"model":"` + body.Model() + `"}`)}, sink)
		require.NoError(t, err)
		x.Close()
		explanation = sink.headers.Get(ScoresHeader)
	}
	f.clock.Step(requestEvery)
	return cluster, explanation
}

// run sends requests for d of simulated time and counts them by cluster.
func (f *fleet) run(t *testing.T, d time.Duration, respond func(cluster string) int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for end := f.clock.Now().Add(d); f.clock.Now().Before(end); {
		c, _ := f.request(t, respond)
		counts[c]++
	}
	return counts
}

func share(counts map[string]int, cluster string) float64 {
	total := 0
	for _, n := range counts {
		total += n
	}
	return float64(counts[cluster]) / float64(total)
}

func allServe(string) int { return http.StatusOK }

// TestErrorSinkIsEjectedAndComesBack: a cluster whose servers answer 5xx
// at once, under the default outlier detection and the load of 50 requests
// a second, takes a third of the requests before, at most 1% from 5 s
// after it started failing, and a third again within 30 s of its recovery;
// it is reported in the metrics and the decisions' explanation; and no
// request is ever answered by a model other than the one the client named,
// as the cluster that served it names it (its own rewrite, never
// another's). Under the default policy (HealthBased), and under Weighted,
// which ignores health.
func TestErrorSinkIsEjectedAndComesBack(t *testing.T) {
	for _, policy := range []string{"", routingpolicy.Weighted} {
		t.Run("policy "+policy, func(t *testing.T) {
			f := startFleet(t, policy)
			before := f.run(t, 10*time.Second, allServe)
			assert.InDelta(t, 1.0/3, share(before, "cluster-b"), 0.1, "before it fails: %v", before)

			failing := func(c string) int {
				if c == "cluster-b" {
					return http.StatusInternalServerError
				}
				return http.StatusOK
			}
			first := f.run(t, 5*time.Second, failing)
			ejected := testutil.ToFloat64(f.h.metrics.outlier.ejected.WithLabelValues(ns+"/llm", "cluster-b"))
			assert.Equal(t, 1.0, ejected, "ejected 5 s after it started failing")
			_, explained := f.request(t, failing)
			assert.Contains(t, explained, "cluster-b:ejected", "the decision's explanation names the ejected cluster")
			after := f.run(t, 30*time.Second, failing)
			t.Logf("first 5 s of failing: %v; the next 30 s: %v (share %.2f%%)", first, after, 100*share(after, "cluster-b"))
			assert.LessOrEqual(t, share(after, "cluster-b"), 0.01, "from 5 s after it started failing: %v", after)
			assert.Positive(t, testutil.ToFloat64(f.h.metrics.outlier.ejections.WithLabelValues(string(outlier.ReasonConsecutive5xx))))

			// It recovers: within 30 s it takes requests again, and its
			// share.
			recovered := f.clock.Now()
			for c := ""; c != "cluster-b"; {
				c, _ = f.request(t, allServe)
				require.Less(t, f.clock.Since(recovered), time.Minute, "cluster-b never came back")
			}
			backAfter := f.clock.Since(recovered)
			assert.LessOrEqual(t, backAfter, 30*time.Second, "back within 30 s of its recovery")
			back := f.run(t, 10*time.Second, allServe)
			t.Logf("back %v after its recovery; the next 10 s: %v", backAfter, back)
			assert.InDelta(t, 1.0/3, share(back, "cluster-b"), 0.1, "once back: %v", back)
			assert.Zero(t, testutil.ToFloat64(f.h.metrics.outlier.ejected.WithLabelValues(ns+"/llm", "cluster-b")))

			assert.Zero(t, f.wrongModel, "requests answered by another model than the client's, as their cluster names it")
		})
	}
}

// TestHungFirstByteIsRerouted: a cluster whose servers stop answering
// (no first byte) takes no new request 2 s after it hung but the one probe
// its ejection allows, under the default first-byte bound (three times its
// 99th percentile, at least 1 s).
func TestHungFirstByteIsRerouted(t *testing.T) {
	f := startFleet(t, "")
	before := f.run(t, 10*time.Second, allServe)
	assert.InDelta(t, 1.0/3, share(before, "cluster-c"), 0.1, "before it hangs: %v", before)

	hung := func(c string) int {
		if c == "cluster-c" {
			return 0
		}
		return http.StatusOK
	}
	hangs := f.clock.Now()
	var last time.Duration
	for f.clock.Since(hangs) < 2*time.Second {
		if c, _ := f.request(t, hung); c == "cluster-c" {
			last = f.clock.Since(hangs) - requestEvery
		}
	}
	after := f.run(t, 8*time.Second, hung)
	t.Logf("the last new request to the hung cluster went %v after it hung; the next 8 s: %v", last, after)
	assert.LessOrEqual(t, after["cluster-c"], 1, "from 2 s after it hung, only a probe: %v", after)
	assert.Positive(t, testutil.ToFloat64(f.h.metrics.outlier.firstBytes.WithLabelValues("cluster-c")))
	assert.Positive(t, testutil.ToFloat64(f.h.metrics.outlier.ejections.WithLabelValues(string(outlier.ReasonConsecutiveGatewayFailure))))
	assert.Zero(t, f.wrongModel)
}

// TestFailoverNeverCarriesAnotherClustersRewrite: a cluster whose EPP
// rewrites the model and whose answer is then refused (a destination its
// exporter did not publish) fails over to the next cluster with the
// client's body, not with the rewrite: every request is forwarded naming
// the model the client named, by a cluster that serves it.
func TestFailoverNeverCarriesAnotherClustersRewrite(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:9999")
	a.rewriteModel.Store(ptr.To("chat-a"))
	c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
	h := startServerWith(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), routetable.PolicyAnnotation, routingpolicy.Weighted)},
		Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
	}, &fakeState{}, ServerConfig{Outlier: &OutlierConfig{Detection: outlier.DefaultConfig(), FirstByte: outlier.DefaultFirstByteConfig(), Clock: testingclock.NewFakeClock(sidecartest.Epoch)}})
	for range 6 {
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
		require.Nil(t, res.Immediate)
		assert.Equal(t, "10.3.0.1:8000", res.Destination)
		body, err := requestmodel.ParseBody(res.Body)
		require.NoError(t, err)
		assert.Equal(t, "chat", body.Model(), "the body the gateway forwards names the client's model")
		assert.Equal(t, chatBody, c.lastBody, "the next cluster's EPP got the client's body")
	}
	assert.Equal(t, int64(3), a.calls.Load(), "cluster-a's EPP was tried first every other request")
	assert.Zero(t, testutil.ToFloat64(h.metrics.outlier.ejected.WithLabelValues(ns+"/llm", "cluster-a")), "an EPP's refused answers are its health's business, not outlier detection's")
}

// TestEjectedClustersTakeRequestsWhenNoOtherCan: an ejected cluster is
// left out while another cluster can take a request, and takes them when
// none can (the others' EPPs not serving), said in the explanation and
// counted; it is left out again once the others serve.
func TestEjectedClustersTakeRequestsWhenNoOtherCan(t *testing.T) {
	f := startFleet(t, "")
	failing := func(c string) int {
		if c == "cluster-b" {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}
	f.run(t, 2*time.Second, failing)
	require.Equal(t, 1.0, testutil.ToFloat64(f.h.metrics.outlier.ejected.WithLabelValues(ns+"/llm", "cluster-b")), "ejected")

	f.state.setHealth("cluster-a", HealthNotServing)
	f.state.setHealth("cluster-c", HealthNotServing)
	cluster, explanation := f.request(t, failing)
	assert.Equal(t, "cluster-b", cluster, "the ejected cluster, rather than none")
	assert.Contains(t, explanation, "last-resort=ejected")
	assert.Equal(t, 1.0, testutil.ToFloat64(f.h.metrics.outlier.lastResort), "counted")

	f.state.setHealth("cluster-a", HealthServing)
	for range 10 {
		cluster, explanation = f.request(t, failing)
		assert.Equal(t, "cluster-a", cluster, "the only cluster serving and not ejected")
		assert.NotContains(t, explanation, "last-resort")
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(f.h.metrics.outlier.lastResort), "not counted again")
}

// The ejecting state keeps, for each backend, which of its clusters the
// detector does not know to be in the choice, while the detector's
// clusters stay as they were: an ejection, its end, the cluster's return
// and a cluster forgotten must all show at the next pick.
func TestEjectingStateReadsEveryEjectionAtTheNextPick(t *testing.T) {
	clk := testingclock.NewFakeClock(sidecartest.Epoch)
	w := newOutlierWatch(&OutlierConfig{Detection: outlier.DefaultConfig(), FirstByte: outlier.DefaultFirstByteConfig(), Clock: clk}, nil, logr.Discard())
	clusters := []*routetable.Cluster{{Name: "a", Pool: "default/llm"}, {Name: "b", Pool: "default/llm"}, {Name: "c", Pool: "default/llm"}}
	st := ejectingState{State: &fakeState{health: map[string]Health{"a": HealthServing, "b": HealthServing, "c": HealthServing}}, w: w}
	read := func() []Health {
		cands := make([]clusterscore.Candidate, len(clusters))
		st.Read(clusters, nil, cands, false)
		return []Health{cands[0].Health, cands[1].Health, cands[2].Health}
	}
	serving, ejected := HealthServing, clusterscore.HealthEjected
	for _, c := range clusters {
		// Known to the detector, so that the first pick finds every
		// cluster in, and the next ones keep that.
		w.det.Record(outlierKey(c), outlier.Success, clk.Now())
	}
	assert.Equal(t, []Health{serving, serving, serving}, read())
	assert.Equal(t, []Health{serving, serving, serving}, read(), "kept from the last pick")

	b := outlierKey(clusters[1])
	for range 5 {
		w.det.Record(b, outlier.Error5xx, clk.Now())
	}
	assert.Equal(t, []Health{serving, ejected, serving}, read(), "an ejection shows at the next pick")
	assert.Equal(t, []Health{serving, ejected, serving}, read())

	clk.Step(outlier.DefaultConfig().BaseEjectionTime)
	assert.Equal(t, []Health{serving, serving, serving}, read(), "its ejection over, the cluster takes a probe")
	w.det.Sent(b, clk.Now())
	assert.Equal(t, []Health{serving, ejected, serving}, read(), "with its probe in flight it takes no other")
	w.det.Record(b, outlier.Success, clk.Now())
	assert.Equal(t, []Health{serving, serving, serving}, read(), "back")

	c := outlierKey(clusters[2])
	w.det.Retain(func(k outlier.Key) bool { return k != c })
	for range 5 {
		w.det.Record(c, outlier.Error5xx, clk.Now())
	}
	assert.Equal(t, []Health{serving, serving, ejected}, read(), "a cluster forgotten and seen again, then ejected")
}
