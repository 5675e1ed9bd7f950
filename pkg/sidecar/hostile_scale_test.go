package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/hostileepp"
)

// The hostile EPP harness's sizes: requests of a well-behaved cluster's
// import (beside one for each hostile case), run by this many concurrent
// gateway streams; its heap cap (the whole test process: the sidecar, the
// EPPs and the gateway client).
const (
	honestRequests = 300
	hostileStreams = 256
	hostileHeapCap = 160 << 20
)

// The destinations of the harness's clusters: the backup of the hostile
// one, and the well-behaved one of its own import.
const (
	backupDestination = "10.3.0.1:8000"
	honestDestination = "10.2.0.1:8000"
)

// TestAHostileEPPAtScaleGetsNothingThroughToTheGateway runs the sidecar's
// gRPC server against hostileepp's EPP, which answers each request with a
// case of a seeded generator covering every class of hostile answer, as
// the first cluster of an import whose second is well-behaved; beside it
// a well-behaved cluster of an import of its own gets honest traffic.
// Hundreds of gateway streams run at once. Every answer the gateway got,
// message by message, must hold only what eppanswer's rules let through
// (checked here from the rules, not by eppanswer): the destination and
// its metadata, a body rewritten in its model alone, an immediate
// response of a status that passes in the sidecar's own words, and a
// response phase untouched; and must be what the case's class says
// becomes of it. Every refusal is counted in
// mci_sidecar_epp_answers_refused_total with its reason; the honest
// requests are all served; the heap stays under hostileHeapCap; nothing is
// left running once it is all stopped. MCI_HOSTILE_EPP_SEED replays a
// seed (the test logs the one it used).
func TestAHostileEPPAtScaleGetsNothingThroughToTheGateway(t *testing.T) {
	goroutines := runtime.NumGoroutine()
	t.Cleanup(func() { assertNoGoroutineLeft(t, goroutines) })
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("MCI_HOSTILE_EPP_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "MCI_HOSTILE_EPP_SEED")
	}
	t.Logf("seed %d (MCI_HOSTILE_EPP_SEED=%d replays it)", seed, seed)

	serviceRange, podRange := netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.244.0.0/16")
	// Enough cases for an immediate response of every status.
	cases := hostileepp.Generate(seed, hostileepp.Rounds(hostileepp.ImmediateRoundsForEveryStatus()), hostileepp.Config{
		Port:         8000,
		Addresses:    []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.1.0.3")},
		ServiceRange: serviceRange,
		PodRange:     podRange,
	})
	hostile, err := hostileepp.Start(cases)
	require.NoError(t, err)
	t.Cleanup(hostile.Stop)
	backup := startFakeEPP(t, "backup", backupDestination)
	honest := startFakeEPP(t, "honest", honestDestination)
	hh, hp := hostPort(t, hostile.Addr())
	// The hostile EPP's import publishes its Config.Addresses as the
	// pool's endpoint addresses.
	llm := sidecartest.Import("llm",
		sidecartest.Imported{Name: "hostile", Addr: hh, Port: hp, EndpointAddresses: []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"}},
		sidecartest.Imported{Name: "backup", Addr: hostOf(t, backup), Port: portOf(t, backup)})
	well := sidecartest.Import("honest", sidecartest.Imported{Name: "honest", Addr: hostOf(t, honest), Port: portOf(t, honest)})
	h := startServerOpts(t, routetable.Inputs{
		Routes: []*gatewayv1.HTTPRoute{
			sidecartest.Route("hostile", 0, []string{"hostile.model.com"}, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))),
			sidecartest.Route("honest", 0, []string{"honest.model.com"}, sidecartest.Rule(nil, sidecartest.ImportRef("honest", nil))),
		},
		Imports: []*v1alpha1.InferencePoolImport{llm, well},
	}, &fakeState{health: map[string]Health{"hostile": HealthServing, "honest": HealthServing}}, ServerConfig{
		// Long enough for an honest EPP on a loaded machine; the answers
		// that never end take it.
		AttemptTimeout:     2 * time.Second,
		RemoteDestinations: eppanswer.Policy{ServiceRanges: []netip.Prefix{serviceRange}, PodRanges: []netip.Prefix{podRange}},
	}, append(serverOptions(), grpc.MaxConcurrentStreams(uint32(min(DefaultMaxStreams, math.MaxUint32))))...)
	client, err := envoyclient.Dial(h.addr, envoyclient.Options{MessageTimeout: 10 * time.Second}, grpc.WithStreamInterceptor(recordAnswers))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })

	heap := sampleHeap()
	start := time.Now()
	results, peak := runHostileTraffic(t, client, cases)
	took := time.Since(start)
	maxHeap := heap()
	t.Logf("%d requests (%d to the hostile EPP's import) in %v, at most %d streams at once; heap at most %d MiB (cap %d MiB)",
		len(results), len(cases), took.Round(time.Millisecond), peak, maxHeap>>20, hostileHeapCap>>20)

	byClass, statuses := map[string]int{}, map[string]bool{}
	for _, r := range results {
		r.check(t)
		if r.c != nil {
			byClass[r.c.Class]++
			statuses[r.c.Detail] = statuses[r.c.Detail] || r.c.Class == "an immediate response"
		}
	}
	for _, class := range hostileepp.Classes() {
		assert.NotZero(t, byClass[class], "class %q was run", class)
	}
	for _, code := range hostileepp.Statuses() {
		assert.True(t, statuses[strconv.Itoa(code)], "an immediate response of status %d was run", code)
	}
	assert.Zero(t, hostile.Unknown.Load(), "every request the hostile EPP got named its case")
	assert.Zero(t, hostile.Credentialed.Load(), "the client's credentials never reach the hostile EPP")
	assert.Less(t, maxHeap, uint64(hostileHeapCap), "the heap stays under its cap")
	assert.GreaterOrEqual(t, peak, int64(hostileStreams/2), "hundreds of gateway streams ran at once")

	// Every refusal is counted with its reason: those of the request
	// phase before the gateway got its answer, those of the response
	// phase as the sidecar read them.
	want := map[string]float64{}
	for _, c := range cases {
		for _, reason := range []string{c.Want.Reason, c.Want.ResponseReason} {
			if reason != "" {
				want[reason]++
			}
		}
	}
	refused := func(cluster string) map[string]float64 {
		got := map[string]float64{}
		for _, reason := range eppanswer.Reasons {
			if v := testutil.ToFloat64(h.metrics.answersRefused.WithLabelValues(cluster, reason)); v != 0 {
				got[reason] = v
			}
		}
		return got
	}
	assert.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, refused("hostile")) }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, want, refused("hostile"), "mci_sidecar_epp_answers_refused_total of the hostile cluster, by reason")
	assert.Empty(t, refused("backup"))
	assert.Empty(t, refused("honest"))
	assert.EqualValues(t, honestRequests, honest.calls.Load(), "the well-behaved cluster got every honest request once")
}

