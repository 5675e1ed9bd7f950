package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/quantile"
	"github.com/mci-dev/mci/test/simulator"
)

// The data path's loopback "pods": the model server and mci-epp of
// cluster-a, and cluster-b's mci-sidecar, with the response phase relayed
// to the EPP (the default) and skipped (answered by the sidecar, the
// behaviour before it was relayed).
const (
	simIP         = "127.0.201.1"
	eppIP         = "127.0.201.100"
	sidecarIP     = "127.0.202.1"
	skipSidecarIP = "127.0.202.2"
	dpNS          = "datapath"
	dpPool        = "dp"
	dpModel       = "base"
)

// binaryPath is a binary of localclusterset.BinDir.
func binaryPath(b *testing.B, name string) string {
	b.Helper()
	path, err := localclusterset.Binary(name)
	require.NoError(b, err)
	return path
}

// runBinary starts a binary of _output/bin until the benchmark ends and
// returns its pid; it is killed with this process if that dies first. stop
// ends it earlier (and waits for it); calling it again does nothing.
func runBinary(b *testing.B, name string, args ...string) (pid int, stop func()) {
	b.Helper()
	logPath := filepath.Join(b.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	require.NoError(b, err)
	cmd := exec.Command(binaryPath(b, name), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(b, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(exited)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}
	b.Cleanup(func() {
		stop()
		if b.Failed() {
			out, _ := os.ReadFile(logPath)
			b.Logf("%s (pid %d) output:\n%s", name, cmd.Process.Pid, out)
		}
	})
	return cmd.Process.Pid, stop
}

// processCPU is the CPU time (user and system) process pid has used so
// far, from /proc (clock ticks of 10ms).
func processCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(b, err)
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	require.Greater(b, len(fields), 12, "/proc/%d/stat", pid)
	var ticks uint64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseUint(f, 10, 64)
		require.NoError(b, err)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// benchDataPath: a request through the Go gateway (test/envoyclient's Proxy,
// which does what Envoy does with ext_proc, the response phase included)
// -> mci-sidecar of cluster-b -> mci-epp of cluster-a's exported pool ->
// the model server simulator, against the same gateway -> mci-epp ->
// simulator, and against a second mci-sidecar with
// --epp-response-phase=Skip (the EPP's stream ends with the request phase
// and the sidecar answers the response phase: the behaviour before it was
// relayed), in the same run. Latency at a fixed rate (open loop, the paths
// alternating request by request); throughput with a fixed number of
// clients (closed loop, the paths alternating in slices); then latency at
// 80% of the direct path's throughput, the direct path and the relaying
// sidecar's alternating in slices (one path at a time, as the throughput
// was measured). Over both open loops, each sidecar's CPU time and
// allocations per request.
func benchDataPath(b *testing.B, e *env) {
	ctx := context.Background()
	sim, err := simulator.New(simulator.Options{InstanceID: "sim-0", Model: dpModel, Latency: -1, Concurrency: 1024})
	require.NoError(b, err)
	l, err := net.Listen("tcp", net.JoinHostPort(simIP, "8000"))
	require.NoError(b, err)
	simCtx, stopSim := context.WithCancel(ctx)
	simDone := make(chan error, 1)
	go func() { simDone <- sim.Serve(simCtx, l) }()
	b.Cleanup(func() {
		stopSim()
		<-simDone
	})
	eppArgs := []string{"--endpoints=" + net.JoinHostPort(simIP, "8000"), "--pool-name=" + dpPool,
		"--bind-address=" + eppIP, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090",
		"--base-models=" + dpModel, "--metrics-scrape-interval=50ms", "-v=0"}
	_, stopEPP := runBinary(b, "mci-epp", eppArgs...)

	// cluster-a exports the pool with its EPP; cluster-b routes to its import.
	e.namespaceEverywhere(b, dpNS)
	_, err = e.mci["cluster-a"].InferencePoolV1().InferencePools(dpNS).Create(ctx, pool(dpNS, dpPool, true), metav1.CreateOptions{})
	require.NoError(b, err)
	require.NoError(b, createEPPService(ctx, e.kube["cluster-a"], dpNS, dpPool+"-epp", eppIP, true))
	require.NoError(b, createModelServerPod(ctx, e.kube["cluster-a"], dpNS, dpPool, simIP))
	gw := gatewayclient.NewForConfigOrDie(e.cfg["cluster-b"])
	_, err = gw.GatewayV1().HTTPRoutes(dpNS).Create(ctx, &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "completions", Namespace: dpNS, Annotations: map[string]string{routetable.PolicyAnnotation: routingpolicy.Weighted}},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "inference-gateway"}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/v1/completions")}}},
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
					Group: ptr.To(gatewayv1.Group(routetable.InferencePoolImportGroup)),
					Kind:  ptr.To(gatewayv1.Kind(routetable.InferencePoolImportKind)),
					Name:  dpPool,
				}}}},
			}},
		},
	}, metav1.CreateOptions{})
	require.NoError(b, err)
	c, err := e.cs.Cluster("cluster-b")
	require.NoError(b, err)
	sidecarPID, _ := runBinary(b, "mci-sidecar", "--kubeconfig="+c.Kubeconfig, "--local-cluster-name=cluster-b", "--inference-models=false",
		"--bind-address="+sidecarIP, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090", "-v=0", "--metrics-endpoint-auth=false", "--insecure-remote-endpoint-pickers=*", "--allow-loopback-destinations", "--enable-pprof")
	skipPID, _ := runBinary(b, "mci-sidecar", "--kubeconfig="+c.Kubeconfig, "--local-cluster-name=cluster-b", "--inference-models=false",
		"--bind-address="+skipSidecarIP, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090", "-v=0", "--metrics-endpoint-auth=false", "--insecure-remote-endpoint-pickers=*",
		"--epp-response-phase=Skip", "--allow-loopback-destinations")

	dial := func(ip string) *envoyclient.Client {
		client, err := envoyclient.Dial(net.JoinHostPort(ip, "9002"), envoyclient.Options{MessageTimeout: 10 * time.Second})
		require.NoError(b, err)
		b.Cleanup(func() { _ = client.Close() })
		return client
	}
	relay := envoyclient.StartChild(b, roleNullRelay, nullRelayUpstreamEnv+"="+net.JoinHostPort(eppIP, "9002"))
	paths := []*dataPath{
		{name: "direct", client: dial(eppIP)},
		{name: "sidecar", client: dial(sidecarIP), pid: sidecarPID, metrics: metricsURL(sidecarIP)},
		{name: "sidecar, response phase skipped", client: dial(skipSidecarIP), pid: skipPID, metrics: metricsURL(skipSidecarIP)},
		{name: "null relay", client: dial(nullRelayIP), pid: relay.PID(), metrics: metricsURL(nullRelayIP)},
	}
	transport := &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}
	b.Cleanup(transport.CloseIdleConnections)
	for _, p := range paths {
		p.gateway = httptest.NewServer(envoyclient.NewProxy(p.client, transport))
		b.Cleanup(p.gateway.Close)
		p.http = &http.Client{Transport: transport, Timeout: 30 * time.Second}
	}
	// Both paths answer before anything is measured: the EPP has scraped
	// the simulator and the sidecar has its routing table.
	for _, p := range paths {
		require.NoError(b, pollFor(2*time.Minute, func() bool { return p.send(ctx) == nil }), "%s path never answered: %v", p.name, p.send(ctx))
		for range 100 { // warm connections
			_ = p.send(ctx)
		}
	}

	for _, p := range paths {
		p.measureScrape(b, ctx)
	}
	measurePathsIdle(b, paths)
	measure(b, ctx, paths, (*dataPath).paced, func() { openLoop(ctx, paths, (*dataPath).paced, cfg.DataPathRate, cfg.DataPathDuration) })
	closedLoop(ctx, paths, cfg.DataPathConcurrency, cfg.DataPathDuration)
	direct, viaSidecar, skipped, viaRelay := paths[0], paths[1], paths[2], paths[3]
	// 80% of the direct path's saturation, one path at a time: offered to
	// all paths at once, it would be more than the machine serves.
	loadedRate := int(0.8 * medianFloat(direct.rates))
	require.Positive(b, loadedRate, "the direct path's throughput")
	loaded := []*dataPath{direct, viaSidecar, viaRelay}
	loadedSlices := 2 * len(loaded)
	slice := (3 * cfg.DataPathDuration / time.Duration(loadedSlices)).Round(time.Millisecond)
	for i := range loadedSlices {
		p := loaded[i%len(loaded)]
		measure(b, ctx, []*dataPath{p}, (*dataPath).loaded, func() {
			openLoop(ctx, []*dataPath{p}, (*dataPath).loaded, loadedRate, slice)
		})
	}

	const sec = "data path"
	note := fmt.Sprintf("%d req/s per path for %s, interleaved; failures: direct %d, sidecar %d, sidecar with the response phase skipped %d, null relay %d",
		cfg.DataPathRate, cfg.DataPathDuration, direct.pacedPoint.failed.Load(), viaSidecar.pacedPoint.failed.Load(), skipped.pacedPoint.failed.Load(), viaRelay.pacedPoint.failed.Load())
	addedP99 := quantile.Nearest(viaSidecar.pacedPoint.lat, 99) - quantile.Nearest(direct.pacedPoint.lat, 99)
	results.compare(sec, "p50 latency, gateway -> sidecar -> EPP -> simulator", "ms", ms(median(viaSidecar.pacedPoint.lat)), "gateway -> EPP -> simulator", ms(median(direct.pacedPoint.lat)), "", false, note)
	results.compare(sec, "p99 latency, gateway -> sidecar -> EPP -> simulator", "ms", ms(quantile.Nearest(viaSidecar.pacedPoint.lat, 99)), "gateway -> EPP -> simulator", ms(quantile.Nearest(direct.pacedPoint.lat, 99)),
		"sidecar adds < 1 ms at p99", addedP99 < time.Millisecond, fmt.Sprintf("added p99 %.3f ms; ", ms(addedP99))+note)
	results.compare(sec, "throughput through the sidecar", "req/s", medianFloat(viaSidecar.rates), "direct to the EPP", medianFloat(direct.rates), "", false,
		fmt.Sprintf("%d concurrent clients, median of %d interleaved slices", cfg.DataPathConcurrency, len(direct.rates)))

	// The floor of any extra hop, in the same run: a relay that decides
	// nothing.
	relayNote := "a process that pipes each stream to the EPP and back and decides nothing, served and connected with gRPC's codec as mci-sidecar serves and connects; " + note
	results.compare(sec, "throughput through the sidecar, against a null relay", "req/s", medianFloat(viaSidecar.rates), "through the null relay", medianFloat(viaRelay.rates), "", false,
		fmt.Sprintf("%d concurrent clients, median of %d interleaved slices; the null relay %.2fx the direct path's", cfg.DataPathConcurrency, len(viaRelay.rates), medianFloat(viaRelay.rates)/medianFloat(direct.rates)))
	results.compare(sec, "p50 latency through the sidecar, against a null relay", "ms", ms(median(viaSidecar.pacedPoint.lat)), "through the null relay", ms(median(viaRelay.pacedPoint.lat)), "", false, relayNote)
	results.compare(sec, "p99 latency through the sidecar, against a null relay", "ms", ms(quantile.Nearest(viaSidecar.pacedPoint.lat, 99)), "through the null relay", ms(quantile.Nearest(viaRelay.pacedPoint.lat, 99)), "", false, relayNote)
	results.compare(sec, "sidecar CPU per request, against a null relay", "µs", viaSidecar.pacedPoint.cpuPerRequest(), "the null relay's", viaRelay.pacedPoint.cpuPerRequest(), "", false,
		fmt.Sprintf("%d req/s per path, response phase relayed; idle, each used %.1f and %.1f ms of CPU a second, %.0f and %.0f µs a request at this rate; at 80%% of the direct path's saturation %.0f against %.0f µs",
			cfg.DataPathRate, viaSidecar.idle.Seconds()*1e3, viaRelay.idle.Seconds()*1e3, viaSidecar.idle.Seconds()*1e6/float64(cfg.DataPathRate), viaRelay.idle.Seconds()*1e6/float64(cfg.DataPathRate),
			viaSidecar.loadedPoint.cpuPerRequest(), viaRelay.loadedPoint.cpuPerRequest()))

	// What relaying the response phase to the EPP costs, against the
	// sidecar answering it itself, in the same run.
	skipNote := "the same sidecar with --epp-response-phase=Skip (EPP stream ends with the request phase; the behaviour before the response phase was relayed); " + note
	results.compare(sec, "p50 latency, response phase relayed to the EPP", "ms", ms(median(viaSidecar.pacedPoint.lat)), "response phase answered by the sidecar", ms(median(skipped.pacedPoint.lat)), "", false, skipNote)
	results.compare(sec, "p99 latency, response phase relayed to the EPP", "ms", ms(quantile.Nearest(viaSidecar.pacedPoint.lat, 99)), "response phase answered by the sidecar", ms(quantile.Nearest(skipped.pacedPoint.lat, 99)), "", false,
		fmt.Sprintf("added p99 %.3f ms; ", ms(quantile.Nearest(viaSidecar.pacedPoint.lat, 99)-quantile.Nearest(skipped.pacedPoint.lat, 99)))+skipNote)
	results.compare(sec, "sidecar CPU per request, response phase relayed to the EPP", "µs", viaSidecar.pacedPoint.cpuPerRequest(), "response phase answered by the sidecar", skipped.pacedPoint.cpuPerRequest(), "", false,
		fmt.Sprintf("%d req/s per path: user+system CPU of each mci-sidecar process over the open loop (/proc, 10 ms ticks) / requests it completed (%d, %d); added %.0f µs per request",
			cfg.DataPathRate, len(viaSidecar.pacedPoint.lat), len(skipped.pacedPoint.lat), viaSidecar.pacedPoint.cpuPerRequest()-skipped.pacedPoint.cpuPerRequest()))
	results.compare(sec, "sidecar allocations per request, response phase relayed to the EPP", "allocs", viaSidecar.pacedPoint.allocsPerRequest(), "response phase answered by the sidecar", skipped.pacedPoint.allocsPerRequest(), "", false,
		fmt.Sprintf("%d req/s per path: go_memstats_mallocs_total of each mci-sidecar's /metrics over the open loop, less what one scrape allocates (%.0f, %.0f), / requests it completed",
			cfg.DataPathRate, viaSidecar.scrapeAllocs, skipped.scrapeAllocs))

	// At 80% of the direct path's saturation.
	loadedNote := fmt.Sprintf("%d req/s (80%% of the direct path's %.0f), open loop, %d slices of %s taken in turn by the direct path, the sidecar and the null relay (p99 %.3f ms); failures: direct %d, sidecar %d, null relay %d",
		loadedRate, medianFloat(direct.rates), loadedSlices, slice, ms(quantile.Nearest(viaRelay.loadedPoint.lat, 99)), direct.loadedPoint.failed.Load(), viaSidecar.loadedPoint.failed.Load(), viaRelay.loadedPoint.failed.Load())
	loadedP99, directLoadedP99 := quantile.Nearest(viaSidecar.loadedPoint.lat, 99), quantile.Nearest(direct.loadedPoint.lat, 99)
	results.compare(sec, "p50 latency at 80% of the direct path's saturation, through the sidecar", "ms", ms(median(viaSidecar.loadedPoint.lat)), "gateway -> EPP -> simulator", ms(median(direct.loadedPoint.lat)), "", false, loadedNote)
	results.compare(sec, "p99 latency at 80% of the direct path's saturation, through the sidecar", "ms", ms(loadedP99), "gateway -> EPP -> simulator", ms(directLoadedP99),
		"at most 1.1x direct", directLoadedP99 > 0 && float64(loadedP99) <= 1.1*float64(directLoadedP99), loadedNote)
	results.compare(sec, "sidecar CPU per request at 80% of the direct path's saturation", "µs", viaSidecar.loadedPoint.cpuPerRequest(), fmt.Sprintf("at %d req/s", cfg.DataPathRate), viaSidecar.pacedPoint.cpuPerRequest(), "", false,
		fmt.Sprintf("response phase relayed; CPU over the sidecar's slices / requests it completed (%d); ", len(viaSidecar.loadedPoint.lat))+loadedNote)
	results.compare(sec, "sidecar allocations per request at 80% of the direct path's saturation", "allocs", viaSidecar.loadedPoint.allocsPerRequest(), fmt.Sprintf("at %d req/s", cfg.DataPathRate), viaSidecar.pacedPoint.allocsPerRequest(), "", false,
		"response phase relayed; go_memstats_mallocs_total over the sidecar's slices, less one scrape's allocations per slice, / requests it completed; "+loadedNote)

	// The rows must hold figures, whatever they are: a sidecar that
	// answered requests spent CPU and allocated on them.
	for _, f := range []struct {
		name  string
		value float64
	}{
		{"CPU per request at the fixed rate, relayed", viaSidecar.pacedPoint.cpuPerRequest()},
		{"CPU per request at the fixed rate, skipped", skipped.pacedPoint.cpuPerRequest()},
		{"allocations per request at the fixed rate, relayed", viaSidecar.pacedPoint.allocsPerRequest()},
		{"allocations per request at the fixed rate, skipped", skipped.pacedPoint.allocsPerRequest()},
		{"CPU per request at 80% of saturation", viaSidecar.loadedPoint.cpuPerRequest()},
		{"allocations per request at 80% of saturation", viaSidecar.loadedPoint.allocsPerRequest()},
		{"CPU per request at the fixed rate, the null relay", viaRelay.pacedPoint.cpuPerRequest()},
	} {
		require.Positive(b, f.value, "the sidecar's %s", f.name)
	}

	// Recovery under HealthBased, where the health prober decides whether
	// the cluster is tried at all.
	healthBased := func() {
		// The sidecar has the policy once it rebuilt its table after the
		// change (the policy is part of the table).
		generation := func() float64 {
			m, err := promtext.Get(ctx, "http://"+net.JoinHostPort(sidecarIP, "9090")+"/metrics")
			require.NoError(b, err)
			return m.Value(b, "mci_sidecar_routing_table_generation")
		}
		before := generation()
		r, err := gw.GatewayV1().HTTPRoutes(dpNS).Get(ctx, "completions", metav1.GetOptions{})
		require.NoError(b, err)
		r.Annotations[routetable.PolicyAnnotation] = routingpolicy.HealthBased
		_, err = gw.GatewayV1().HTTPRoutes(dpNS).Update(ctx, r, metav1.UpdateOptions{})
		require.NoError(b, err)
		require.NoError(b, pollEvery(20*time.Millisecond, 10*time.Second, func() bool { return generation() > before }), "mci-sidecar never rebuilt its table with HealthBased")
	}
	benchEPPRecovery(b, viaSidecar, healthBased, stopEPP, func() { runBinary(b, "mci-epp", eppArgs...) })
}

