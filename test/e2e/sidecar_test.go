package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// These tests run the whole multi-cluster data path on the local ClusterSet:
// cluster-a and cluster-c export an InferencePool served by a real mci-epp
// binary (Kubernetes mode) in front of simulated model servers; cluster-b
// has an HTTPRoute to the pool's InferencePoolImport and runs mci-sidecar
// (in-process, reading cluster-b through its kube-apiserver) behind an
// Envoy-like test gateway. Loopback blocks 127.0.81-83.x are theirs.

// sidecarSetup is the ClusterSet-wide setup of one sidecar test.
type sidecarSetup struct {
	ns      string
	gateway *httptest.Server
	// epps are the exporting clusters' EPPs by cluster name; instances the
	// simulator instance of each cluster, servers its model server.
	epps      map[string]*clusterEPP
	instances map[string]string
	servers   map[string]*modelServer
	// b is cluster-b, where the sidecar runs.
	b       *cluster
	sidecar *sidecar.Sidecar
}

// sidecarOptions shape a sidecar test's ClusterSet.
type sidecarOptions struct {
	// blockA and blockC are the loopback blocks of cluster-a's and
	// cluster-c's simulator (.1) and EPP (.100); sidecarIP is where the
	// sidecar listens.
	blockA, blockC int
	sidecarIP      string
	// routeAnnotations are the annotations of cluster-b's HTTPRoute; nil:
	// the Weighted policy.
	routeAnnotations map[string]string
	// shim makes the sidecar an EPP shim instead: cluster-b has no
	// HTTPRoute but an InferencePool "llm" whose endpointPickerRef is the
	// sidecar's Service "mci-sidecar".
	shim bool
	// inferenceModels makes the sidecar read cluster-b's InferenceModels.
	inferenceModels bool
	// probeInterval paces the sidecar's health checks and metric scrapes
	// of EPPs; zero: the defaults.
	probeInterval time.Duration
	// eppArgs are more flags of the mci-epp of a cluster, by cluster name.
	eppArgs map[string][]string
	// metricsTokenFile is the sidecar's token file for EPP metrics.
	metricsTokenFile string
	// secretNamespaces are where the sidecar reads EPP credentials.
	secretNamespaces []string
	// logger, when set, is the sidecar's logger.
	logger *klog.Logger
}

// exportingCluster sets up, in cluster name of namespace ns, one simulator
// (pod "sim-<name>") on 127.0.<block>.1:8000, the exported InferencePool
// pool, its mci-epp on 127.0.<block>.100, the LoadBalancer EPP Service with
// that ingress IP and a ready EPP EndpointSlice.
func exportingCluster(t *testing.T, name, ns, pool string, block int) (*clusterEPP, *modelServer) {
	t.Helper()
	return exportingClusterWith(t, name, ns, pool, block, eppProcessOptions{})
}

// exportingClusterWith is exportingCluster with an EPP started with o.
func exportingClusterWith(t *testing.T, name, ns, pool string, block int, o eppProcessOptions) (*clusterEPP, *modelServer) {
	t.Helper()
	ctx := t.Context()
	c := clusterClients(t, name)
	c.createNamespace(t, ctx, ns)

	instance := "sim-" + name
	m := &modelServer{pod: instance, ip: fmt.Sprintf("127.0.%d.1", block)}
	m.sim = startSimulator(t, m.address(), simulator.Options{
		InstanceID: instance,
		Model:      baseModel,
		MaxLoRA:    1,
		Latency:    time.Millisecond,
	})
	_, err := c.kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: instance, Namespace: ns, Labels: map[string]string{"app": pool}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	(&eppPool{t: t, cluster: c, ns: ns, name: pool}).setReady(m, true)

	_, err = c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, pool, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	eppIP := fmt.Sprintf("127.0.%d.100", block)
	epp := startClusterEPPWith(t, name, ns, pool, eppIP, o)
	c.createEPPService(t, ctx, ns, eppIP)
	c.setEPPEndpoint(t, ctx, ns, true)
	return epp, m
}

// newSidecarSetup builds the ClusterSet of the sidecar tests in namespace
// ns, using loopback blocks base (cluster-a), base+1 (the sidecar) and
// base+2 (cluster-c), and returns cluster-b's gateway once the sidecar
// routes to both exporting clusters.
func newSidecarSetup(t *testing.T, ns string, base int) *sidecarSetup {
	return newSidecarSetupWith(t, ns, sidecarOptions{blockA: base, blockC: base + 2, sidecarIP: fmt.Sprintf("127.0.%d.1", base+1)})
}

