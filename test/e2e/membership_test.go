package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

// importClusters returns the exporting clusters of an import, and of each
// its Ready condition reason.
func importClusters(imp *v1alpha1.InferencePoolImport) string {
	if imp == nil {
		return "<none>"
	}
	var parts []string
	for _, c := range imp.Status.Clusters {
		reason := ""
		for _, cond := range c.Conditions {
			if cond.Type == "Ready" {
				reason = cond.Reason
			}
		}
		parts = append(parts, c.Name+":"+reason)
	}
	return strings.Join(parts, ",")
}

func waitForImportClusters(t *testing.T, ctx context.Context, in *cluster, ns, name, want string) {
	t.Helper()
	waitfor.Eventually(t, ctx, convergence*2, func(ctx context.Context) (bool, string) {
		imp, err := in.importOf(ctx, ns, name)
		if err != nil {
			return false, err.Error()
		}
		return importClusters(imp) == want, importClusters(imp)
	})
}

// A member whose apiserver hangs keeps its last known data, flagged
// ClusterUnreachable, and recovers when it answers again.
func TestAHungMemberIsFlaggedUnreachableAndRecovers(t *testing.T) {
	ctx := context.Background()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-unreachable"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	a.createEPPService(t, ctx, ns, "127.0.0.9")
	a.setEPPEndpoint(t, ctx, ns, true)
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-a:Ready")

	require.NoError(t, clusters.PauseAPIServer("cluster-a"))
	resumed := false
	defer func() {
		if !resumed {
			_ = clusters.ResumeAPIServer("cluster-a")
		}
	}()
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-a:"+v1alpha1.ReasonClusterUnreachable)

	require.NoError(t, clusters.ResumeAPIServer("cluster-a"))
	resumed = true
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-a:Ready")
}

// Members come and go at run time: from the kubeconfig directory and from
// labelled Secrets in the server's namespace.
func TestMembersJoinAndLeaveWithoutARestart(t *testing.T) {
	ctx := context.Background()
	b, c := clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-membership"
	b.createNamespace(t, ctx, ns)
	c.createNamespace(t, ctx, ns)
	_, err := c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeParent), metav1.CreateOptions{})
	require.NoError(t, err)
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-c:"+v1alpha1.ReasonNoReadyParents)

	// cluster-c leaves: its kubeconfig file is taken out of the directory
	// every mci-apiserver reads.
	file := filepath.Join(clusters.MembersDir(), "cluster-c.kubeconfig")
	kubeconfig, err := os.ReadFile(file)
	require.NoError(t, err)
	parked := filepath.Join(clusters.Dir, "cluster-c.kubeconfig.parked")
	require.NoError(t, os.Rename(file, parked))
	defer func() { _ = os.Rename(parked, file) }()
	waitForImportClusters(t, ctx, b, ns, "llm", "<none>")

	// cluster-c joins again, for cluster-b only, through a Secret.
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "member-cluster-c", Namespace: "mci-system", Labels: map[string]string{clusterset.MemberClusterLabel: "cluster-c"}},
		Data:       map[string][]byte{clusterset.MemberKubeconfigKey: kubeconfig},
	}
	_, err = b.kube.CoreV1().Secrets("mci-system").Create(ctx, secret, metav1.CreateOptions{})
	require.NoError(t, err)
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-c:"+v1alpha1.ReasonNoReadyParents)

	// A Secret whose kubeconfig breaks keeps the working connection: the
	// import stays as it is while the server sees the bad Secret.
	secret.Data[clusterset.MemberKubeconfigKey] = []byte("garbage")
	_, err = b.kube.CoreV1().Secrets("mci-system").Update(ctx, secret, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Never(t, func() bool {
		imp, err := b.importOf(ctx, ns, "llm")
		return err != nil || importClusters(imp) != "cluster-c:"+v1alpha1.ReasonNoReadyParents
	}, 3*time.Second, 200*time.Millisecond, "a broken kubeconfig must not drop the member")

	require.NoError(t, b.kube.CoreV1().Secrets("mci-system").Delete(ctx, secret.Name, metav1.DeleteOptions{}))
	waitForImportClusters(t, ctx, b, ns, "llm", "<none>")
	require.NoError(t, os.Rename(parked, file))
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-c:"+v1alpha1.ReasonNoReadyParents)
}
