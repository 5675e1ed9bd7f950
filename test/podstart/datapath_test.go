package podstart

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mci-dev/mci/test/localclusterset"
)

// dataPathBlock is the loopback block of the exporters' model servers and
// EPP: 127.0.<dataPathBlock + the cluster's index>.x.
const dataPathBlock = 170

// exporters makes memberCluster a member through the chart's Secret (as
// memberSecret) and starts there the exporting side of the local
// ClusterSet's data path: model servers and mci-epp behind the pool
// demo/llm-pool, exported in EndpointMode, its EPP Service's LoadBalancer
// address the EPP's. The chart's cluster gets the pool's namespace (imports
// follow namespace sameness), the Gateway the chart's sidecar serves
// (sidecar.gateways) and an HTTPRoute of that namespace to the import.
func exporters(t *testing.T, ctx context.Context, f *fixture) []string {
	t.Helper()
	args := memberSecret(t, ctx, f)
	dp, err := f.cs.StartExporters(ctx, localclusterset.DataPathOptions{
		GatewayCluster: f.cluster.Name, ExportingClusters: []string{memberCluster},
		LoopbackBlock: dataPathBlock, BinDir: f.env.binDir,
	})
	require.NoError(t, err, "the exporting side of the data path")
	t.Cleanup(func() { _ = f.cs.StopDataPath() })
	f.dataPath = dp
	objs := []*unstructured.Unstructured{
		{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": dp.Namespace}}},
		{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": gatewayNamespace}}},
		{Object: map[string]any{
			"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
			"metadata": map[string]any{"name": gatewayName, "namespace": gatewayNamespace},
			"spec": map[string]any{
				"gatewayClassName": "mci",
				"listeners": []any{map[string]any{
					"name": "http", "protocol": "HTTP", "port": int64(8080),
					"allowedRoutes": map[string]any{"namespaces": map[string]any{"from": "All"}},
				}},
			},
		}},
		{Object: map[string]any{
			"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
			"metadata": map[string]any{"name": dp.Pool, "namespace": dp.Namespace},
			"spec": map[string]any{
				"parentRefs": []any{map[string]any{"name": gatewayName, "namespace": gatewayNamespace}},
				"rules": []any{map[string]any{
					"matches":     []any{map[string]any{"path": map[string]any{"type": "PathPrefix", "value": "/v1"}}},
					"backendRefs": []any{map[string]any{"group": "inference.networking.x-k8s.io", "kind": "InferencePoolImport", "name": dp.Pool}},
				}},
			},
		}},
	}
	_, err = f.cs.Apply(ctx, f.cluster.Name, objs...)
	require.NoError(t, err)
	return args
}

// The Gateway the chart's sidecar serves by default (sidecar.gateways).
const (
	gatewayNamespace = "mci-gateway"
	gatewayName      = "inference-gateway"
)

// requireRequestRouted sends completion requests through each gateway pod
// the chart renders and requires them answered by a model server of
// memberCluster: the chart's mci-sidecar picked memberCluster from the
// import the chart's mci-apiservers serve, and relayed the request to its
// EPP. Envoy's image cannot be had here, so the pod's gateway is
// test/cmd/gateway, which speaks ext_proc as Envoy does, on the pod's
// address and the Envoy container's port, calling mci-sidecar there.
func requireRequestRouted(t *testing.T, ctx context.Context, f *fixture) {
	t.Helper()
	requireImportServed(t, ctx, f)
	var gateways int
	for _, p := range f.pods {
		if p.namespace != gatewayNamespace || len(p.notStarted) == 0 {
			continue
		}
		gateways++
		listen := net.JoinHostPort(p.ip, "8080")
		log, err := os.Create(filepath.Join(p.dir, "gateway.log"))
		require.NoError(t, err)
		cmd := exec.CommandContext(ctx, filepath.Join(f.env.binDir, "gateway"), "--listen="+listen, "--ext-proc="+net.JoinHostPort(p.ip, "9002"))
		cmd.Stdout, cmd.Stderr = log, log
		require.NoError(t, cmd.Start(), "test/cmd/gateway (make test-programs builds it)")
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			_ = log.Close()
		})
		url := "http://" + listen + "/v1/completions"
		var last string
		err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(f.dataPath.CompletionBody()))
			if err != nil {
				return false, err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			defer resp.Body.Close()
			instance := resp.Header.Get("X-Simulator-Instance")
			last = fmt.Sprintf("HTTP %d from %q", resp.StatusCode, instance)
			return resp.StatusCode == http.StatusOK && strings.HasPrefix(instance, memberCluster+"/"), nil
		})
		require.NoError(t, err, "a request through %s/%s's gateway answered by a model server of %s; last: %s\n%s", p.namespace, p.name, memberCluster, last, p.containers[0].logTail())
		t.Logf("a request through pod %s/%s (mci-sidecar of the chart, test/cmd/gateway for Envoy) was answered by %s", p.namespace, p.name, last)
	}
	require.NotZero(t, gateways, "the chart renders no gateway pod")
}