func newSidecarSetupWith(t *testing.T, ns string, o sidecarOptions) *sidecarSetup {
	t.Helper()
	ctx := t.Context()
	const pool = "llm"
	start := time.Now()
	s := &sidecarSetup{ns: ns, epps: map[string]*clusterEPP{}, instances: map[string]string{}, servers: map[string]*modelServer{}}
	for name, block := range map[string]int{"cluster-a": o.blockA, "cluster-c": o.blockC} {
		epp, m := exportingClusterWith(t, name, ns, pool, block, eppProcessOptions{args: o.eppArgs[name]})
		s.epps[name], s.servers[name], s.instances[name] = epp, m, m.pod
	}

	b := clusterClients(t, "cluster-b")
	s.b = b
	b.createNamespace(t, ctx, ns)
	if o.shim {
		createShimPool(t, b, ns, pool, o.sidecarIP)
	} else {
		createRoute(t, b, ns, pool, o.routeAnnotations)
	}

	waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
		imp, err := b.importOf(ctx, ns, pool)
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import not served yet (err=%v)", err)
		}
		var ready []string
		for _, c := range imp.Status.Clusters {
			if conditionStatus(c.Conditions, "Ready") == metav1.ConditionTrue {
				ready = append(ready, c.Name)
			}
		}
		return strings.Join(ready, ",") == "cluster-a,cluster-c", fmt.Sprintf("%+v", imp.Status)
	})
	t.Logf("cluster-b's InferencePoolImport lists cluster-a and cluster-c Ready %s after the setup began", time.Since(start).Round(time.Millisecond))

	cfg := sidecar.Config{
		BindAddress: o.sidecarIP,
		// Only its own namespace's route: namespaces of other tests stay
		// (no namespace controller deletes them) with routes of the same
		// path.
		Watch:            sidecar.WatchConfig{LocalCluster: "cluster-b", InferenceModels: o.inferenceModels, Gateways: []types.NamespacedName{{Namespace: ns, Name: "inference-gateway"}}},
		Server:           sidecar.ServerConfig{AttemptTimeout: 2 * time.Second, RemoteDestinations: eppanswer.Policy{AllowLoopback: true}},
		HealthInterval:   o.probeInterval,
		ScrapeInterval:   o.probeInterval,
		MetricsTokenFile: o.metricsTokenFile,
		SecretNamespaces: o.secretNamespaces,
	}
	if o.shim {
		cfg.Watch.EndpointPickerServices = []types.NamespacedName{{Namespace: ns, Name: shimServiceName}}
	}
	sc, err := sidecar.New(cfg, sidecar.Clients{Kube: b.kube, MCI: b.mci, Gateway: b.gateway})
	require.NoError(t, err)
	s.sidecar = sc
	logger := klog.Background()
	if o.logger != nil {
		logger = *o.logger
	}
	done := runSidecarLogging(t, sc, logger)

	// The sidecar's table routes the rule (or the shim pool) to both
	// clusters' EPPs.
	wantEPPs := map[string]string{}
	for name, e := range s.epps {
		wantEPPs[name] = net.JoinHostPort(e.ip, strconv.Itoa(eppGRPCPort))
	}
	waitfor.Eventually(t, ctx, 15*time.Second, func(context.Context) (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("the sidecar stopped: %v", err)
		default:
		}
		tbl := sc.Router().Table()
		if fmt.Sprint(eppsOf(tbl, ns, pool)) == fmt.Sprint(wantEPPs) {
			return true, ""
		}
		return false, fmt.Sprintf("table generation %d: rules %d, shims %d, errors %v", tbl.Generation, len(tbl.Rules()), len(tbl.Shims()), tbl.Errors)
	})

	client, err := envoyclient.Dial(sc.GRPCAddr(), envoyclient.Options{MessageTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	s.gateway = httptest.NewServer(envoyclient.NewProxy(client, nil))
	t.Cleanup(s.gateway.Close)
	t.Logf("setup done in %s: sidecar ext_proc on %s", time.Since(start).Round(time.Millisecond), sc.GRPCAddr())
	return s
}

// runSidecar runs sc until the test ends, then checks that it stopped
// cleanly. The channel reports its end if it stops before.
func runSidecar(t *testing.T, sc *sidecar.Sidecar) <-chan error {
	t.Helper()
	return runSidecarLogging(t, sc, klog.Background())
}

// runSidecarLogging is runSidecar with the sidecar's logger.
func runSidecarLogging(t *testing.T, sc *sidecar.Sidecar, logger klog.Logger) <-chan error {
	t.Helper()
	runCtx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- sc.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "the sidecar stopped with an error")
		case <-time.After(20 * time.Second):
			t.Errorf("the sidecar did not stop within 20s")
		}
	})
	return done
}

// eppsOf returns the EPP of each cluster the table routes the pool's
// backend to (the first backendRef naming it, else its shim), by cluster.
func eppsOf(tbl *routetable.Table, ns, pool string) map[string]string {
	got := map[string]string{}
	for _, r := range tbl.Rules() {
		for _, be := range r.Backends {
			if be.Namespace == ns && be.Name == pool {
				for _, c := range be.Clusters {
					got[c.Name] = c.EPP
				}
				return got
			}
		}
	}
	for _, be := range tbl.Shims() {
		if be.Namespace == ns && be.Name == pool {
			for _, c := range be.Clusters {
				got[c.Name] = c.EPP
			}
		}
	}
	return got
}

// shimServiceName is the sidecar's Service in the shim tests.
const shimServiceName = "mci-sidecar"

