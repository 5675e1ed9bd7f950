package chart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/mci-dev/mci/test/localclusterset"
)

// memberKubeconfig is a member kubeconfig of the shape mci-apiserver reads
// (one context, credentials inline), for the chart to put in a Secret.
const memberKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: cluster-b
  cluster:
    server: https://127.0.0.1:6443
users:
- name: reader
  user:
    token: not-a-real-token
contexts:
- name: cluster-b
  context:
    cluster: cluster-b
    user: reader
current-context: cluster-b
`

// What the chart renders is admitted by a real kube-apiserver (a cluster of
// a local ClusterSet of its own, without mci-apiserver): every object is
// validated and admitted with a server-side apply dry run, as
// `helm install` would create them, for the default values and for the
// values that render the chart's optional objects. No kubelet runs, so no
// pod starts. cert-manager's and the Prometheus Operator's kinds cannot be
// checked by a server without their CRDs, which cannot be fetched here;
// the equivalence test compares cert-manager's with the kustomize
// overlay's instead.
func TestChartIsAdmittedByARealCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"chart"}, BinDir: binDir(t), Log: testWriter{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	c, err := cs.Cluster("chart")
	require.NoError(t, err)
	// The release's namespace and the pool's exist before an install, as
	// `helm install --create-namespace` and the pool's owner make them; the
	// gateway's too, which the chart renders but a dry run does not create.
	for _, ns := range []string{releaseNamespace, "example", gatewayNamespace} {
		_, err := cs.Apply(ctx, c.Name, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
		}})
		require.NoError(t, err)
	}

	kubeconfigFile := filepath.Join(t.TempDir(), "cluster-b.kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfigFile, []byte(memberKubeconfig), 0o600))

	for _, tc := range []struct {
		name string
		args []string
	}{{
		name: "default values",
	}, {
		name: "the kustomize bases' settings with mci-epp",
		args: []string{"--values", equivalentValues, "--set", "epp.enabled=true"},
	}, {
		name: "cert-manager, one replica, member Secrets and a kubeconfig directory, EPP credentials, a Gateway",
		args: []string{
			"--set", "apiserver.tls.mode=certManager",
			"--set", "apiserver.replicas=1",
			"--set", "clusterName=cluster-a",
			"--set", "membership.secrets[0].cluster=cluster-b",
			"--set-file", "membership.secrets[0].kubeconfig=" + kubeconfigFile,
			"--set", "membership.kubeconfigDir.secretName=mci-member-kubeconfigs",
			"--set", "membership.memberReader.create=false",
			"--set", "sidecar.endpointPickerSecretNamespaces={example}",
			"--set", "sidecar.gateways={mci-system/inference-gateway}",
			"--set", "sidecar.defaultClusterPolicy=PrefixAffinity",
			"--set", "sidecar.service.type=LoadBalancer",
			"--set", "epp.enabled=true",
			"--set", "epp.poolName=llm-pool",
			"--set", "epp.namespace=example",
		},
	}, {
		name: "production values: registry, scheduling, network policies, monitoring",
		args: []string{"--values", productionValues},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "mci", chartDir, "--namespace", releaseNamespace}, tc.args...)
			objs := decode(t, helm(t, args...), "helm template")
			var stream []byte
			var checked int
			for _, o := range objs {
				if g := o.GroupVersionKind().Group; g == "cert-manager.io" || g == "monitoring.coreos.com" {
					continue
				}
				data, err := o.MarshalJSON()
				require.NoError(t, err)
				stream = append(append(stream, data...), '\n')
				checked++
			}
			// --force-conflicts: the ClusterSet grants its own members the
			// ClusterRoleBinding mci-member-reader the chart renders too,
			// with other subjects; a dry run changes neither.
			cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", c.Kubeconfig, "apply", "--server-side", "--force-conflicts",
				"--field-manager=mci-chart-test", "--dry-run=server", "-f", "-")
			cmd.Stdin = bytes.NewReader(stream)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "kubectl apply --server-side --dry-run=server:\n%s", out)
			t.Logf("kubectl apply --server-side --dry-run=server:\n%s", out)
			assert.Equal(t, checked, strings.Count(string(out), "serverside-applied (server dry run)"), "every object is admitted")
		})
	}
}

// testWriter logs the ClusterSet's progress lines through the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
