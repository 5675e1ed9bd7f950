package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/test/envoyclient"
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
)

// streamPath is one way a streamed completion reaches its client.
type streamPath struct {
	name string
	// url is the gateway in front of the path, or the simulator itself.
	url string
	// gaps are the times between two token chunks as the client got them,
	// totals the time from the request to the end of each stream.
	gaps, totals []time.Duration
	failed       int
}

// benchStreams: streamed completions (the simulator pacing its tokens,
// one a chunk) read by a client that notes when each chunk arrives,
// through five paths in the same run, interleaved round by round: straight
// to the simulator; the Go gateway -> mci-epp -> simulator; and the Go
// gateway -> mci-sidecar of cluster-b -> mci-epp of cluster-a's exported
// pool -> simulator, with the response phase skipped, relayed (the
// default: chunks go ahead of the EPP's answers) and intercepted (every
// chunk waits for the EPP, the behaviour before issue 24). For each pace
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
	require.NoError(b, createStreamRoute(ctx, gatewayclient.NewForConfigOrDie(e.cfg["cluster-b"])))
	c, err := e.cs.Cluster("cluster-b")
	require.NoError(b, err)
	for ip, phase := range map[string]string{streamRelayIP: "Relay", streamSkipIP: "Skip", streamInterceptIP: "Intercept"} {
		runBinary(b, "mci-sidecar", "--kubeconfig="+c.Kubeconfig, "--local-cluster-name=cluster-b", "--inference-models=false",
			"--bind-address="+ip, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090", "-v=0",
			"--epp-response-phase="+phase)
	}
	transport := &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}
	b.Cleanup(transport.CloseIdleConnections)
	gateway := func(ip string) string {
		client, err := envoyclient.Dial(net.JoinHostPort(ip, "9002"), envoyclient.Options{MessageTimeout: 10 * time.Second})
		require.NoError(b, err)
		b.Cleanup(func() { _ = client.Close() })
		srv := httptest.NewServer(envoyclient.NewProxy(client, transport))
		b.Cleanup(srv.Close)
		return srv.URL
	}
	urls := map[string]string{
		"simulator":          "http://" + net.JoinHostPort(streamSimIP, "8000"),
		"gateway -> EPP":     gateway(streamEPPIP),
		"sidecar, Skip":      gateway(streamSkipIP),
		"sidecar, Relay":     gateway(streamRelayIP),
		"sidecar, Intercept": gateway(streamInterceptIP),
	}
	names := []string{"simulator", "gateway -> EPP", "sidecar, Skip", "sidecar, Relay", "sidecar, Intercept"}
	client := &http.Client{Transport: transport, Timeout: 5 * time.Minute}

	for _, pace := range cfg.StreamTokenPaces {
		stopSim := startStreamSimulator(b, pace)
		for _, name := range names {
			require.NoError(b, pollFor(2*time.Minute, func() bool {
				_, _, err := streamOnce(ctx, client, urls[name], 2)
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
					p.run(ctx, client, conc, cfg.StreamTokens)
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
// every pace, one token a chunk, and returns what stops it.
func startStreamSimulator(b *testing.B, pace time.Duration) (stop func()) {
	sim, err := simulator.New(simulator.Options{InstanceID: "sim-streams", Model: dpModel, Concurrency: 1024,
		CostModel: &simulator.CostModel{DecodePerToken: pace, StreamChunkTokens: 1}})
	require.NoError(b, err)
	l, err := net.Listen("tcp", net.JoinHostPort(streamSimIP, "8000"))
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Serve(ctx, l) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	b.Cleanup(stop)
	return stop
}

// run streams conc completions of tokens tokens at once and notes their
// gaps and total times.
func (p *streamPath) run(ctx context.Context, client *http.Client, conc, tokens int) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for range conc {
		wg.Go(func() {
			gaps, total, err := streamOnce(ctx, client, p.url, tokens)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				p.failed++
				return
			}
			p.gaps = append(p.gaps, gaps...)
			p.totals = append(p.totals, total)
		})
	}
	wg.Wait()
}

// streamOnce asks url for a streamed completion of tokens tokens and
// returns the times between its token chunks as they arrived and the time
// from the request to the end of the stream.
func streamOnce(ctx context.Context, client *http.Client, url string, tokens int) (gaps []time.Duration, total time.Duration, err error) {
	body := fmt.Sprintf(`{"model":%q,"prompt":"Write a haiku about GPUs.","max_tokens":%d,"stream":true}`, dpModel, tokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(streamHeader, "streams")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("%s", resp.Status)
	}
	var last time.Time
	events := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		now := time.Now()
		if line == "data: [DONE]" {
			if events < tokens {
				return nil, 0, fmt.Errorf("the stream ended after %d of %d tokens", events, tokens)
			}
			return gaps, now.Sub(start), nil
		}
		// The token chunks come first; the last chunk carries the usage.
		if events++; events > tokens {
			continue
		}
		if events > 1 {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
	}
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	return nil, 0, fmt.Errorf("the stream ended without [DONE] after %d events", events)
}

// reportStreams adds the figures of one pace and concurrency.
func reportStreams(pace time.Duration, conc int, paths []*streamPath) {
	by := map[string]*streamPath{}
	var all []string
	for _, p := range paths {
		by[p.name] = p
		all = append(all, fmt.Sprintf("%s p50 %.2f / p99 %.2f ms gap, total %.0f ms (%d streams, %d failed)",
			p.name, ms(median(p.gaps)), ms(percentile(p.gaps, 99)), ms(median(p.totals)), len(p.totals), p.failed))
	}
	sim, relay, skip, intercept := by["simulator"], by["sidecar, Relay"], by["sidecar, Skip"], by["sidecar, Intercept"]
	sec := "streamed responses"
	what := fmt.Sprintf("%v a token, %d concurrent", pace, conc)
	note := fmt.Sprintf("%d tokens a stream, %d rounds, paths interleaved; ", cfg.StreamTokens, cfg.StreamRounds) + strings.Join(all, "; ")
	added := percentile(relay.gaps, 99) - percentile(sim.gaps, 99)
	results.compare(sec, "p50 inter-chunk time, sidecar relaying the response phase, "+what, "ms", ms(median(relay.gaps)),
		"direct to the simulator", ms(median(sim.gaps)), "", false, note)
	results.compare(sec, "p99 inter-chunk time, sidecar relaying the response phase, "+what, "ms", ms(percentile(relay.gaps, 99)),
		"direct to the simulator", ms(percentile(sim.gaps, 99)), "relayed adds < 1 ms at p99", added < time.Millisecond && relay.failed == 0,
		fmt.Sprintf("added p99 %.3f ms; ", ms(added))+note)
	results.compare(sec, "p99 inter-chunk time, sidecar intercepting the body (before issue 24), "+what, "ms", ms(percentile(intercept.gaps, 99)),
		"direct to the simulator", ms(percentile(sim.gaps, 99)), "", false, note)
	ratio := ms(median(relay.totals)) / ms(median(skip.totals))
	results.compare(sec, "median total stream time, response phase relayed, "+what, "ms", ms(median(relay.totals)),
		"response phase skipped", ms(median(skip.totals)), "relayed within 5% of Skip", ratio <= 1.05 && relay.failed == 0, note)
	results.compare(sec, "median total stream time, body intercepted (before issue 24), "+what, "ms", ms(median(intercept.totals)),
		"response phase skipped", ms(median(skip.totals)), "", false, note)
}