// createShimPool creates, in cluster-b, the sidecar's LoadBalancer Service
// at ip and a local InferencePool named pool (not exported) whose
// endpointPickerRef is that Service: the gateway calls the sidecar as the
// pool's EPP.
func createShimPool(t *testing.T, b *cluster, ns, pool, ip string) {
	t.Helper()
	ctx := t.Context()
	svc, err := b.kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: shimServiceName, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": shimServiceName},
			Ports:    []corev1.ServicePort{{Name: "grpc-ext-proc", Port: int32(eppGRPCPort)}, {Name: "grpc-health", Port: int32(eppHealthPort)}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
	_, err = b.kube.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = b.mci.InferencePoolV1().InferencePools(ns).Create(ctx, &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: ns},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": pool}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: shimServiceName, Port: &poolv1.Port{Number: int32(eppGRPCPort)}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// createRoute creates cluster-b's Gateway "inference-gateway" that the
// sidecar serves (one HTTP listener, allowedRoutes left to the API's
// default) and its HTTPRoute "completions": /v1/completions to the
// InferencePoolImport pool.
func createRoute(t *testing.T, b *cluster, ns, pool string, annotations map[string]string) {
	t.Helper()
	_, err := b.gateway.GatewayV1().Gateways(ns).Create(t.Context(), &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "inference-gateway", Namespace: ns},
		Spec: gatewayv1.GatewaySpec{
			GatewayClassName: "inference",
			Listeners:        []gatewayv1.Listener{{Name: "http", Protocol: gatewayv1.HTTPProtocolType, Port: 80}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	if annotations == nil {
		annotations = map[string]string{routetable.PolicyAnnotation: routingpolicy.Weighted}
	}
	_, err = b.gateway.GatewayV1().HTTPRoutes(ns).Create(t.Context(), &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{
			Name: "completions", Namespace: ns,
			Annotations: annotations,
		},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "inference-gateway"}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{
					Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/v1/completions"),
				}}},
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
					BackendObjectReference: gatewayv1.BackendObjectReference{
						Group: ptr.To(gatewayv1.Group(routetable.InferencePoolImportGroup)),
						Kind:  ptr.To(gatewayv1.Kind(routetable.InferencePoolImportKind)),
						Name:  gatewayv1.ObjectName(pool),
					},
				}}},
			}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// send sends one completion request through cluster-b's gateway and
// returns the status, the answering simulator instance and the body.
func (s *sidecarSetup) send(t *testing.T) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.gateway.URL+"/v1/completions", strings.NewReader(string(completion(baseModel))))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := noProxyClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get(simulator.InstanceHeader), string(body)
}

// spread sends n requests and counts where they land: the simulator
// instance, or "HTTP <code>" for a failure.
func (s *sidecarSetup) spread(t *testing.T, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		code, instance, _ := s.send(t)
		if code != http.StatusOK {
			got["HTTP "+strconv.Itoa(code)]++
			continue
		}
		got[instance]++
	}
	return got
}

func TestSidecarSplitsAWeightedRouteAcrossClustersAndFailsOverWhenAnEPPStops(t *testing.T) {
	s := newSidecarSetup(t, "e2e-sidecar", 81)
	simA, simC := s.instances["cluster-a"], s.instances["cluster-c"]

	t.Run("requests from cluster-b's gateway land in cluster-a and cluster-c about equally", func(t *testing.T) {
		const n = 400
		start := time.Now()
		got := s.spread(t, n)
		t.Logf("%d requests in %s: %v", n, time.Since(start).Round(time.Millisecond), got)
		require.Equal(t, n, got[simA]+got[simC], "every request is answered by a simulator of cluster-a or cluster-c: %v", got)
		for _, inst := range []string{simA, simC} {
			assert.GreaterOrEqual(t, got[inst], n*40/100, "%s gets at least 40%%: %v", inst, got)
			assert.LessOrEqual(t, got[inst], n*60/100, "%s gets at most 60%%: %v", inst, got)
		}
	})

	t.Run("when cluster-a's EPP stops every request lands in cluster-c", func(t *testing.T) {
		start := time.Now()
		s.epps["cluster-a"].stop()
		t.Logf("cluster-a's mci-epp (pid %d) exited %s after SIGTERM", s.epps["cluster-a"].pid, time.Since(start).Round(time.Millisecond))

		// Settling: some requests may still fail while the sidecar learns
		// that the EPP is gone; then N in a row must succeed on cluster-c.
		const consecutive = 50
		var last string
		misses := 0
		waitfor.Eventually(t, t.Context(), 10*time.Second, func(context.Context) (bool, string) {
			for streak := range consecutive {
				code, instance, body := s.send(t)
				if code != http.StatusOK || instance != simC {
					misses++
					last = fmt.Sprintf("HTTP %d from %q after %d successes: %s", code, instance, streak, body)
					return false, last
				}
			}
			return true, ""
		})
		t.Logf("%d requests missed cluster-c while the sidecar settled (last: %s)", misses, last)
		t.Logf("%d consecutive requests landed in cluster-c %s after cluster-a's EPP was told to stop", consecutive, time.Since(start).Round(time.Millisecond))

		got := s.spread(t, 100)
		assert.Equal(t, map[string]int{simC: 100}, got, "after failover every request lands in cluster-c")
	})
}
