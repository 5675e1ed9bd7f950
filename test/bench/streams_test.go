package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/test/quantile"
	"github.com/mci-dev/mci/test/simulator"
)

// The streamed responses' loopback "pods": the model server and mci-epp of
// cluster-a, and three mci-sidecars of cluster-b, one per
// --epp-response-phase.
const (
	streamSimIP       = "127.0.203.1"
	streamEPPIP       = "127.0.203.100"
	streamRelayIP     = "127.0.204.1"
	streamSkipIP      = "127.0.204.2"
	streamInterceptIP = "127.0.204.3"
	streamNS          = "streams"
	streamPool        = "streams"
	// streamHeader selects the streams' route: the data path's route
	// matches the same path, and more header matches take precedence.
	streamHeader = "X-Mci-Bench"
	// streamIDHeader names a stream for flushLog.
	streamIDHeader = "X-Mci-Stream-Id"
)

// flushLog records when the simulator flushed each chunk of each stream
// (by streamIDHeader): the body's length so far, and the time. A chunk's
// transit is the time from its flush to its arrival at the client: what
// the path adds to it, without the simulator's own timer jitter, which the
// inter-chunk times include.
type flushLog struct {
	mu    sync.Mutex
	marks map[string][]flushMark
}

type flushMark struct {
	bytes int
	at    time.Time
}

// wrap records the flushes of h's streams.
func (l *flushLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(streamIDHeader)
		if id == "" {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&flushWriter{ResponseWriter: w, log: l, id: id}, r)
	})
}

// flushedAt is when the body of stream id had reached n bytes.
func (l *flushLog) flushedAt(id string, n int) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.marks[id] {
		if m.bytes >= n {
			return m.at, true
		}
	}
	return time.Time{}, false
}

func (l *flushLog) forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.marks, id)
}

type flushWriter struct {
	http.ResponseWriter
	log *flushLog
	id  string
	n   int
}

func (f *flushWriter) Write(b []byte) (int, error) {
	n, err := f.ResponseWriter.Write(b)
	f.n += n
	return n, err
}

func (f *flushWriter) Flush() {
	if fl, ok := f.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
	f.log.mu.Lock()
	defer f.log.mu.Unlock()
	if f.log.marks == nil {
		f.log.marks = map[string][]flushMark{}
	}
	f.log.marks[f.id] = append(f.log.marks[f.id], flushMark{bytes: f.n, at: time.Now()})
}

// streamPath is one way a streamed completion reaches its client.
type streamPath struct {
	name string
	// url is the gateway in front of the path, or the simulator itself.
	url string
	// gaps are the times between two token chunks as the client got them,
	// transits the times from the simulator's flush of a token chunk to
	// its arrival, totals the time from the request to the end of each
	// stream.
	gaps, transits, totals []time.Duration
	failed                 int
}

// benchStreams: streamed completions (the simulator pacing its tokens,
// one a chunk) read by a client that notes when each chunk arrives,
// through five paths in the same run, interleaved round by round: straight
// to the simulator; the Go gateway -> mci-epp -> simulator; and the Go
// gateway -> mci-sidecar of cluster-b -> mci-epp of cluster-a's exported
// pool -> simulator, with the response phase skipped, relayed (the
// default: chunks go ahead of the EPP's answers) and intercepted (every
// chunk waits for the EPP, the behaviour before streaming was relayed). For each pace
// and number of concurrent streams: the inter-chunk time (p50, p99) and
// the total stream time.
func benchStreams(b *testing.B, e *env) {
	ctx := context.Background()
	eppArgs := []string{"--endpoints=" + net.JoinHostPort(streamSimIP, "8000"), "--pool-name=" + streamPool,
		"--bind-address=" + streamEPPIP, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090",
		"--base-models=" + dpModel, "--metrics-scrape-interval=50ms", "-v=0"}
	runBinary(b, "mci-epp", eppArgs...)
	e.namespaceEverywhere(b, streamNS)
	_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(streamNS).Create(ctx, pool(streamNS, streamPool, true), metav1.CreateOptions{})
	require.NoError(b, err)
	require.NoError(b, createEPPService(ctx, e.kube["cluster-a"], streamNS, streamPool+"-epp", streamEPPIP, true))
	require.NoError(b, createModelServerPod(ctx, e.kube["cluster-a"], streamNS, streamPool, streamSimIP))
	require.NoError(b, createStreamRoute(ctx, gatewayclient.NewForConfigOrDie(e.cfg["cluster-b"])))
	c, err := e.cs.Cluster("cluster-b")
	require.NoError(b, err)
	for ip, phase := range map[string]string{streamRelayIP: "Relay", streamSkipIP: "Skip", streamInterceptIP: "Intercept"} {
		runBinary(b, "mci-sidecar", "--kubeconfig="+c.Kubeconfig, "--local-cluster-name=cluster-b", "--inference-models=false",
			"--bind-address="+ip, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090", "-v=0",
			"--epp-response-phase="+phase, "--metrics-endpoint-auth=false", "--insecure-remote-endpoint-pickers=*", "--allow-loopback-destinations")
	}
	transport := &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}
	b.Cleanup(transport.CloseIdleConnections)
	// Each gateway is a process of its own (the local ClusterSet's Envoy
	// double, test/cmd/gateway), as Envoy is: in this one its work would
	// stall the client and the simulator of the other paths.
	gateway := func(ip string) string {
		addr := net.JoinHostPort(ip, "8080")
		runBinary(b, "gateway", "--listen="+addr, "--ext-proc="+net.JoinHostPort(ip, "9002"), "--message-timeout=10s")
		return "http://" + addr
	}
	urls := map[string]string{
		"simulator":          "http://" + net.JoinHostPort(streamSimIP, "8000"),
		"gateway -> EPP":     gateway(streamEPPIP),
		"sidecar, Skip":      gateway(streamSkipIP),
		"sidecar, Relay":     gateway(streamRelayIP),
		"sidecar, Intercept": gateway(streamInterceptIP),
	}
	names := []string{"simulator", "gateway -> EPP", "sidecar, Skip", "sidecar, Relay", "sidecar, Intercept"}
	client := &streamClient{http: &http.Client{Transport: transport, Timeout: 5 * time.Minute}, flushes: &flushLog{}}

	for _, pace := range cfg.StreamTokenPaces {
		stopSim := startStreamSimulator(b, pace, client.flushes)
		for _, name := range names {
			require.NoError(b, pollFor(2*time.Minute, func() bool {
				_, err := client.once(ctx, urls[name], 2)
				return err == nil
			}), "%s never streamed", name)
		}
		for _, conc := range cfg.StreamConcurrency {
			paths := make([]*streamPath, len(names))
			for i, name := range names {
				paths[i] = &streamPath{name: name, url: urls[name]}
			}
			for range cfg.StreamRounds {
				for _, p := range paths {
					client.run(ctx, p, conc, cfg.StreamTokens)
				}
			}
			reportStreams(pace, conc, paths)
		}
		stopSim()
	}
}

