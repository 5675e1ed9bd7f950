package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/sidecar"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/waitfor"
)

// This test puts mci-sidecar, in EPP shim mode at its defaults, behind a
// gateway at the upstream defaults that NGINX Gateway Fabric follows
// (test/cmd/gateway --ext-proc-client=ngf --ext-proc-tls=skip-verify):
// TLS to its EPP without verifying it, no route, host, path or metadata
// in the ext_proc request, no response phase. Two shim pools of cluster-b
// share the sidecar's Service on two ports: "llm" (9002), imported from
// cluster-a, and "chat" (9012), imported from cluster-c; the gateway asks
// the sidecar on the port of the pool each request's route names. Loopback
// blocks 127.0.241-243.x.
const (
	ngfBlockA, ngfBlockC = 241, 243
	ngfSidecarIP         = "127.0.242.1"
	ngfGatewayIP         = "127.0.242.2"
	ngfChatPort          = 9012
)

func TestSidecarShimBehindAGatewayAtUpstreamDefaults(t *testing.T) {
	const ns = "e2e-sidecar-ngf"
	ctx := t.Context()
	simA := startShimExporter(t, "cluster-a", ns, "llm", ngfBlockA)
	simC := startShimExporter(t, "cluster-c", ns, "chat", ngfBlockC)

	b := clusterClients(t, "cluster-b")
	b.createNamespace(t, ctx, ns)
	createSharedShimService(t, b, ns, ngfSidecarIP, eppGRPCPort, ngfChatPort)
	createShimPoolOnPort(t, b, ns, "llm", eppGRPCPort)
	createShimPoolOnPort(t, b, ns, "chat", ngfChatPort)
	for _, pool := range []string{"llm", "chat"} {
		waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, pool)
			if err != nil || imp == nil || len(imp.Status.Clusters) != 1 || conditionStatus(imp.Status.Clusters[0].Conditions, "Ready") != metav1.ConditionTrue {
				return false, fmt.Sprintf("import %s not Ready yet (err=%v): %+v", pool, err, imp)
			}
			return true, ""
		})
	}

	// The sidecar at its defaults, but for the ports (the EPP
	// convention's) and the loopback destinations of a ClusterSet on one
	// machine.
	sc, err := sidecar.New(sidecar.Config{
		BindAddress: ngfSidecarIP, GRPCPort: eppGRPCPort, HealthPort: eppHealthPort, MetricsPort: eppMetricsPort,
		Server: sidecar.ServerConfig{RemoteDestinations: eppanswer.Policy{AllowLoopback: true}},
		Watch:  sidecar.WatchConfig{LocalCluster: "cluster-b", EndpointPickerServices: []types.NamespacedName{{Namespace: ns, Name: shimServiceName}}},
	}, sidecar.Clients{Kube: b.kube, MCI: b.mci, Gateway: b.gateway})
	require.NoError(t, err)
	done := runSidecar(t, sc)
	waitfor.Eventually(t, ctx, 15*time.Second, func(context.Context) (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("the sidecar stopped: %v", err)
		default:
		}
		tbl := sc.Router().Table()
		llm, chat := eppsOf(tbl, ns, "llm"), eppsOf(tbl, ns, "chat")
		return len(llm) == 1 && len(chat) == 1 && listeningOn(ngfSidecarIP, ngfChatPort), fmt.Sprintf("llm %v, chat %v, errors %v", llm, chat, tbl.Errors)
	})

	sidecarAddr := func(port int) string { return net.JoinHostPort(ngfSidecarIP, strconv.Itoa(port)) }
	gw := startGatewayDouble(t, ngfGatewayIP, "--ext-proc="+sidecarAddr(eppGRPCPort), "--route=chat.example="+sidecarAddr(ngfChatPort),
		"--ext-proc-client=ngf", "--ext-proc-tls=skip-verify")

	t.Run("each pool's requests land on its own clusters, told apart by the port", func(t *testing.T) {
		const n = 20
		got := map[string]map[string]int{"llm.example": {}, "chat.example": {}}
		for range n {
			for host, seen := range got {
				code, instance := sendTo(t, gw, host)
				seen[fmt.Sprintf("%d %s", code, instance)]++
			}
		}
		t.Logf("through the NGF-like gateway: %v", got)
		assert.Equal(t, map[string]int{"200 " + simA: n}, got["llm.example"], "llm, port 9002, imported from cluster-a")
		assert.Equal(t, map[string]int{"200 " + simC: n}, got["chat.example"], "chat, port 9012, imported from cluster-c")
	})

	t.Run("the sidecar says what it serves and what the gateway does", func(t *testing.T) {
		metrics := scrapeSidecar(t, sc)
		for _, want := range []string{
			`mci_sidecar_ext_proc_transport{transport="self-signed-or-plaintext"} 1`,
			`mci_sidecar_shim_port_listening{port="9012"} 1`,
			`mci_sidecar_shim_pools{port="9002"} 1`,
			`mci_sidecar_shim_pools{port="9012"} 1`,
			`mci_sidecar_gateway_response_phase_missing 1`,
		} {
			assert.Contains(t, metrics, want)
		}
		assert.Regexp(t, `mci_sidecar_ext_proc_connections_total\{result="served",transport="tls"\} [1-9]`, metrics, "the gateway's connections are TLS")
		assert.NotContains(t, metrics, `result="failed"`)
	})

	t.Run("the port closes when no pool names it any more, and opens again with the pool", func(t *testing.T) {
		require.NoError(t, b.mci.InferencePoolV1().InferencePools(ns).Delete(ctx, "chat", metav1.DeleteOptions{}))
		waitfor.Eventually(t, ctx, 15*time.Second, func(context.Context) (bool, string) {
			return !listeningOn(ngfSidecarIP, ngfChatPort), "the sidecar still listens on 9012"
		})
		assert.NotContains(t, scrapeSidecar(t, sc), `mci_sidecar_shim_port_listening{port="9012"}`)
		code, instance := sendTo(t, gw, "llm.example")
		assert.Equal(t, "200 "+simA, fmt.Sprintf("%d %s", code, instance), "the other pool is served all along")

		createShimPoolOnPort(t, b, ns, "chat", ngfChatPort)
		waitfor.Eventually(t, ctx, 15*time.Second, func(context.Context) (bool, string) {
			code, instance := sendTo(t, gw, "chat.example")
			return code == http.StatusOK && instance == simC, fmt.Sprintf("chat answers %d %s", code, instance)
		})
	})

	t.Run("a gateway that speaks plaintext, as Envoy configured for it does, is still served", func(t *testing.T) {
		client, err := envoyclient.Dial(sidecarAddr(ngfChatPort), envoyclient.Options{MessageTimeout: 10 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close() })
		res, err := client.Do(ctx, envoyclient.Request{Path: "/v1/completions", Body: completion(baseModel)})
		require.NoError(t, err)
		require.Nil(t, res.Immediate)
		assert.Equal(t, net.JoinHostPort(fmt.Sprintf("127.0.%d.1", ngfBlockC), "8000"), res.Destination, "chat's model server, by the port")
		assert.Regexp(t, `mci_sidecar_ext_proc_connections_total\{result="served",transport="plaintext"\} 1`, scrapeSidecar(t, sc))
	})
}