// dataPath is one way to the model server: a gateway in front of an
// ext_proc server.
type dataPath struct {
	name    string
	client  *envoyclient.Client
	gateway *httptest.Server
	http    *http.Client
	// pid and metrics are the path's sidecar process and its /metrics (0
	// and "": none); scrapeAllocs is what one scrape of metrics allocates
	// in it, taken off each measured window.
	pid          int
	metrics      string
	scrapeAllocs float64
	// idle is the CPU time its process uses a second with no request to
	// serve (probes, scrapes, the runtime): what a CPU figure per request
	// at a low rate holds besides the requests' own.
	idle time.Duration

	// pacedPoint is the open loop at cfg.DataPathRate, loadedPoint the one
	// at 80% of the direct path's saturation.
	pacedPoint, loadedPoint loadPoint
	rates                   []float64
	failed                  atomic.Int64
}

func (p *dataPath) paced() *loadPoint  { return &p.pacedPoint }
func (p *dataPath) loaded() *loadPoint { return &p.loadedPoint }

// loadPoint is what one open loop measured on a path: the latencies of the
// requests that succeeded, the failures, and the sidecar's CPU time and
// allocations over the loop's windows.
type loadPoint struct {
	mu      sync.Mutex
	lat     []time.Duration
	failed  atomic.Int64
	cpu     time.Duration
	mallocs float64
}