// createStreamRoute routes cluster-b's streamed completions (those with
// streamHeader) to the import of the streams' pool.
func createStreamRoute(ctx context.Context, gw gatewayclient.Interface) error {
	_, err := gw.GatewayV1().HTTPRoutes(streamNS).Create(ctx, &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "streams", Namespace: streamNS},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "inference-gateway"}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				Matches: []gatewayv1.HTTPRouteMatch{{
					Path:    &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchExact), Value: ptr.To("/v1/completions")},
					Headers: []gatewayv1.HTTPHeaderMatch{{Name: streamHeader, Value: "streams"}},
				}},
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
					Group: ptr.To(gatewayv1.Group(routetable.InferencePoolImportGroup)),
					Kind:  ptr.To(gatewayv1.Kind(routetable.InferencePoolImportKind)),
					Name:  streamPool,
				}}}},
			}},
		},
	}, metav1.CreateOptions{})
	return err
}

// startStreamSimulator serves the model server on streamSimIP, a token
// every pace, one token a chunk, its flushes recorded in flushes, and
// returns what stops it. The simulator's handler is served as it is,
// without Serve's seed 002 metadata address (mci-epp takes an instance
// without one for any model).
func startStreamSimulator(b *testing.B, pace time.Duration, flushes *flushLog) (stop func()) {
	sim, err := simulator.New(simulator.Options{InstanceID: "sim-streams", Model: dpModel, Concurrency: 1024,
		CostModel: &simulator.CostModel{DecodePerToken: pace, StreamChunkTokens: 1}})
	require.NoError(b, err)
	l, err := net.Listen("tcp", net.JoinHostPort(streamSimIP, "8000"))
	require.NoError(b, err)
	srv := &http.Server{Handler: flushes.wrap(sim.Handler()), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
			<-done
		})
	}
	b.Cleanup(stop)
	return stop
}

// streamClient reads streamed completions and notes when each chunk
// arrives.
type streamClient struct {
	http    *http.Client
	flushes *flushLog
	ids     atomic.Int64
}

// streamSample is what one stream measured.
type streamSample struct {
	gaps, transits []time.Duration
	total          time.Duration
}

// run streams conc completions of tokens tokens at once through p and
// notes what they measured.
func (c *streamClient) run(ctx context.Context, p *streamPath, conc, tokens int) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for range conc {
		wg.Go(func() {
			s, err := c.once(ctx, p.url, tokens)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				p.failed++
				return
			}
			p.gaps = append(p.gaps, s.gaps...)
			p.transits = append(p.transits, s.transits...)
			p.totals = append(p.totals, s.total)
		})
	}
	wg.Wait()
}

