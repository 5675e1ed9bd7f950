package localclusterset

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// mciBinDir is where the mci binaries are: BinDir, as for the e2e tests.
func mciBinDir(t *testing.T) string {
	t.Helper()
	dir, err := BinDir()
	require.NoError(t, err)
	return dir
}

// dataPathBinaries puts into dir what StartDataPath runs: mci-epp and
// mci-sidecar of mciBin (`make build`, as for the e2e tests), and the test
// servers, built from the current source.
func dataPathBinaries(dir, mciBin string) error {
	for _, b := range []string{"mci-epp", "mci-sidecar"} {
		if err := executable(filepath.Join(mciBin, b)); err != nil {
			return fmt.Errorf("%w: build it with `make build`", err)
		}
		if err := os.Symlink(filepath.Join(mciBin, b), filepath.Join(dir, b)); err != nil {
			return err
		}
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "github.com/mci-dev/mci/test/cmd/simulator", "github.com/mci-dev/mci/test/cmd/gateway")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the test servers: %w\n%s", err, out)
	}
	return nil
}

func TestDataPathOfMakeRunRoutesARequestFromTheGatewayClusterToAnotherCluster(t *testing.T) {
	requireBinaries(t)
	mciBin := mciBinDir(t)
	mci := filepath.Join(mciBin, "mci-apiserver")
	require.FileExists(t, mci, "build it with `make build`")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	// The test servers build while the clusters start.
	bins := t.TempDir()
	built := make(chan error, 1)
	go func() { built <- dataPathBinaries(bins, mciBin) }()

	start := time.Now()
	dir := t.TempDir()
	// Detached, as `make run`: the data path must be recorded in state.json
	// for Down to stop it.
	cs, err := Up(ctx, Options{Dir: dir, Clusters: []string{"cluster-a", "cluster-b"}, MCIAPIServerBinary: mci, Detached: true, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = Down(dir) })
	t.Logf("Up took %s", time.Since(start).Round(100*time.Millisecond))
	require.NoError(t, <-built)

	start = time.Now()
	// Block 96, away from make run's default 90 and the e2e tests' blocks.
	dp, err := cs.StartDataPath(ctx, DataPathOptions{LoopbackBlock: 96, BinDir: bins})
	require.NoError(t, err)
	t.Logf("StartDataPath took %s", time.Since(start).Round(100*time.Millisecond))
	assert.Equal(t, "http://127.0.97.1:8080", dp.GatewayURL, "cluster-b, the second cluster, has the second block")
	require.Equal(t, []string{"cluster-a/model-server-1", "cluster-a/model-server-2"}, dp.ModelServers["cluster-a"])

	t.Run("a request to cluster-b's gateway is answered by a model server of cluster-a", func(t *testing.T) {
		code, instance, body, err := dp.Send(ctx)
		require.NoError(t, err)
		require.Equal(t, 200, code, body)
		assert.Contains(t, dp.ModelServers["cluster-a"], instance, body)
		assert.Contains(t, body, `"instance":"`+instance+`"`, "the simulator names itself in the body too")
	})

	t.Run("kubectl get ipimp -n demo llm-pool -o yaml in cluster-b lists the route's Gateway as the import's parent", func(t *testing.T) {
		gc, err := cs.Cluster(dp.GatewayCluster)
		require.NoError(t, err)
		var imp v1alpha1.InferencePoolImport
		var out []byte
		require.Eventually(t, func() bool {
			out, err = exec.CommandContext(ctx, "kubectl", "--kubeconfig", gc.Kubeconfig, "get", "ipimp", "-n", DataPathNamespace, DataPathPool, "-o", "yaml").CombinedOutput()
			if err != nil || yaml.UnmarshalStrict(out, &imp) != nil || len(imp.Status.Controllers) != 1 {
				return false
			}
			return len(imp.Status.Controllers[0].Parents) == 1
		}, 20*time.Second, 100*time.Millisecond, "kubectl: %v\n%s", err, out)
		t.Logf("kubectl get ipimp -n %s %s -o yaml:\n%s", DataPathNamespace, DataPathPool, out)
		p := imp.Status.Controllers[0].Parents[0]
		assert.Equal(t, v1alpha1.ParentReference{Group: ptr.To("gateway.networking.k8s.io"), Kind: "Gateway", Name: DataPathGatewayName, Namespace: DataPathNamespace}, p.ParentRef)
		assert.Equal(t, v1alpha1.ControllerName, p.ControllerName)
		for _, c := range []string{"Accepted", "ResolvedRefs"} {
			cond := meta.FindStatusCondition(p.Conditions, c)
			require.NotNil(t, cond, c)
			assert.Equal(t, metav1.ConditionTrue, cond.Status, cond.Message)
		}
	})

	servers := cs.DataPathServers()
	t.Run("the data path is recorded in state.json with its addresses", func(t *testing.T) {
		var names []string
		for _, s := range servers {
			names = append(names, s.Name+" "+s.Address)
			assert.True(t, s.Alive, s.Name)
		}
		assert.Equal(t, []string{
			"cluster-a-model-server-1 127.0.96.1:8000", "cluster-a-model-server-2 127.0.96.2:8000", "cluster-a-mci-epp 127.0.96.100:9002",
			"cluster-b-mci-sidecar 127.0.97.1:9002", "cluster-b-gateway 127.0.97.1:8080",
		}, names)
		loaded, err := Load(dir)
		require.NoError(t, err)
		assert.Equal(t, servers, loaded.DataPathServers())
	})

	t.Run("Down stops the data path with the clusters", func(t *testing.T) {
		require.NoError(t, Down(dir))
		for _, s := range servers {
			assert.Eventually(t, func() bool { return syscall.Kill(s.PID, 0) == syscall.ESRCH }, 5*time.Second, 50*time.Millisecond,
				"%s (pid %d) is still running", s.Name, s.PID)
		}
	})
}