// cpuPerRequest is the sidecar's CPU time per completed request, in µs.
func (l *loadPoint) cpuPerRequest() float64 {
	if len(l.lat) == 0 {
		return 0
	}
	return float64(l.cpu.Microseconds()) / float64(len(l.lat))
}

// allocsPerRequest is the sidecar's heap allocations per completed request.
func (l *loadPoint) allocsPerRequest() float64 {
	if len(l.lat) == 0 {
		return 0
	}
	return l.mallocs / float64(len(l.lat))
}

func metricsURL(ip string) string { return "http://" + net.JoinHostPort(ip, "9090") + "/metrics" }

// mallocs is the heap allocations (objects) the path's sidecar has made so
// far, from the Go runtime's metrics on its /metrics.
func (p *dataPath) mallocs(b *testing.B, ctx context.Context) float64 {
	b.Helper()
	m, err := promtext.Get(ctx, p.metrics)
	require.NoError(b, err)
	v, ok, err := m.Lookup("go_memstats_mallocs_total")
	require.NoError(b, err)
	require.True(b, ok, "%s has no go_memstats_mallocs_total", p.metrics)
	return v
}

// measureScrape sets scrapeAllocs: a scrape's allocations land between
// the counter's reading and the next's, so a window bounded by two scrapes
// holds one scrape's worth. Two scrapes in a row with nothing else going
// on count one; the least of three pairs leaves out background work.
func (p *dataPath) measureScrape(b *testing.B, ctx context.Context) {
	if p.pid == 0 {
		return
	}
	least := math.Inf(1)
	for range 3 {
		first := p.mallocs(b, ctx)
		least = min(least, p.mallocs(b, ctx)-first)
	}
	p.scrapeAllocs = least
}

