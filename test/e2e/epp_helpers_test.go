package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// The model servers of the EPP tests serve this base model; every EPP is
// told so (--base-models), so a request for it has no LoRA preference.
const baseModel = "base"

// The Endpoint Picker convention's ports, which every local "pod" can use
// because each has a loopback address of its own.
const (
	modelServerPort = 8000
	eppGRPCPort     = 9002
	eppHealthPort   = 9003
	eppMetricsPort  = 9090
)

// eppPool is one InferencePool in cluster-a with its model servers and,
// once started, its mci-epp. Every address is in 127.0.<block>.0/24:
// model server i (from 1) on 127.0.<block>.i:8000, the EPP on
// 127.0.<block>.100. Tests use distinct blocks so they never clash.
type eppPool struct {
	t       *testing.T
	cluster *cluster
	ns      string
	name    string
	block   int
	servers []*modelServer

	epp *eppProcess
}

// modelServer is a simulator serving on a pod's loopback address, and the
// pod object that stands for it in cluster-a.
type modelServer struct {
	pod string
	ip  string
	sim *simulator.Server
}

// address is where inference requests for the pod go: ip:8000.
func (m *modelServer) address() string {
	return net.JoinHostPort(m.ip, strconv.Itoa(modelServerPort))
}

// pin fixes what the model server's /metrics reports.
func (m *modelServer) pin(t *testing.T, queue int, kvCache float64, runningAdapters ...string) {
	t.Helper()
	require.NoError(t, m.sim.SetPins(simulator.Pins{
		Waiting:         ptr.To(queue),
		Running:         ptr.To(0),
		KVCacheUsage:    ptr.To(kvCache),
		RunningAdapters: append([]string{}, runningAdapters...),
		WaitingAdapters: []string{},
	}))
}

// newEPPPool creates namespace ns in cluster-a with an InferencePool named
// "pool" (selector app=pool, target port 8000), then starts one simulator
// per pod name, each on its own loopback address, and creates its pod,
// Running and Ready. adapters are the LoRA adapters the simulators can
// load.
func newEPPPool(t *testing.T, ns string, block int, pods []string, adapters ...string) *eppPool {
	t.Helper()
	ctx := t.Context()
	p := &eppPool{t: t, cluster: clusterClients(t, "cluster-a"), ns: ns, name: "pool", block: block}
	p.cluster.createNamespace(t, ctx, ns)
	_, err := p.cluster.mci.InferencePoolV1().InferencePools(ns).Create(ctx, &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": p.name}},
			TargetPorts:       []poolv1.Port{{Number: modelServerPort}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: eppGRPCPort}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	for i, name := range pods {
		m := &modelServer{pod: name, ip: fmt.Sprintf("127.0.%d.%d", block, i+1)}
		m.sim = startSimulator(t, m.address(), simulator.Options{
			InstanceID:   name,
			Model:        baseModel,
			LoRAAdapters: adapters,
			MaxLoRA:      max(len(adapters), 1),
			Latency:      time.Millisecond,
		})
		_, err := p.cluster.kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": p.name}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		p.servers = append(p.servers, m)
		p.setReady(m, true)
	}
	return p
}

// startSimulator serves a simulator on addr until the test ends.
func startSimulator(t *testing.T, addr string, opts simulator.Options) *simulator.Server {
	t.Helper()
	sim, err := simulator.New(opts)
	require.NoError(t, err)
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err, "listening on %s for simulator %s", addr, opts.InstanceID)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("simulator %s: %v", opts.InstanceID, err)
		}
	})
	return sim
}

// setReady writes the pod's status as a kubelet would: phase Running, its
// loopback IP and the Ready condition.
func (p *eppPool) setReady(m *modelServer, ready bool) {
	p.t.Helper()
	ctx := p.t.Context()
	pods := p.cluster.kube.CoreV1().Pods(p.ns)
	pod, err := pods.Get(ctx, m.pod, metav1.GetOptions{})
	require.NoError(p.t, err)
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = m.ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: m.ip}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(p.t, err)
}

