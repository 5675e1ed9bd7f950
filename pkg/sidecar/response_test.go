package sidecar

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// upstreamResponse is a model server's answer as the gateway runs it
// through ext_proc: headers, a body in chunks, and trailers.
func upstreamResponse() *envoyclient.Response {
	return &envoyclient.Response{
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
		// plain: served by a gRPC server without the sidecar's frame
		// codec, which then reads and sends frames as plain protobuf.
		plain bool
	}{
		{name: "relayed to the EPP", phase: ResponsePhaseRelay},
		{name: "relayed to the EPP by a server without the frame codec", phase: ResponsePhaseRelay, plain: true},
		{name: "answered by the sidecar (Skip)", phase: ResponsePhaseSkip},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
			c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
			opts := serverOptions()
			if tt.plain {
				opts = nil
			}
			h := startServerOpts(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
				Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}}, ServerConfig{ResponsePhase: tt.phase}, opts...)

			up := upstreamResponse()
			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: up})
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
			assert.Empty(t, res.Response.Headers.Get("X-Response-Seen-By"), "a remote EPP's mutation of the response headers does not reach the gateway")
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
			h := startServer(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
				Imports: []*v1alpha1.InferencePoolImport{twoClusterImport(t, a, c)},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}})
			tt.breakA(a)

			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: upstreamResponse()})
			require.Nil(t, res.Immediate)
			assert.Equal(t, "10.3.0.1:8000", res.Destination)
			assert.EqualValues(t, 1, a.calls.Load(), "cluster-a's EPP was tried")
			assert.EqualValues(t, 0, a.responses.Load(), "the failed EPP sees no response")
			assert.Equal(t, chatBody, c.lastBody, "the serving EPP got the whole request")
			assert.Empty(t, res.Response.Headers.Get("X-Response-Seen-By"), "a remote EPP's mutation does not reach the gateway")
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
		// noTrailers: the response ends with its body, so that the
		// gateway waits for nothing of the EPP once it has the chunks.
		noTrailers bool
	}{
		{name: "the EPP's stream fails", mode: respFail, wantOutcome: ResponseFailed, wantFailed: true},
		{name: "the EPP does not answer in time", mode: respHang, wantOutcome: ResponseTimeout, wantFailed: true},
		{name: "the EPP ends its stream with answers owed", mode: respEnd, wantOutcome: ResponseEnded},
		{name: "the EPP stops answering the chunks that went ahead: the gateway has them, the EPP timed out", mode: respStallBody, wantOutcome: ResponseTimeout, wantFailed: true, noTrailers: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, st, h := startOneCluster(t)
			a.respMode.Store(tt.mode)

			up := upstreamResponse()
			if tt.noTrailers {
				up.Trailers = nil
			}
			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: up})
			require.Nil(t, res.Immediate)
			require.NotNil(t, res.Response)
			require.Nil(t, res.Response.Immediate)
			assert.Equal(t, http.StatusOK, res.Response.Status)
			assert.Equal(t, string(up.Body), string(res.Response.Body), "the response goes on unchanged")
			if !tt.noTrailers {
				assert.Equal(t, "done", res.Response.Trailers.Get("X-Trailer"))
			}
			// The outcome of a gateway that has all it waits for is
			// counted once the EPP's stream is let go.
			assert.Eventually(t, func() bool { return responseOutcome(h, "cluster-a", tt.wantOutcome) == 1 }, 5*time.Second, 5*time.Millisecond)
			assert.Eventually(t, func() bool { return testutil.ToFloat64(h.metrics.eppStreams) == 0 }, 5*time.Second, 10*time.Millisecond,
				"the EPP's stream is released: %v open", testutil.ToFloat64(h.metrics.eppStreams))
			if tt.wantFailed {
				assert.Equal(t, []string{"cluster-a"}, st.failed, "the EPP counts as failed")
			} else {
				assert.Empty(t, st.failed)
			}
		})
	}

	t.Run("an EPP whose end of stream comes after the gateway reset it completed the response phase", func(t *testing.T) {
		a, st, h := startOneCluster(t)
		// The gateway's linger (1s, test/envoyclient) ends before the
		// sidecar's own.
		h.server.relay.linger = 5 * time.Second
		a.respMode.Store(respSlowEnd)
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: upstreamResponse()})
		require.NotNil(t, res.Response)
		assert.Eventually(t, func() bool { return responseOutcome(h, "cluster-a", ResponseCompleted) == 1 }, 5*time.Second, 5*time.Millisecond,
			"completed, not canceled: %v canceled", responseOutcome(h, "cluster-a", ResponseCanceled))
		assert.Empty(t, st.failed)
	})

	// A stalled EPP whose deadline is further than the sidecar's linger is
	// let go by the linger, when the gateway (test/envoyclient lingers 1s,
	// as the sidecar does) resets its stream: either may come first, and
	// the EPP still owed answers either way. (This raced: an EPP let go by
	// the linger just as the gateway reset was counted completed.)
	t.Run("an EPP that stalls until the linger, as the gateway resets, timed out", func(t *testing.T) {
		a, st, h := startOneCluster(t)
		h.server.relay.timeout, h.server.relay.linger = 10*time.Second, time.Second
		a.respMode.Store(respStallBody)
		up := upstreamResponse()
		up.Trailers = nil
		const n = 4
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: up})
				assert.Equal(t, string(up.Body), string(res.Response.Body), "the response goes on unchanged")
			})
		}
		wg.Wait()
		outcomes := func() map[string]float64 {
			out := map[string]float64{}
			for _, o := range []string{ResponseCompleted, ResponseCanceled, ResponseImmediate, ResponseFailed, ResponseTimeout, ResponseEnded} {
				if v := responseOutcome(h, "cluster-a", o); v != 0 {
					out[o] = v
				}
			}
			return out
		}
		// Each outcome is counted as its handler returns, which may be
		// after the gateway had its answers.
		assert.Eventually(t, func() bool {
			var sum float64
			for _, v := range outcomes() {
				sum += v
			}
			return sum == n
		}, 5*time.Second, 5*time.Millisecond)
		assert.Equal(t, map[string]float64{ResponseTimeout: n}, outcomes())
		assert.Len(t, st.failures(), n, "each one counts against the EPP's health, gateway gone or not")
	})

	t.Run("a remote EPP's immediate response is refused and the response goes on", func(t *testing.T) {
		a, st, h := startOneCluster(t)
		a.respMode.Store(respImmediate)
		res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: upstreamResponse()})
		require.NotNil(t, res.Response)
		assert.Nil(t, res.Response.Immediate, "the EPP's 502 does not replace the client's response")
		assert.Equal(t, http.StatusOK, res.Response.Status)
		// The outcome is counted as the server's stream ends, which may
		// be just after the gateway got its answers.
		assert.Eventually(t, func() bool { return responseOutcome(h, "cluster-a", ResponseFailed) == 1 }, 5*time.Second, 5*time.Millisecond)
		assert.Equal(t, 1.0, testutil.ToFloat64(h.server.metrics.answersRefused.WithLabelValues("cluster-a", eppanswer.ReasonImmediateStatus)))
		assert.Len(t, st.failures(), 1, "it counts against the EPP's health")
	})
}