// measurePathsIdle sets each path process's idle CPU a second, over a few
// seconds in which no request is sent.
func measurePathsIdle(b *testing.B, paths []*dataPath) {
	const window = 3 * time.Second
	before := map[*dataPath]time.Duration{}
	for _, p := range paths {
		if p.pid != 0 {
			before[p] = processCPU(b, p.pid)
		}
	}
	time.Sleep(window)
	for p, was := range before {
		p.idle = time.Duration(float64(processCPU(b, p.pid)-was) / window.Seconds())
	}
}

// measure runs run and adds what each path's sidecar spent over it, CPU
// time and allocations, to the path's point.
func measure(b *testing.B, ctx context.Context, paths []*dataPath, point func(*dataPath) *loadPoint, run func()) {
	b.Helper()
	type usage struct {
		cpu     time.Duration
		mallocs float64
	}
	read := func(p *dataPath) usage { return usage{processCPU(b, p.pid), p.mallocs(b, ctx)} }
	before := map[*dataPath]usage{}
	for _, p := range paths {
		if p.pid != 0 {
			before[p] = read(p)
		}
	}
	run()
	for p, was := range before {
		now := read(p)
		pt := point(p)
		pt.cpu += now.cpu - was.cpu
		pt.mallocs += now.mallocs - was.mallocs - p.scrapeAllocs
	}
}

