package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/test/waitfor"
)

// deletion is how long the kube-controller-manager of a cluster may take
// to empty and remove a namespace, or to collect a dependent.
const deletion = 90 * time.Second

// Namespace deletion and owner references behave as in a real cluster: the
// local ClusterSet runs a kube-controller-manager (namespace and
// garbage-collector controllers) per cluster, and imports follow what it
// deletes.
func TestDeletingNamespacesAndOwnersMakesImportsFollow(t *testing.T) {
	ctx := context.Background()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-ns-deletion"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	a.createEPPService(t, ctx, ns, "127.0.0.5")
	a.setEPPEndpoint(t, ctx, ns, true)
	pools := map[string]*poolv1.InferencePool{}
	for _, name := range []string{"llm", "owner"} {
		p, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
		require.NoError(t, err)
		pools[name] = p
	}
	for _, cl := range []*cluster{b, c} {
		for name := range pools {
			cl.waitImport(t, ctx, ns, name, true)
		}
	}

	t.Run("the dependents of a deleted InferencePool are garbage collected and its imports go", func(t *testing.T) {
		owner := pools["owner"]
		dependent := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: "owned-by-pool", Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: poolv1.SchemeGroupVersion.String(), Kind: "InferencePool",
				Name: owner.Name, UID: owner.UID,
			}},
		}}
		_, err := a.kube.CoreV1().ConfigMaps(ns).Create(ctx, dependent, metav1.CreateOptions{})
		require.NoError(t, err)
		require.NoError(t, a.mci.InferencePoolV1().InferencePools(ns).Delete(ctx, owner.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}))
		waitfor.Eventually(t, ctx, deletion, func(ctx context.Context) (bool, string) {
			_, err := a.kube.CoreV1().ConfigMaps(ns).Get(ctx, dependent.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("the dependent ConfigMap is still there (err=%v)", err)
		})
		for _, cl := range []*cluster{b, c} {
			cl.waitImport(t, ctx, ns, owner.Name, false)
		}
	})

	t.Run("deleting an importing namespace completes and removes the import there only", func(t *testing.T) {
		require.NoError(t, b.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}))
		b.waitNamespaceGone(t, ctx, ns)
		imports, err := b.mci.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "metadata.namespace=" + ns})
		require.NoError(t, err)
		require.Empty(t, imports.Items, "cluster-b no longer has the namespace")
		c.waitImport(t, ctx, ns, "llm", true)
	})

	t.Run("deleting the exporting namespace deletes its pool and every import of it follows", func(t *testing.T) {
		require.NoError(t, a.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}))
		a.waitNamespaceGone(t, ctx, ns)
		c.waitImport(t, ctx, ns, "llm", false)
	})
}

// waitImport waits until c serves the import namespace/name (served) or
// no longer does.
func (c *cluster) waitImport(t *testing.T, ctx context.Context, namespace, name string, served bool) {
	t.Helper()
	waitfor.Eventually(t, ctx, deletion, func(ctx context.Context) (bool, string) {
		imp, err := c.importOf(ctx, namespace, name)
		if err != nil {
			return false, err.Error()
		}
		return (imp != nil) == served, fmt.Sprintf("%s serves %s/%s: %t, want %t", c.name, namespace, name, imp != nil, served)
	})
}

// waitNamespaceGone waits until the namespace controller has emptied and
// removed namespace, saying what it waits for when it does not.
func (c *cluster) waitNamespaceGone(t *testing.T, ctx context.Context, namespace string) {
	t.Helper()
	var state string
	waitfor.Eventually(t, ctx, deletion, func(ctx context.Context) (bool, string) {
		got, err := c.kube.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, ""
		case err != nil && state != "":
			return false, state // the last poll's deadline says less than the state before it
		case err != nil:
			return false, err.Error()
		}
		state = fmt.Sprintf("%s: namespace %s is %s: %+v", c.name, namespace, got.Status.Phase, got.Status.Conditions)
		return false, state
	})
}