// startShimExporter sets up, in cluster name, one exported pool with its
// simulator and mci-epp (exportingCluster), and returns the simulator's
// instance.
func startShimExporter(t *testing.T, name, ns, pool string, block int) string {
	t.Helper()
	_, m := exportingCluster(t, name, ns, pool, block)
	return m.pod
}

// createSharedShimService creates, in cluster-b, the sidecar's
// LoadBalancer Service at ip with one ext_proc port per shim pool.
func createSharedShimService(t *testing.T, b *cluster, ns, ip string, ports ...int) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: shimServiceName, Namespace: ns},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": shimServiceName}},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "ext-proc-" + strconv.Itoa(p), Port: int32(p)})
	}
	svc, err := b.kube.CoreV1().Services(ns).Create(t.Context(), svc, metav1.CreateOptions{})
	require.NoError(t, err)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
	_, err = b.kube.CoreV1().Services(ns).UpdateStatus(t.Context(), svc, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// createShimPoolOnPort creates, in cluster-b, the local InferencePool pool
// whose endpointPickerRef is the sidecar's Service at port.
func createShimPoolOnPort(t *testing.T, b *cluster, ns, pool string, port int) {
	t.Helper()
	_, err := b.mci.InferencePoolV1().InferencePools(ns).Create(t.Context(), &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: ns},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": pool}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: shimServiceName, Port: &poolv1.Port{Number: int32(port)}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

func listeningOn(ip string, port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// startGatewayDouble runs test/cmd/gateway on ip:8080 with args until the
// test ends, and returns its URL once it listens.
func startGatewayDouble(t *testing.T, ip string, args ...string) string {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "gateway.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	addr := net.JoinHostPort(ip, "8080")
	cmd := exec.Command(binary(t, "gateway"), append([]string{"--listen=" + addr, "-v=2"}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("gateway (pid %d) output:\n%s", cmd.Process.Pid, out)
		}
	})
	waitfor.Eventually(t, t.Context(), 10*time.Second, func(context.Context) (bool, string) {
		select {
		case <-exited:
			out, _ := os.ReadFile(logPath)
			t.Fatalf("the gateway exited:\n%s", out)
		default:
		}
		return listeningOn(ip, 8080), "the gateway does not listen yet"
	})
	return "http://" + addr
}

// sendTo sends one completion request for host through the gateway at url
// and returns the status and the simulator instance that answered.
func sendTo(t *testing.T, url, host string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(string(completion(baseModel))))
	require.NoError(t, err)
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	resp, err := noProxyClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	return resp.StatusCode, resp.Header.Get(simulator.InstanceHeader)
}

// scrapeSidecar returns the sidecar's metrics.
func scrapeSidecar(t *testing.T, sc *sidecar.Sidecar) string {
	t.Helper()
	resp, err := noProxyClient.Get("http://" + sc.MetricsAddr() + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}