// TestServerResponsePhaseLeavesNothingBehind holds responses open, lets the
// gateway go away from some and finish the others, and checks that the
// EPP's streams end with them and no goroutine is left.
func TestServerResponsePhaseLeavesNothingBehind(t *testing.T) {
	a, _, h := startOneCluster(t)
	// Warm the connections so that their goroutines are in the baseline.
	h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: upstreamResponse()})
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
			_, err := h.client.Do(ctx, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: &envoyclient.Response{BodyReader: pr}})
			hd.done <- err
		}()
		_, err := pw.Write([]byte("first tokens"))
		require.NoError(t, err)
		all = append(all, hd)
	}
	require.Eventually(t, func() bool { return a.responses.Load() >= 2*n+10 }, 5*time.Second, 5*time.Millisecond,
		"every held response reached the EPP: %d messages", a.responses.Load())
	assert.Equal(t, float64(n), testutil.ToFloat64(h.metrics.eppStreams), "each held response keeps one EPP stream open, counted")
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
	// The outcome is counted as the sidecar's handler returns, which may be
	// just after the EPP saw its stream reset.
	assert.Eventually(t, func() bool { return responseOutcome(h, "cluster-a", ResponseCanceled) == float64(n/2) }, 5*time.Second, 5*time.Millisecond,
		"canceled responses: %v", responseOutcome(h, "cluster-a", ResponseCanceled))
	assert.Eventually(t, func() bool { return testutil.ToFloat64(h.metrics.eppStreams) == 0 }, 5*time.Second, 10*time.Millisecond,
		"no EPP stream is left open: %v", testutil.ToFloat64(h.metrics.eppStreams))
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

