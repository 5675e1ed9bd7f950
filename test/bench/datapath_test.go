package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
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
// alternating request by request), the sidecars' CPU time per request
// over it, and throughput with a fixed number of clients (closed loop, the
// paths alternating in slices).
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
	gw := gatewayclient.NewForConfigOrDie(e.cfg["cluster-b"])
	_, err = gw.GatewayV1().HTTPRoutes(dpNS).Create(ctx, &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "completions", Namespace: dpNS, Annotations: map[string]string{routetable.PolicyAnnotation: string(routetable.PolicyWeighted)}},
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
		"--bind-address="+sidecarIP, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090", "-v=0", "--metrics-endpoint-auth=false", "--insecure-remote-endpoint-pickers=*", "--allow-loopback-destinations")
	skipPID, _ := runBinary(b, "mci-sidecar", "--kubeconfig="+c.Kubeconfig, "--local-cluster-name=cluster-b", "--inference-models=false",
		"--bind-address="+skipSidecarIP, "--grpc-port=9002", "--grpc-health-port=9003", "--metrics-port=9090", "-v=0", "--metrics-endpoint-auth=false", "--insecure-remote-endpoint-pickers=*",
		"--epp-response-phase=Skip", "--allow-loopback-destinations")

	dial := func(ip string) *envoyclient.Client {
		client, err := envoyclient.Dial(net.JoinHostPort(ip, "9002"), envoyclient.Options{MessageTimeout: 10 * time.Second})
		require.NoError(b, err)
		b.Cleanup(func() { _ = client.Close() })
		return client
	}
	paths := []*dataPath{
		{name: "direct", client: dial(eppIP)},
		{name: "sidecar", client: dial(sidecarIP), pid: sidecarPID},
		{name: "sidecar, response phase skipped", client: dial(skipSidecarIP), pid: skipPID},
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
		if p.pid != 0 {
			p.cpu = processCPU(b, p.pid)
		}
		p.sent.Store(0)
	}
	openLoop(ctx, paths, cfg.DataPathRate, cfg.DataPathDuration)
	for _, p := range paths {
		if p.pid != 0 {
			p.cpu = processCPU(b, p.pid) - p.cpu
		}
		p.openSent = p.sent.Load()
	}
	closedLoop(ctx, paths, cfg.DataPathConcurrency, cfg.DataPathDuration)

	direct, viaSidecar, skipped := paths[0], paths[1], paths[2]
	const sec = "data path"
	note := fmt.Sprintf("%d req/s per path for %s, interleaved; failures: direct %d, sidecar %d, sidecar with the response phase skipped %d",
		cfg.DataPathRate, cfg.DataPathDuration, direct.failed.Load(), viaSidecar.failed.Load(), skipped.failed.Load())
	addedP99 := percentile(viaSidecar.lat, 99) - percentile(direct.lat, 99)
	results.compare(sec, "p50 latency, gateway -> sidecar -> EPP -> simulator", "ms", ms(median(viaSidecar.lat)), "gateway -> EPP -> simulator", ms(median(direct.lat)), "", false, note)
	results.compare(sec, "p99 latency, gateway -> sidecar -> EPP -> simulator", "ms", ms(percentile(viaSidecar.lat, 99)), "gateway -> EPP -> simulator", ms(percentile(direct.lat, 99)),
		"sidecar adds < 1 ms at p99", addedP99 < time.Millisecond, fmt.Sprintf("added p99 %.3f ms; ", ms(addedP99))+note)
	results.compare(sec, "throughput through the sidecar", "req/s", medianFloat(viaSidecar.rates), "direct to the EPP", medianFloat(direct.rates), "", false,
		fmt.Sprintf("%d concurrent clients, median of %d interleaved slices", cfg.DataPathConcurrency, len(direct.rates)))

	// What relaying the response phase to the EPP costs, against the
	// sidecar answering it itself, in the same run.
	skipNote := "the same sidecar with --epp-response-phase=Skip (EPP stream ends with the request phase; the behaviour before the response phase was relayed); " + note
	results.compare(sec, "p50 latency, response phase relayed to the EPP", "ms", ms(median(viaSidecar.lat)), "response phase answered by the sidecar", ms(median(skipped.lat)), "", false, skipNote)
	results.compare(sec, "p99 latency, response phase relayed to the EPP", "ms", ms(percentile(viaSidecar.lat, 99)), "response phase answered by the sidecar", ms(percentile(skipped.lat, 99)), "", false,
		fmt.Sprintf("added p99 %.3f ms; ", ms(percentile(viaSidecar.lat, 99)-percentile(skipped.lat, 99)))+skipNote)
	results.compare(sec, "sidecar CPU per request, response phase relayed to the EPP", "µs", viaSidecar.cpuPerRequest(), "response phase answered by the sidecar", skipped.cpuPerRequest(), "", false,
		fmt.Sprintf("user+system CPU of each mci-sidecar process over the open loop (10 ms ticks) / requests sent to it (%d, %d); added %.0f µs per request",
			viaSidecar.openSent, skipped.openSent, viaSidecar.cpuPerRequest()-skipped.cpuPerRequest()))

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
		r.Annotations[routetable.PolicyAnnotation] = string(routetable.PolicyHealthBased)
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
	// pid is the sidecar process of the path (0: none); cpu its CPU time
	// over the open loop, and openSent the requests sent then (sent counts
	// them all).
	pid      int
	cpu      time.Duration
	sent     atomic.Int64
	openSent int64

	mu     sync.Mutex
	lat    []time.Duration
	rates  []float64
	failed atomic.Int64
}

var completionBody = `{"model":"` + dpModel + `","prompt":"Write a haiku about GPUs.","max_tokens":8}`

// cpuPerRequest is the sidecar's CPU time per request of the open loop,
// in µs.
func (p *dataPath) cpuPerRequest() float64 {
	if p.openSent == 0 {
		return 0
	}
	return float64(p.cpu.Microseconds()) / float64(p.openSent)
}

func (p *dataPath) send(ctx context.Context) error {
	p.sent.Add(1)
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
// duration, and records each latency from the moment it was due.
func openLoop(ctx context.Context, paths []*dataPath, rate int, duration time.Duration) {
	interval := time.Second / time.Duration(max(rate*len(paths), 1))
	total := int(duration / interval)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range total {
		due := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(due)) // the open loop's pace
		p := paths[i%len(paths)]
		wg.Go(func() {
			err := p.send(ctx)
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
// switching path every slice, for duration in all, and records the rate of
// each slice.
func closedLoop(ctx context.Context, paths []*dataPath, clients int, duration time.Duration) {
	slices := 8
	slice := duration / time.Duration(slices)
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