// once asks url for a streamed completion of tokens tokens and measures
// it: the times between its token chunks as they arrived, each token
// chunk's transit from the simulator's flush, and the time from the
// request to the end of the stream.
func (c *streamClient) once(ctx context.Context, url string, tokens int) (streamSample, error) {
	id := fmt.Sprint(c.ids.Add(1))
	defer c.flushes.forget(id)
	body := fmt.Sprintf(`{"model":%q,"prompt":"Write a haiku about GPUs.","max_tokens":%d,"stream":true}`, dpModel, tokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return streamSample{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(streamHeader, "streams")
	req.Header.Set(streamIDHeader, id)
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return streamSample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return streamSample{}, fmt.Errorf("%s", resp.Status)
	}
	var (
		s      streamSample
		last   time.Time
		events int
		read   int
	)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		read += len(line) + 1
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		now := time.Now()
		if line == "data: [DONE]" {
			if events < tokens {
				return streamSample{}, fmt.Errorf("the stream ended after %d of %d tokens", events, tokens)
			}
			s.total = now.Sub(start)
			return s, nil
		}
		// The token chunks come first; the last chunk carries the usage.
		if events++; events > tokens {
			continue
		}
		if events > 1 {
			s.gaps = append(s.gaps, now.Sub(last))
		}
		last = now
		if at, ok := c.flushes.flushedAt(id, read); ok {
			s.transits = append(s.transits, now.Sub(at))
		}
	}
	if err := sc.Err(); err != nil {
		return streamSample{}, err
	}
	return streamSample{}, fmt.Errorf("the stream ended without [DONE] after %d events", events)
}

// reportStreams adds the figures of one pace and concurrency.
func reportStreams(pace time.Duration, conc int, paths []*streamPath) {
	by := map[string]*streamPath{}
	var all []string
	for _, p := range paths {
		by[p.name] = p
		all = append(all, fmt.Sprintf("%s: gap p50 %.2f / p99 %.2f ms, transit p50 %.2f / p99 %.2f ms, total %.0f ms (%d streams, %d failed)",
			p.name, ms(median(p.gaps)), ms(quantile.Nearest(p.gaps, 99)), ms(median(p.transits)), ms(quantile.Nearest(p.transits, 99)), ms(median(p.totals)), len(p.totals), p.failed))
	}
	sim, relay, skip, intercept := by["simulator"], by["sidecar, Relay"], by["sidecar, Skip"], by["sidecar, Intercept"]
	sec := "streamed responses"
	what := fmt.Sprintf("%v a token, %d concurrent", pace, conc)
	note := fmt.Sprintf("%d tokens a stream, %d rounds, paths interleaved; ", cfg.StreamTokens, cfg.StreamRounds) + strings.Join(all, "; ")
	ok := relay.failed == 0 && len(relay.totals) > 0
	results.compare(sec, "p50 inter-chunk time, response phase relayed, "+what, "ms", ms(median(relay.gaps)),
		"direct to the simulator", ms(median(sim.gaps)), "", false, note)
	// The target is on what a user sees: the time between two
	// chunks. Chunk transit, below, leaves the simulator's timer jitter out
	// and says what each hop adds; it has no target.
	added := quantile.Nearest(relay.gaps, 99) - quantile.Nearest(sim.gaps, 99)
	results.compare(sec, "p99 inter-chunk time, response phase relayed, "+what, "ms", ms(quantile.Nearest(relay.gaps, 99)),
		"direct to the simulator", ms(quantile.Nearest(sim.gaps, 99)), "relayed adds < 1 ms at p99", added < time.Millisecond && ok,
		fmt.Sprintf("added p99 %.3f ms; ", ms(added))+note)
	results.compare(sec, "p99 chunk transit (simulator flush to client), response phase relayed, "+what, "ms", ms(quantile.Nearest(relay.transits, 99)),
		"direct to the simulator", ms(quantile.Nearest(sim.transits, 99)), "", false,
		fmt.Sprintf("added p99 %.3f ms; ", ms(quantile.Nearest(relay.transits, 99)-quantile.Nearest(sim.transits, 99)))+note)
	results.compare(sec, "p99 chunk transit, response phase relayed, against the gateway talking to the EPP itself, "+what, "ms", ms(quantile.Nearest(relay.transits, 99)),
		"gateway -> EPP -> simulator", ms(quantile.Nearest(by["gateway -> EPP"].transits, 99)), "", false,
		fmt.Sprintf("what mci adds to a gateway's own ext_proc round trip per chunk: %.3f ms at p99; ", ms(quantile.Nearest(relay.transits, 99)-quantile.Nearest(by["gateway -> EPP"].transits, 99)))+note)
	results.compare(sec, "p99 chunk transit, body intercepted (every chunk waits for the EPP, before streaming was relayed), "+what, "ms", ms(quantile.Nearest(intercept.transits, 99)),
		"direct to the simulator", ms(quantile.Nearest(sim.transits, 99)), "", false, note)
	ratio := ms(median(relay.totals)) / ms(median(skip.totals))
	results.compare(sec, "median total stream time, response phase relayed, "+what, "ms", ms(median(relay.totals)),
		"response phase skipped", ms(median(skip.totals)), "relayed within 5% of Skip", ratio <= 1.05 && ok, note)
	results.compare(sec, "median total stream time, body intercepted (before streaming was relayed), "+what, "ms", ms(median(intercept.totals)),
		"response phase skipped", ms(median(skip.totals)), "", false, note)
}