// chanSink passes each body piece the gateway passes on to its client to a
// channel.
type chanSink struct {
	headers http.Header
	body    chan string
}

func (s *chanSink) WriteHeaders(_ int, h http.Header) error { s.headers = h; return nil }
func (s *chanSink) WriteBody(b []byte) error                { s.body <- string(b); return nil }
func (s *chanSink) WriteTrailers(http.Header) error         { return nil }

// TestServerStreamsBodyChunksAtTheModelServersPace: with Relay, a chunk of
// a streamed response reaches the gateway while the EPP still holds its
// answer (it reads the usage at the end), and the EPP sees every chunk, in
// order; with Intercept, the chunk waits for the EPP.
func TestServerStreamsBodyChunksAtTheModelServersPace(t *testing.T) {
	for _, tt := range []struct {
		name  string
		phase ResponsePhase
		ahead bool
	}{
		{name: "Relay: the chunk goes ahead of the EPP's answer", phase: ResponsePhaseRelay, ahead: true},
		{name: "Intercept: the chunk waits for the EPP's answer", phase: ResponsePhaseIntercept},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The local pool's EPP: a remote one's answers to chunks never
			// reach the gateway, whatever the response phase says.
			a, _, in := localAndRemoteEPPs(t)
			a.respMode.Store(respHoldBody)
			in.Routes = []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.PoolRef("llm", nil)))}
			h := startServerWith(t, in, &fakeState{}, ServerConfig{ResponsePhase: tt.phase})

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			x, err := h.client.Start(ctx, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
			require.NoError(t, err)
			defer x.Close()
			pr, pw := io.Pipe()
			sink := &chanSink{body: make(chan string, 16)}
			done := make(chan error, 1)
			go func() {
				_, err := x.Respond(envoyclient.Response{Headers: http.Header{"Content-Type": {"text/event-stream"}}, BodyReader: pr}, sink)
				done <- err
			}()

			var got []string
			for _, tok := range []string{"data: tok1\n\n", "data: tok2\n\n"} {
				_, err := pw.Write([]byte(tok))
				require.NoError(t, err)
				require.Eventually(t, func() bool { return len(a.chunksOf()) == len(got)+1 }, 5*time.Second, time.Millisecond, "the EPP sees the chunk")
				select {
				case b := <-sink.body:
					require.True(t, tt.ahead, "a chunk reached the gateway before the EPP answered it")
					got = append(got, b)
				case <-time.After(200 * time.Millisecond):
					require.False(t, tt.ahead, "the chunk did not reach the gateway while the EPP held its answer")
					got = append(got, "")
				}
			}
			require.NoError(t, pw.Close())
			require.NoError(t, <-done)
			close(sink.body)
			for b := range sink.body {
				got = append(got, b)
			}
			assert.Equal(t, "data: tok1\n\ndata: tok2\n\n", strings.Join(got, ""), "the body reaches the gateway whole and unchanged")
			assert.Equal(t, "epp-local", sink.headers.Get("X-Response-Seen-By"), "the EPP's answer to the headers applies")
			// The end of the body may reach the gateway before the EPP.
			assert.Eventually(t, func() bool { return len(a.chunksOf()) == 3 }, 5*time.Second, time.Millisecond)
			assert.Equal(t, []string{"data: tok1\n\n", "data: tok2\n\n", ""}, a.chunksOf(), "the EPP sees every chunk, in order")
			x.Close()
			assert.Eventually(t, func() bool { return responseOutcome(h, routetable.DefaultLocalCluster, ResponseCompleted) == 1 }, 5*time.Second, 5*time.Millisecond)
			assert.Zero(t, testutil.ToFloat64(h.metrics.lateBody.WithLabelValues(routetable.DefaultLocalCluster)))
		})
	}
}