// runHostileTraffic runs a request for each case and honestRequests honest
// ones, interleaved, on hostileStreams concurrent streams, and returns the
// results and the most streams that were open at once.
func runHostileTraffic(t *testing.T, client *envoyclient.Client, cases []*hostileepp.Case) ([]*hostileResult, int64) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	jobs := make(chan *hostileResult)
	var results []*hostileResult
	go func() {
		defer close(jobs)
		total := len(cases) + honestRequests
		for i := range total {
			r := &hostileResult{id: i}
			// honestRequests spread evenly among the cases.
			if i*honestRequests/total == (i+1)*honestRequests/total {
				r.c, cases = cases[0], cases[1:]
			}
			results = append(results, r)
			select {
			case jobs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	var open, peak atomic.Int64
	var wg sync.WaitGroup
	for range hostileStreams {
		wg.Go(func() {
			for r := range jobs {
				n := open.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				r.run(ctx, client)
				open.Add(-1)
			}
		})
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "the requests ended in time")
	return results, peak.Load()
}

// hostileResult is one request of the harness: of a hostile case (c), or
// honest (c nil), and what the gateway got.
type hostileResult struct {
	id   int
	c    *hostileepp.Case
	req  envoyclient.Request
	res  *envoyclient.Result
	err  error
	msgs []*extprocv3.ProcessingResponse
}

var upstreamBody = []byte(`{"choices":[{"text":"hello"}]}`)

func (r *hostileResult) run(ctx context.Context, client *envoyclient.Client) {
	authority := "honest.model.com"
	if r.c != nil {
		authority = "hostile.model.com"
	}
	body := []byte(fmt.Sprintf(`{"model":"chat","prompt":"hello %d"}`, r.id))
	r.req = envoyclient.Request{
		Path: "/v1/completions", Authority: authority, Body: body,
		Headers: http.Header{
			hostileepp.CaseHeader: {r.caseID()},
			"Authorization":       {"Bearer client-secret"},
			"Cookie":              {"session=client"},
			"Content-Type":        {"application/json"},
			"Content-Length":      {strconv.Itoa(len(body))},
		},
		Response: &envoyclient.Response{Status: http.StatusOK, Headers: http.Header{"Content-Type": {"application/json"}, "X-Upstream": {"model-server"}}, Body: upstreamBody},
	}
	rec := &recording{}
	r.res, r.err = client.Do(context.WithValue(ctx, recordingKey{}, rec), r.req)
	r.msgs = rec.answers()
}

func (r *hostileResult) caseID() string {
	if r.c == nil {
		return "honest"
	}
	return strconv.Itoa(r.c.ID)
}

func (r *hostileResult) String() string {
	if r.c == nil {
		return fmt.Sprintf("honest request %d", r.id)
	}
	return r.c.String()
}

// check checks what the gateway got for r: by eppanswer's rules, message
// by message, and as r's case wants.
func (r *hostileResult) check(t *testing.T) {
	t.Helper()
	if !assert.NoError(t, r.err, "%s: the gateway's stream", r) || !assert.NotNil(t, r.res, "%s", r) {
		return
	}
	for _, m := range r.msgs {
		for _, v := range answerViolations(m) {
			t.Errorf("%s: the gateway got %s: %s", r, v, prototext.Format(m))
		}
	}
	assert.NotContains(t, gatewayView(r.res), hostileepp.Marker, "%s: nothing of the hostile EPP's", r)
	want := hostileepp.Want{Destination: honestDestination}
	if r.c != nil {
		want = r.c.Want
		if want.Reason != "" || want.Fails {
			// The next cluster took the request.
			want = hostileepp.Want{Destination: backupDestination}
		}
	}
	if want.Status != 0 {
		if assert.NotNil(t, r.res.Immediate, "%s: an immediate response", r) {
			assert.Equal(t, want.Status, r.res.Immediate.StatusCode, "%s", r)
			var eb extproc.ErrorBody
			assert.NoError(t, json.Unmarshal(r.res.Immediate.Body, &eb), "%s: the sidecar's own body", r)
			assert.Contains(t, eb.Error.Message, "hostile", "%s: the body says which cluster answered", r)
		}
		return
	}
	if !assert.Nil(t, r.res.Immediate, "%s: routed", r) {
		return
	}
	assert.Equal(t, want.Destination, strings.Join(append([]string{r.res.Destination}, r.res.Fallbacks...), ","), "%s: the destination", r)
	headers, sent := r.res.Headers.Clone(), sentHeaders(r.req)
	headers.Del(extproc.DestinationEndpointHeader)
	if want.Model != "" {
		// A rewritten body has its own length.
		headers.Del("Content-Length")
		sent.Del("Content-Length")
	}
	assert.Equal(t, sent, headers, "%s: the request's headers, with the destination alone added", r)
	if want.Model != "" {
		var got, sent map[string]any
		require.NoError(t, json.Unmarshal(r.res.Body, &got))
		require.NoError(t, json.Unmarshal(r.req.Body, &sent))
		assert.Equal(t, want.Model, got["model"], "%s", r)
		delete(got, "model")
		delete(sent, "model")
		assert.Equal(t, sent, got, "%s: the body changed in its model alone", r)
		assert.Equal(t, strconv.Itoa(len(r.res.Body)), r.res.Headers.Get("content-length"), "%s", r)
	} else {
		assert.Equal(t, string(r.req.Body), string(r.res.Body), "%s: the request's own body", r)
	}
	if assert.NotNil(t, r.res.Response, "%s: the response phase ran", r) {
		resp := r.res.Response
		assert.Nil(t, resp.Immediate, "%s: the response is not replaced", r)
		assert.Equal(t, http.StatusOK, resp.Status, "%s", r)
		assert.Equal(t, "model-server", resp.Headers.Get("X-Upstream"), "%s", r)
		assert.Empty(t, resp.Headers.Get("Set-Cookie"), "%s", r)
		assert.Empty(t, resp.Headers.Get("Location"), "%s", r)
		assert.Equal(t, "application/json", resp.Headers.Get("Content-Type"), "%s", r)
		assert.Equal(t, string(upstreamBody), string(resp.Body), "%s: the response's own body", r)
	}
}

// gatewayView is everything the gateway made of an answer, as text.
func gatewayView(res *envoyclient.Result) string {
	view := fmt.Sprint(res.Destination, res.Fallbacks, res.Headers, string(res.Body), res.DynamicMetadata.String())
	if ir := res.Immediate; ir != nil {
		view += fmt.Sprint(ir.StatusCode, ir.Headers, string(ir.Body), ir.Details)
	}
	if resp := res.Response; resp != nil {
		view += fmt.Sprint(resp.Status, resp.Headers, string(resp.Body), resp.Trailers)
		if ir := resp.Immediate; ir != nil {
			view += fmt.Sprint(ir.StatusCode, ir.Headers, string(ir.Body), ir.Details)
		}
	}
	return view
}

// sentHeaders are the headers the gateway client sends for req (all set
// by the request but the pseudo-headers).
func sentHeaders(req envoyclient.Request) http.Header {
	h := http.Header{}
	for k, vs := range req.Headers {
		h[http.CanonicalHeaderKey(k)] = vs
	}
	h.Set(":method", http.MethodPost)
	h.Set(":path", req.Path)
	h.Set(":authority", req.Authority)
	h.Set(":scheme", "http")
	return h
}

// answerViolations are what of m, an answer the gateway got from the
// sidecar, eppanswer's rules do not let through from a remote EPP: of the
// request phase, the destination (header and metadata, which agree), a
// content-length for a rewritten body, and the body streamed back; an
// immediate response only of a status that passes, with the sidecar's
// JSON body; of the response phase, the messages let through unchanged.
// No mode override, timeout override, other metadata or mutation.
func answerViolations(m *extprocv3.ProcessingResponse) []string {
	var v []string
	if m.ModeOverride != nil {
		v = append(v, "a mode override")
	}
	if m.OverrideMessageTimeout != nil {
		v = append(v, "a message timeout override")
	}
	if len(m.ProtoReflect().GetUnknown()) > 0 {
		v = append(v, "unknown fields")
	}
	dest, ok := "", true
	if md := m.DynamicMetadata; md != nil {
		lb := md.GetFields()[extproc.DestinationEndpointNamespace].GetStructValue()
		dest = lb.GetFields()[extproc.DestinationEndpointKey].GetStringValue()
		ok = len(md.GetFields()) == 1 && len(lb.GetFields()) == 1 && dest != "" && m.GetRequestHeaders() != nil
	}
	if !ok {
		v = append(v, "dynamic metadata beyond the destination")
	}
	common := func(c *extprocv3.CommonResponse, headers ...string) {
		if c.GetStatus() != extprocv3.CommonResponse_CONTINUE || c.GetTrailers() != nil || len(c.GetHeaderMutation().GetRemoveHeaders()) > 0 {
			v = append(v, "a status, trailers or a header removal")
		}
		for _, h := range c.GetHeaderMutation().GetSetHeaders() {
			if !slices.Contains(headers, h.GetHeader().GetKey()) {
				v = append(v, "a mutation of header "+h.GetHeader().GetKey())
			}
			if h.GetHeader().GetKey() == extproc.DestinationEndpointHeader && extproc.HeaderValue(h.GetHeader()) != dest {
				v = append(v, "a destination header the metadata does not carry")
			}
		}
		switch c.GetBodyMutation().GetMutation().(type) {
		case nil, *extprocv3.BodyMutation_StreamedResponse:
		default:
			v = append(v, "a body mutation other than the streamed body")
		}
	}
	switch r := m.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		common(r.RequestHeaders.GetResponse(), extproc.DestinationEndpointHeader, "content-length")
		if r.RequestHeaders.GetResponse().GetBodyMutation() != nil {
			v = append(v, "a body mutation in the headers' answer")
		}
	case *extprocv3.ProcessingResponse_RequestBody:
		common(r.RequestBody.GetResponse())
	case *extprocv3.ProcessingResponse_RequestTrailers:
		if r.RequestTrailers.GetHeaderMutation() != nil {
			v = append(v, "a trailers mutation")
		}
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		common(r.ResponseHeaders.GetResponse())
		if r.ResponseHeaders.GetResponse().GetBodyMutation() != nil {
			v = append(v, "a body mutation in the response headers' answer")
		}
	case *extprocv3.ProcessingResponse_ResponseBody:
		common(r.ResponseBody.GetResponse())
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		if r.ResponseTrailers.GetHeaderMutation() != nil {
			v = append(v, "a response trailers mutation")
		}
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		ir := r.ImmediateResponse
		if code := int(ir.GetStatus().GetCode()); !slices.Contains([]int{400, 404, 413, 429, 503}, code) {
			v = append(v, fmt.Sprintf("an immediate response of status %d", code))
		}
		set := ir.GetHeaders().GetSetHeaders()
		if len(set) != 1 || set[0].GetHeader().GetKey() != "content-type" || extproc.HeaderValue(set[0].GetHeader()) != "application/json" || len(ir.GetHeaders().GetRemoveHeaders()) > 0 {
			v = append(v, "immediate response headers other than its content-type")
		}
		if ir.GetGrpcStatus() != nil || !json.Valid(ir.GetBody()) {
			v = append(v, "an immediate response with a gRPC status or a body not the sidecar's JSON")
		}
	default:
		v = append(v, fmt.Sprintf("a %T", m.Response))
	}
	if strings.Contains(prototext.Format(m), hostileepp.Marker) {
		v = append(v, "what the hostile EPP set")
	}
	return v
}

// recording holds the answers a gateway stream received.
type recording struct {
	mu   sync.Mutex
	msgs []*extprocv3.ProcessingResponse
}

func (r *recording) add(m *extprocv3.ProcessingResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
}

func (r *recording) answers() []*extprocv3.ProcessingResponse {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

type recordingKey struct{}

// recordAnswers is a stream interceptor of the gateway client that keeps
// every answer of a stream whose context carries a *recording.
func recordAnswers(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	rec, ok := ctx.Value(recordingKey{}).(*recording)
	if err != nil || !ok {
		return s, err
	}
	return &recordingStream{ClientStream: s, rec: rec}, nil
}

type recordingStream struct {
	grpc.ClientStream
	rec *recording
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*extprocv3.ProcessingResponse); ok && err == nil {
		s.rec.add(proto.Clone(r).(*extprocv3.ProcessingResponse))
	}
	return err
}

// sampleHeap samples the heap in use until the returned function is
// called, which returns the most it saw.
func sampleHeap() func() uint64 {
	// What earlier tests left is not counted.
	runtime.GC()
	var most uint64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			most = max(most, ms.HeapAlloc)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-stopped
		return most
	}
}

// assertNoGoroutineLeft waits for the goroutines to be back to before's
// count once everything the test started has stopped.
func assertNoGoroutineLeft(t *testing.T, before int) {
	// Polled here: assert.Eventually runs goroutines of its own.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines left running (%d before):\n%s", n-before, before, buf[:runtime.Stack(buf, true)])
	}
}