func TestSidecarManifestsApplyToAKubeAPIServer(t *testing.T) {
	requireBinaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cs, err := Up(ctx, Options{Dir: t.TempDir(), Clusters: []string{"solo"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	root, err := repoRoot()
	require.NoError(t, err)
	manifests := filepath.Join(root, "artifacts", "deploy", "mci-sidecar")

	t.Run("every object is accepted as written", func(t *testing.T) {
		applied, err := cs.ApplyFiles(ctx, "solo", manifests)
		require.NoError(t, err)
		assert.Subset(t, applied, []string{
			"namespaces/mci-gateway", "serviceaccounts/mci-gateway/mci-sidecar",
			"clusterroles.rbac.authorization.k8s.io/mci-sidecar", "clusterrolebindings.rbac.authorization.k8s.io/mci-sidecar",
			"configmaps/mci-gateway/inference-gateway-envoy", "deployments.apps/mci-gateway/inference-gateway", "services/mci-gateway/inference-gateway",
			"poddisruptionbudgets.policy/mci-gateway/inference-gateway", "networkpolicies.networking.k8s.io/mci-gateway/inference-gateway",
		})
	})

	t.Run("a schema mistake would be caught", func(t *testing.T) {
		objs, err := readObjects([]string{filepath.Join(manifests, "40-deployment.yaml")})
		require.NoError(t, err)
		require.Len(t, objs, 2, "the Deployment and its PodDisruptionBudget")
		require.Equal(t, "Deployment", objs[0].GetKind())
		broken := objs[0].DeepCopy()
		require.NoError(t, unstructured.SetNestedField(broken.Object, "2", "spec", "template", "spec", "terminationGracePeriodSecond"))
		_, err = cs.Apply(ctx, "solo", broken)
		assert.ErrorContains(t, err, "terminationGracePeriodSecond")
	})

	// The example grant of EPP credentials, in a namespace of pools.
	credentials := filepath.Join(manifests, "examples", "endpoint-picker-credentials.yaml")
	t.Run("the EPP credentials grant is accepted in a namespace of pools", func(t *testing.T) {
		applied, err := cs.Apply(ctx, "solo", &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "example"},
		}})
		require.NoError(t, err)
		more, err := cs.ApplyFiles(ctx, "solo", credentials)
		require.NoError(t, err)
		assert.Equal(t, []string{
			"roles.rbac.authorization.k8s.io/example/mci-sidecar-endpoint-picker-credentials",
			"rolebindings.rbac.authorization.k8s.io/example/mci-sidecar-endpoint-picker-credentials",
		}, more, "after %v", applied)
	})

	t.Run("mci-sidecar may read what it watches and nothing more", func(t *testing.T) {
		c, err := cs.Cluster("solo")
		require.NoError(t, err)
		kube, err := kubernetes.NewForConfig(c.Config)
		require.NoError(t, err)
		allowedIn := func(namespace, group, resource, verb string) bool {
			t.Helper()
			sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               "system:serviceaccount:mci-gateway:mci-sidecar",
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:mci-gateway", "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Group: group, Resource: resource, Verb: verb},
			}}, metav1.CreateOptions{})
			require.NoError(t, err)
			return sar.Status.Allowed
		}
		allowed := func(group, resource, verb string) bool {
			t.Helper()
			return allowedIn("", group, resource, verb)
		}
		// pkg/sidecar/watch.go's informers.
		for _, gr := range []string{"services", "httproutes.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io",
			"referencegrants.gateway.networking.k8s.io", "backendtlspolicies.gateway.networking.k8s.io", "inferencepoolimports.inference.networking.x-k8s.io",
			"inferencepools.inference.networking.k8s.io", "inferencemodels.inference.networking.x-k8s.io",
			"inferenceobjectives.inference.networking.x-k8s.io", "inferenceobjectives.llm-d.ai"} {
			resource, group, _ := strings.Cut(gr, ".")
			for _, verb := range []string{"get", "list", "watch"} {
				assert.True(t, allowed(group, resource, verb), "%s %s", verb, gr)
			}
			assert.False(t, allowed(group, resource, "update"), "update %s", gr)
		}
		for _, gr := range []string{"secrets", "pods", "endpointslices.discovery.k8s.io", "grpcroutes.gateway.networking.k8s.io"} {
			resource, group, _ := strings.Cut(gr, ".")
			assert.False(t, allowed(group, resource, "list"), "list %s", gr)
		}
		// Namespaces, for the labels allowedRoutes selectors match: listed
		// and watched by the informer, nothing more.
		for _, verb := range []string{"list", "watch"} {
			assert.True(t, allowed("", "namespaces", verb), "%s namespaces", verb)
		}
		for _, verb := range []string{"get", "update", "delete"} {
			assert.False(t, allowed("", "namespaces", verb), "%s namespaces", verb)
		}
		// pkg/sidecar/credentials.go's informers: Secrets and the CA
		// ConfigMaps of BackendTLSPolicies in the namespaces granted
		// (--endpoint-picker-secret-namespaces), read-only.
		for _, resource := range []string{"secrets", "configmaps"} {
			for _, verb := range []string{"get", "list", "watch"} {
				assert.True(t, allowedIn("example", "", resource, verb), "%s %s in example", verb, resource)
				assert.False(t, allowedIn("default", "", resource, verb), "%s %s in default", verb, resource)
				assert.False(t, allowedIn("mci-system", "", resource, verb), "%s %s in mci-system", verb, resource)
				assert.False(t, allowedIn("mci-gateway", "", resource, verb), "%s %s in mci-gateway", verb, resource)
			}
			for _, verb := range []string{"create", "update", "patch", "delete"} {
				assert.False(t, allowedIn("example", "", resource, verb), "%s %s in example", verb, resource)
			}
		}
	})
}