// createModel creates an InferenceModel of the pool: requests for
// modelName have the criticality and are rewritten to target.
func (p *eppPool) createModel(modelName string, criticality v1alpha2.Criticality, target string) {
	p.t.Helper()
	_, err := p.cluster.mci.InferenceV1alpha2().InferenceModels(p.ns).Create(p.t.Context(), &v1alpha2.InferenceModel{
		ObjectMeta: metav1.ObjectMeta{Name: modelName, Namespace: p.ns},
		Spec: v1alpha2.InferenceModelSpec{
			ModelName:    modelName,
			Criticality:  ptr.To(criticality),
			TargetModels: []v1alpha2.TargetModel{{Name: target, Weight: ptr.To[int32](1)}},
			PoolRef:      v1alpha2.PoolObjectReference{Name: p.name},
		},
	}, metav1.CreateOptions{})
	require.NoError(p.t, err)
}

// eppProcess is a running mci-epp binary and an ext_proc client of it.
type eppProcess struct {
	ip     string
	pool   string
	client *envoyclient.Client
}

// clusterEPP is a running mci-epp process.
type clusterEPP struct {
	cluster string
	ip      string
	pid     int
	stop    func() // SIGTERM, then SIGKILL after 10s; idempotent.
}

// binary returns the path of a binary of localclusterset.BinDir, failing
// the test when it is not there.
func binary(t *testing.T, name string) string {
	t.Helper()
	path, err := localclusterset.Binary(name)
	require.NoError(t, err)
	return path
}

// startEPP starts mci-epp in Kubernetes mode for the pool in cluster-a, on
// 127.0.<block>.100, waits until it is SERVING and dials its ext_proc port.
func (p *eppPool) startEPP() *eppProcess {
	t := p.t
	t.Helper()
	e := &eppProcess{ip: fmt.Sprintf("127.0.%d.100", p.block), pool: p.name}
	startClusterEPP(t, "cluster-a", p.ns, p.name, e.ip)
	var err error
	e.client, err = envoyclient.Dial(net.JoinHostPort(e.ip, strconv.Itoa(eppGRPCPort)), envoyclient.Options{MessageTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.client.Close() })
	p.epp = e
	return e
}

// startClusterEPP starts mci-epp in Kubernetes mode against cluster name,
// bound to ip, and waits until its gRPC health says SERVING.
func startClusterEPP(t *testing.T, name, ns, pool, ip string) *clusterEPP {
	t.Helper()
	return startClusterEPPWith(t, name, ns, pool, ip, eppProcessOptions{})
}

// eppProcessOptions are what some tests add to an mci-epp process.
type eppProcessOptions struct {
	// args are more flags.
	args []string
	// healthCreds are what its health port is checked with; nil:
	// plaintext.
	healthCreds credentials.TransportCredentials
}

func startClusterEPPWith(t *testing.T, name, ns, pool, ip string, o eppProcessOptions) *clusterEPP {
	t.Helper()
	c, err := clusters.Cluster(name)
	require.NoError(t, err)
	logPath := filepath.Join(t.TempDir(), "mci-epp-"+name+".log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(binary(t, "mci-epp"), append([]string{
		"--pool-name=" + pool,
		"--pool-namespace=" + ns,
		"--kubeconfig=" + c.Kubeconfig,
		"--bind-address=" + ip,
		"--grpc-port=" + strconv.Itoa(eppGRPCPort),
		"--grpc-health-port=" + strconv.Itoa(eppHealthPort),
		"--metrics-port=" + strconv.Itoa(eppMetricsPort),
		"--base-models=" + baseModel,
		"-v=3",
	}, o.args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		_ = logFile.Close()
		close(exited)
	}()
	var once sync.Once
	e := &clusterEPP{cluster: name, ip: ip, pid: cmd.Process.Pid}
	e.stop = func() {
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
	t.Cleanup(func() {
		e.stop()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("mci-epp of %s (pid %d) output:\n%s", name, e.pid, out)
		}
	})

	healthCreds := o.healthCreds
	if healthCreds == nil {
		healthCreds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(net.JoinHostPort(ip, strconv.Itoa(eppHealthPort)), grpc.WithTransportCredentials(healthCreds))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	health := healthpb.NewHealthClient(conn)
	waitfor.Eventually(t, t.Context(), 30*time.Second, func(ctx context.Context) (bool, string) {
		select {
		case <-exited:
			return true, "exited"
		default:
		}
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		if err != nil {
			return false, err.Error()
		}
		return resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, resp.GetStatus().String()
	})
	select {
	case <-exited:
		t.Fatalf("mci-epp of %s exited before it was ready: %v", name, waitErr)
	default:
	}
	return e
}