var completionBody = `{"model":"` + dpModel + `","prompt":"Write a haiku about GPUs.","max_tokens":8}`

func (p *dataPath) send(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.gateway.URL+"/v1/completions", strings.NewReader(completionBody))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	if !strings.Contains(string(body), "sim-0") {
		return errors.New("the answer is not the simulator's")
	}
	return nil
}

// openLoop sends rate requests per second to each path, alternating, for
// duration, and records each latency from the moment it was due in the
// path's point.
func openLoop(ctx context.Context, paths []*dataPath, point func(*dataPath) *loadPoint, rate int, duration time.Duration) {
	interval := time.Second / time.Duration(max(rate*len(paths), 1))
	total := int(duration / interval)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range total {
		due := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(due)) // the open loop's pace
		path := paths[i%len(paths)]
		p := point(path)
		wg.Go(func() {
			err := path.send(ctx)
			d := time.Since(due)
			if err != nil {
				p.failed.Add(1)
				return
			}
			p.mu.Lock()
			p.lat = append(p.lat, d)
			p.mu.Unlock()
		})
	}
	wg.Wait()
}

// closedLoop keeps clients requests in flight on one path at a time,
// switching path every slice (an eighth of duration), three slices a path,
// and records the rate of each slice.
func closedLoop(ctx context.Context, paths []*dataPath, clients int, duration time.Duration) {
	slices := 3 * len(paths)
	slice := duration / 8
	for i := range slices {
		p := paths[i%len(paths)]
		var done atomic.Int64
		end := time.Now().Add(slice)
		start := time.Now()
		var wg sync.WaitGroup
		for range max(clients, 1) {
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := p.send(ctx); err != nil {
						p.failed.Add(1)
						continue
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		p.rates = append(p.rates, float64(done.Load())/time.Since(start).Seconds())
	}
}
