package sidecar

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	extproctest "github.com/mci-dev/mci/test/extproc"
)

// upstreamResponse is a model server's answer as the gateway runs it
// through ext_proc: headers, a body in chunks, and trailers.
func upstreamResponse() *extproctest.Response {
	return &extproctest.Response{
		Headers:   http.Header{"Content-Type": {"application/json"}},
		Body:      []byte(`{"choices":[{"text":"a haiku about GPUs"}],"usage":{"completion_tokens":7}}`),
		ChunkSize: 10,
		Trailers:  http.Header{"X-Trailer": {"done"}},
	}
}

func responseOutcome(h *harness, cluster, outcome string) float64 {
	return testutil.ToFloat64(h.metrics.responses.WithLabelValues(cluster, outcome))
}

func TestServerRelaysTheResponsePhaseToTheEPPThatRouted(t *testing.T) {
	for _, tt := range []struct {
		name  string
		phase ResponsePhase
	}{
		{name: "relayed to the EPP", phase: ResponsePhaseRelay},
		{name: "answered by the sidecar (Skip)", phase: ResponsePhaseSkip},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
			c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
			h := startServerWith(t, Inputs{
				Routes:  []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))},
				Imports: []*v1alphaImport{twoClusterImport(t, a, c)},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}}, ServerConfig{ResponsePhase: tt.phase})

			up := upstreamResponse()
			res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Response: up})
			require.Nil(t, res.Immediate)
			require.Equal(t, "10.1.0.1:8000", res.Destination)
			require.NotNil(t, res.Response)
			require.Nil(t, res.Response.Immediate)
			assert.Equal(t, http.StatusOK, res.Response.Status)
			assert.Equal(t, string(up.Body), string(res.Response.Body), "the body goes on unchanged")
			assert.Equal(t, "done", res.Response.Trailers.Get("X-Trailer"))
			assert.EqualValues(t, 0, c.calls.Load(), "the other cluster's EPP is not asked")
			assert.EqualValues(t, 0, c.responses.Load())
			require.Eventually(t, func() bool { return len(a.endsOf()) == 1 }, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, []string{"eof"}, a.endsOf(), "the EPP's stream ends cleanly")

			if tt.phase == ResponsePhaseSkip {
				assert.Empty(t, res.Response.Headers.Get("X-Response-Seen-By"), "the EPP does not see the response")
				assert.EqualValues(t, 0, a.responses.Load())
				assert.Zero(t, responseOutcome(h, "cluster-a", ResponseCompleted))
				return
			}
			assert.Equal(t, "epp-a", res.Response.Headers.Get("X-Response-Seen-By"), "the EPP's answer to the response headers reaches the gateway")
			// Headers, 8 body chunks, trailers.
			assert.EqualValues(t, 10, a.responses.Load(), "the EPP got every message of the response phase")
			assert.Equal(t, []string{"10.1.0.1:8000"}, a.served, "the served report reaches the EPP")
			assert.Equal(t, 1.0, responseOutcome(h, "cluster-a", ResponseCompleted))
		})
	}
}

func TestServerFailedOverRequestTalksOnlyToTheServingEPP(t *testing.T) {
	for _, tt := range []struct {
		name   string
		breakA func(a *fakeEPP)
		// wantAEnd is how cluster-a's stream ended.
		wantAEnd bool
	}{
		{name: "the first EPP fails", breakA: func(a *fakeEPP) { a.mode.Store(eppFail) }},
		{name: "the first EPP's pool has no endpoint (503)", breakA: func(a *fakeEPP) { a.mode.Store(eppUnavailable) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
			c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
			h := startServer(t, Inputs{
				Routes:  []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))},
				Imports: []*v1alphaImport{twoClusterImport(t, a, c)},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}})
			tt.breakA(a)

			res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Response: upstreamResponse()})
			require.Nil(t, res.Immediate)
			assert.Equal(t, "10.3.0.1:8000", res.Destination)
			assert.EqualValues(t, 1, a.calls.Load(), "cluster-a's EPP was tried")
			assert.EqualValues(t, 0, a.responses.Load(), "the failed EPP sees no response")
			assert.Equal(t, chatBody, c.lastBody, "the serving EPP got the whole request")
			assert.Equal(t, "epp-c", res.Response.Headers.Get("X-Response-Seen-By"))
			assert.EqualValues(t, 10, c.responses.Load(), "the serving EPP got the whole response phase")
			assert.Equal(t, []string{"10.3.0.1:8000"}, c.served)
			assert.Equal(t, 1.0, responseOutcome(h, "cluster-c", ResponseCompleted))
			assert.Zero(t, responseOutcome(h, "cluster-a", ResponseCompleted))
		})
	}
}