// completion is the body of an OpenAI completion request for model.
func completion(model string) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": "Say hello", "max_tokens": 16})
	return b
}

// route asks the EPP, as Envoy would, where a completion request for model
// goes.
func (e *eppProcess) route(t *testing.T, model string) *envoyclient.Result {
	t.Helper()
	return e.do(t, envoyclient.Request{Path: "/v1/completions", Body: completion(model)})
}

func (e *eppProcess) do(t *testing.T, req envoyclient.Request) *envoyclient.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	res, err := e.client.Do(ctx, req)
	require.NoError(t, err)
	return res
}

// destinations routes n requests for model and counts where they go; an
// immediate response counts under "HTTP <code>".
func (e *eppProcess) destinations(t *testing.T, model string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		res := e.route(t, model)
		if res.Immediate != nil {
			got["HTTP "+strconv.Itoa(res.Immediate.StatusCode)]++
			continue
		}
		got[res.Destination]++
	}
	return got
}

// poolMetrics reads the EPP's inference_pool_* gauges of its pool, keyed by
// metric name.
func (e *eppProcess) poolMetrics(ctx context.Context) (map[string]float64, error) {
	m, err := e.metrics(ctx)
	if err != nil {
		return nil, err
	}
	got := map[string]float64{}
	for name := range m {
		if !strings.HasPrefix(name, "inference_pool_") {
			continue
		}
		for _, s := range m.Samples(name) {
			if len(s.Labels) == 1 && s.Labels["name"] == e.pool {
				got[name] = s.Value
			}
		}
	}
	return got, nil
}

// metrics reads the EPP's /metrics (within 2 s).
func (e *eppProcess) metrics(ctx context.Context) (promtext.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return promtext.Get(ctx, "http://"+net.JoinHostPort(e.ip, strconv.Itoa(eppMetricsPort))+"/metrics")
}

// waitForPoolMetrics waits until the EPP has scraped the model servers'
// current metrics: its pool gauges show every ready pod and the averages of
// the values pinned on them (the averages count only fresh metrics, so
// they match only once every pod's latest values are in).
func (p *eppPool) waitForPoolMetrics(queues []int, kvCaches []float64) {
	p.t.Helper()
	var wantQueue, wantKV float64
	for i := range queues {
		wantQueue += float64(queues[i])
		wantKV += kvCaches[i]
	}
	wantQueue /= float64(len(queues))
	wantKV /= float64(len(kvCaches))
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	waitfor.Eventually(p.t, p.t.Context(), 15*time.Second, func(ctx context.Context) (bool, string) {
		m, err := p.epp.poolMetrics(ctx)
		if err != nil {
			return false, err.Error()
		}
		ok := m["inference_pool_ready_pods"] == float64(len(queues)) &&
			near(m["inference_pool_average_queue_size"], wantQueue) &&
			near(m["inference_pool_average_kv_cache_utilization"], wantKV)
		return ok, fmt.Sprintf("pool gauges %v, want %d ready pods, average queue %g, average KV cache %g", m, len(queues), wantQueue, wantKV)
	})
}

// noProxyClient talks to loopback servers directly, whatever the
// environment's proxy settings.
var noProxyClient = func() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}()

// openAIResponse is the part of a simulator's answer the tests read.
type openAIResponse struct {
	Model    string `json:"model"`
	Instance string `json:"instance"`
}

func decodeResponse(body []byte) (openAIResponse, error) {
	var r openAIResponse
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&r); err != nil {
		return r, errors.Join(fmt.Errorf("response body %q", body), err)
	}
	return r, nil
}