// TestServerCountsBodyRewritesThatArriveLate: an EPP that rewrites the
// streamed body gets its rewrite applied with Intercept; with Relay the
// chunks went ahead, so they go on unchanged and its answers are counted.
func TestServerCountsBodyRewritesThatArriveLate(t *testing.T) {
	for _, tt := range []struct {
		name     string
		phase    ResponsePhase
		wantBody string
		wantLate float64
	}{
		{name: "Relay: unchanged, counted", phase: ResponsePhaseRelay, wantBody: "some tokens", wantLate: 2},
		{name: "Intercept: rewritten", phase: ResponsePhaseIntercept, wantBody: "SOME TOKENS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The local pool's EPP: a remote one's answers to chunks never
			// reach the gateway, whatever the response phase says.
			a, _, in := localAndRemoteEPPs(t)
			a.respMode.Store(respRewrite)
			in.Routes = []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.PoolRef("llm", nil)))}
			h := startServerWith(t, in, &fakeState{}, ServerConfig{ResponsePhase: tt.phase})
			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody, Response: &envoyclient.Response{Body: []byte("some tokens"), ChunkSize: 6}})
			require.NotNil(t, res.Response)
			assert.Equal(t, tt.wantBody, string(res.Response.Body))
			assert.Eventually(t, func() bool { return responseOutcome(h, routetable.DefaultLocalCluster, ResponseCompleted) == 1 }, 5*time.Second, 5*time.Millisecond)
			assert.Equal(t, tt.wantLate, testutil.ToFloat64(h.metrics.lateBody.WithLabelValues(routetable.DefaultLocalCluster)))
		})
	}
}

// startOneCluster serves the route of an import of one cluster, cluster-a,
// whose EPP is a serving fake.
func startOneCluster(t *testing.T) (*fakeEPP, *fakeState, *harness) {
	t.Helper()
	a := startFakeEPP(t, "epp-a", "10.1.0.1:8000")
	st := &fakeState{health: map[string]Health{"cluster-a": HealthServing}}
	h := startServer(t, routetable.Inputs{
		Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
		Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: hostOf(t, a), Port: portOf(t, a)})},
	}, st)
	return a, st, h
}

func TestLateBodyAnswersAreCountedAndLoggedOncePerChange(t *testing.T) {
	var logged []string
	logger := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	m := NewMetrics(prometheus.NewRegistry())
	obs := newObservers(clusterscore.NewMemory(clusterscore.DefaultMemoryOptions()), nil, m, logger)
	c := &routetable.Cluster{Name: "cluster-a", EPP: "127.0.0.1:9002"}
	respond := func(late int, outcome string) {
		what := ""
		if late > 0 {
			what = "a rewritten body"
		}
		(&tracker{observers: obs, liveCluster: c}).responsePhase(outcome, late, what)
	}
	steps := []struct {
		late    int
		outcome string
		// want is a part of the line logged, "" for none.
		want string
	}{
		{late: 2, outcome: ResponseCompleted, want: "asked to change response body chunks"},
		{late: 1, outcome: ResponseCompleted},
		{outcome: ResponseCanceled},
		{outcome: ResponseCompleted, want: "without changes again"},
		{outcome: ResponseCompleted},
		{late: 1, outcome: ResponseCompleted, want: "asked to change response body chunks"},
	}
	for i, s := range steps {
		logged = nil
		respond(s.late, s.outcome)
		if s.want == "" {
			assert.Empty(t, logged, "step %d", i)
			continue
		}
		if assert.Len(t, logged, 1, "step %d", i) {
			assert.Contains(t, logged[0], s.want, "step %d", i)
			assert.Contains(t, logged[0], `"cluster"="cluster-a"`)
		}
	}
	assert.Equal(t, 4.0, testutil.ToFloat64(m.lateBody.WithLabelValues("cluster-a")), "every late answer is counted")
}
