package images

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/localclusterset"
)

// testLog sends the ClusterSet's progress lines to the test's log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(p))
	return len(p), nil
}

func TestTheAPIServerImageServesImportsAndItsVersion(t *testing.T) {
	env := requireImages(t)
	root := rootfs(t, openImage(t, env, "mci-apiserver"))
	dir, err := os.MkdirTemp("", "mci-images-")
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ClusterSet logs kept in %s", filepath.Join(dir, "logs"))
			return
		}
		_ = os.RemoveAll(dir)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{
		Dir:                dir,
		Clusters:           []string{"cluster-a", "cluster-b"},
		MCIAPIServerBinary: filepath.Join(root, binDir, "mci-apiserver"),
		Log:                testLog{t},
	})
	require.NoError(t, err, "a ClusterSet running the image's mci-apiserver")
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	a, err := cs.Cluster("cluster-a")
	require.NoError(t, err)
	b, err := cs.Cluster("cluster-b")
	require.NoError(t, err)

	const ns = "images"
	for _, c := range []*localclusterset.Cluster{a, b} {
		_, err := kubernetes.NewForConfigOrDie(c.Config).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	_, err = mciclient.NewForConfigOrDie(a.Config).InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm"), metav1.CreateOptions{})
	require.NoError(t, err)

	imports := mciclient.NewForConfigOrDie(b.Config).InferenceV1alpha1().InferencePoolImports(ns)
	var last string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		imp, err := imports.Get(ctx, "llm", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			last = "not served yet"
			return false, nil
		case err != nil:
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%+v", imp.Status.Clusters)
		return len(imp.Status.Clusters) == 1 && imp.Status.Clusters[0].Name == "cluster-a", nil
	})
	require.NoError(t, err, "cluster-b imports the pool cluster-a exports; last: %s", last)

	t.Run("its version endpoint reports the image's version", func(t *testing.T) {
		info, err := mciAPIServerDiscovery(t, ctx, b).ServerVersion()
		require.NoError(t, err)
		assert.Equal(t, env.version, info.GitVersion)
		assert.Equal(t, env.revision, info.GitCommit)
	})
}

// mciAPIServerDiscovery is a discovery client of the cluster's
// mci-apiserver itself, not its aggregator, verified with the CA its
// APIService trusts.
func mciAPIServerDiscovery(t *testing.T, ctx context.Context, c *localclusterset.Cluster) *discovery.DiscoveryClient {
	t.Helper()
	apiServices := schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	name := v1alpha1.SchemeGroupVersion.Version + "." + v1alpha1.SchemeGroupVersion.Group
	svc, err := dynamic.NewForConfigOrDie(c.Config).Resource(apiServices).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	encoded, _, err := unstructured.NestedString(svc.Object, "spec", "caBundle")
	require.NoError(t, err)
	caBundle, err := base64.StdEncoding.DecodeString(encoded)
	require.NoError(t, err, "the APIService's caBundle")
	config := rest.CopyConfig(c.Config)
	config.Host = fmt.Sprintf("https://127.0.0.1:%d", c.MCIAPIServerReplicaPorts[0])
	config.CAFile, config.CAData, config.ServerName = "", caBundle, ""
	return discovery.NewDiscoveryClientForConfigOrDie(config)
}

// exportedPool is an InferencePool exported to the ClusterSet; its EPP
// Service need not exist for the import to be served.
func exportedPool(namespace, name string) *poolv1.InferencePool {
	return &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet},
		},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
}