// TestServerAnswersTheRestWhenTheEPPFailsMidResponse: a response already
// served is not failed because its EPP failed in the response phase.
func TestServerAnswersTheRestWhenTheEPPFailsMidResponse(t *testing.T) {
	for _, tt := range []struct {
		name        string
		mode        int32
		wantOutcome string
		wantFailed  bool
	}{
		{name: "the EPP's stream fails", mode: respFail, wantOutcome: ResponseFailed, wantFailed: true},
		{name: "the EPP does not answer in time", mode: respHang, wantOutcome: ResponseTimeout, wantFailed: true},
		{name: "the EPP ends its stream with answers owed", mode: respEnd, wantOutcome: ResponseEnded},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
			st := &fakeState{health: map[string]Health{"cluster-a": HealthServing}}
			h := startServer(t, Inputs{
				Routes:  []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))},
				Imports: []*v1alphaImport{importOf("llm", imported{name: "cluster-a", addr: hostOf(t, a), port: portOf(t, a)})},
			}, st)
			a.respMode.Store(tt.mode)

			up := upstreamResponse()
			res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Response: up})
			require.Nil(t, res.Immediate)
			require.NotNil(t, res.Response)
			require.Nil(t, res.Response.Immediate)
			assert.Equal(t, http.StatusOK, res.Response.Status)
			assert.Equal(t, string(up.Body), string(res.Response.Body), "the response goes on unchanged")
			assert.Equal(t, "done", res.Response.Trailers.Get("X-Trailer"))
			assert.Equal(t, 1.0, responseOutcome(h, "cluster-a", tt.wantOutcome))
			if tt.wantFailed {
				assert.Equal(t, []string{"cluster-a"}, st.failed, "the EPP counts as failed")
			} else {
				assert.Empty(t, st.failed)
			}
		})
	}

	t.Run("the EPP's immediate response goes to the gateway", func(t *testing.T) {
		a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
		h := startServer(t, Inputs{
			Routes:  []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))},
			Imports: []*v1alphaImport{importOf("llm", imported{name: "cluster-a", addr: hostOf(t, a), port: portOf(t, a)})},
		}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}})
		a.respMode.Store(respImmediate)
		res := h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Response: upstreamResponse()})
		require.NotNil(t, res.Response)
		require.NotNil(t, res.Response.Immediate)
		assert.Equal(t, http.StatusBadGateway, res.Response.Immediate.StatusCode)
		assert.Equal(t, 1.0, responseOutcome(h, "cluster-a", ResponseImmediate))
	})
}

// TestServerResponsePhaseLeavesNothingBehind holds responses open, lets the
// gateway go away from some and finish the others, and checks that the
// EPP's streams end with them and no goroutine is left.
func TestServerResponsePhaseLeavesNothingBehind(t *testing.T) {
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	h := startServer(t, Inputs{
		Routes:  []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))},
		Imports: []*v1alphaImport{importOf("llm", imported{name: "cluster-a", addr: hostOf(t, a), port: portOf(t, a)})},
	}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}})
	// Warm the connections so that their goroutines are in the baseline.
	h.do(t, extproctest.Request{Path: "/v1/completions", Body: chatBody, Response: upstreamResponse()})
	baseline := runtime.NumGoroutine()

	const n = 6
	type held struct {
		pw     *io.PipeWriter
		cancel context.CancelFunc
		done   chan error
	}
	var all []held
	for range n {
		pr, pw := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		hd := held{pw: pw, cancel: cancel, done: make(chan error, 1)}
		go func() {
			_, err := h.client.Do(ctx, extproctest.Request{Path: "/v1/completions", Body: chatBody, Response: &extproctest.Response{BodyReader: pr}})
			hd.done <- err
		}()
		_, err := pw.Write([]byte("first tokens"))
		require.NoError(t, err)
		all = append(all, hd)
	}
	require.Eventually(t, func() bool { return a.responses.Load() >= 2*n+10 }, 5*time.Second, 5*time.Millisecond,
		"every held response reached the EPP: %d messages", a.responses.Load())
	for i, hd := range all {
		if i%2 == 0 {
			hd.cancel() // the client goes away
			require.Error(t, <-hd.done)
			_ = hd.pw.Close()
			continue
		}
		require.NoError(t, hd.pw.Close())
		require.NoError(t, <-hd.done)
		hd.cancel()
	}
	require.Eventually(t, func() bool { return len(a.endsOf()) == 1+n }, 5*time.Second, 5*time.Millisecond)
	ends := map[string]int{}
	for _, e := range a.endsOf() {
		ends[e]++
	}
	assert.Equal(t, map[string]int{"eof": 1 + n/2, "canceled": n / 2}, ends, "a finished response ends the EPP's stream cleanly, a client that goes away resets it")
	assert.Equal(t, float64(n/2), responseOutcome(h, "cluster-a", ResponseCanceled))
	if !assert.Eventually(t, func() bool { return runtime.NumGoroutine() <= baseline }, 5*time.Second, 10*time.Millisecond) {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines left behind: %d, baseline %d\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
	}
}

func hostOf(t *testing.T, f *fakeEPP) string {
	h, _ := hostPort(t, f.addr)
	return h
}

func portOf(t *testing.T, f *fakeEPP) int32 {
	_, p := hostPort(t, f.addr)
	return p
}
