package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mciinformers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
	"github.com/mci-dev/mci/test/waitfor"
)

func TestImportsAreReadOnly(t *testing.T) {
	ctx := context.Background()
	b := clusterClients(t, "cluster-b")
	rc := b.mci.InferenceV1alpha1().RESTClient()
	body := `{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"InferencePoolImport","metadata":{"name":"x","namespace":"default"}}`
	for _, tc := range []struct {
		verb string
		do   func() error
	}{
		{"create", func() error {
			return rc.Post().Namespace("default").Resource("inferencepoolimports").Body([]byte(body)).Do(ctx).Error()
		}},
		{"delete", func() error {
			return rc.Delete().Namespace("default").Resource("inferencepoolimports").Name("x").Do(ctx).Error()
		}},
		{"deletecollection", func() error {
			return rc.Delete().Namespace("default").Resource("inferencepoolimports").Do(ctx).Error()
		}},
		{"update of status", func() error {
			return rc.Put().Namespace("default").Resource("inferencepoolimports").Name("x").SubResource("status").Body([]byte(body)).Do(ctx).Error()
		}},
	} {
		t.Run(tc.verb+" is refused with 405 and says why", func(t *testing.T) {
			err := tc.do()
			require.Error(t, err)
			var status apierrors.APIStatus
			require.ErrorAs(t, err, &status)
			assert.Equal(t, int32(http.StatusMethodNotAllowed), status.Status().Code)
			assert.Contains(t, err.Error(), "computed from the InferencePools")
		})
	}
}

func TestANamespaceScopedUserCanListImportsOnlyInItsNamespace(t *testing.T) {
	ctx := context.Background()
	b := clusterClients(t, "cluster-b")
	const ns = "e2e-rbac"
	b.createNamespace(t, ctx, ns)
	_, err := b.kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "import-reader"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"inferencepoolimports"}, Verbs: []string{"get", "list", "watch"},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = b.kube.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-reads-imports"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "import-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	cfg, err := clusters.UserConfig("cluster-b", "alice")
	require.NoError(t, err)
	alice := mciclient.NewForConfigOrDie(cfg).InferenceV1alpha1()

	// RBAC bindings take effect asynchronously in the authorizer's cache.
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		_, err := alice.InferencePoolImports(ns).List(ctx, metav1.ListOptions{})
		return err == nil, fmt.Sprintf("%v", err)
	})
	_, err = alice.InferencePoolImports("default").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "another namespace: %v", err)
	_, err = alice.InferencePoolImports(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "all namespaces: %v", err)
}

func TestAGeneratedInformerSyncsAndFollowsImports(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-informer"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)

	// Default client-go settings: the informer uses a streaming list
	// (sendInitialEvents) where the server supports it, else list+watch.
	factory := mciinformers.NewSharedInformerFactory(b.mci, 0)
	informer := factory.Inference().V1alpha1().InferencePoolImports().Informer()
	events := make(chan string, 100)
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o interface{}) { events <- "add " + o.(*v1alpha1.InferencePoolImport).Name },
		DeleteFunc: func(o interface{}) { events <- "delete " + keyName(o) },
	})
	require.NoError(t, err)
	factory.Start(ctx.Done())
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	require.True(t, cache.WaitForCacheSync(syncCtx.Done(), informer.HasSynced), "the informer must sync against mci-apiserver")

	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "watched", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	waitForEvent(t, events, "add watched")
	require.NoError(t, a.mci.InferencePoolV1().InferencePools(ns).Delete(ctx, "watched", metav1.DeleteOptions{}))
	waitForEvent(t, events, "delete watched")
}

func keyName(o interface{}) string {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	return o.(*v1alpha1.InferencePoolImport).Name
}

func waitForEvent(t *testing.T, events <-chan string, want string) {
	t.Helper()
	timeout := time.After(convergence)
	for {
		select {
		case got := <-events:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %q event within %s", want, convergence)
		}
	}
}

func TestAWatchResumesFromAResourceVersion(t *testing.T) {
	ctx := context.Background()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-resume"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	imports := b.mci.InferenceV1alpha1().InferencePoolImports(ns)
	list, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, list.ResourceVersion)

	// A change made while nobody watches...
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "later", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		imp, err := b.importOf(ctx, ns, "later")
		return err == nil && imp != nil, fmt.Sprintf("%v", err)
	})
	// ...is delivered to a watch that resumes from the list's version.
	w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		require.Equal(t, watch.Added, ev.Type)
		assert.Equal(t, "later", ev.Object.(*v1alpha1.InferencePoolImport).Name)
	case <-time.After(convergence):
		t.Fatal("the resumed watch did not deliver the change")
	}

	_, err = imports.Watch(ctx, metav1.ListOptions{ResourceVersion: "not-a-version"})
	assert.True(t, apierrors.IsBadRequest(err), "a resourceVersion this server never issued: %v", err)
}

func TestKubectlGetExplainAndYAML(t *testing.T) {
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Fatal("kubectl is required for this test")
	}
	ctx := context.Background()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-kubectl"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	a.createEPPService(t, ctx, ns, "127.0.0.8")
	a.setEPPEndpoint(t, ctx, ns, true)
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "cli", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		imp, err := b.importOf(ctx, ns, "cli")
		return err == nil && imp != nil && conditionStatus(imp.Status.Conditions, "Ready") == metav1.ConditionTrue, fmt.Sprintf("%v", err)
	})
	kb, err := clusters.Cluster("cluster-b")
	require.NoError(t, err)
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("kubectl", append([]string{"--kubeconfig", kb.Kubeconfig}, args...)...).CombinedOutput()
		require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
		return string(out)
	}

	table := kubectl("get", "ipimp", "-n", ns)
	assert.Regexp(t, `NAME\s+CLUSTERS\s+MODE\s+READY\s+AGE`, table)
	assert.Regexp(t, `cli\s+cluster-a\s+EndpointMode\s+True`, table)
	assert.Contains(t, kubectl("get", "infpimp", "-A"), "cli", "the upstream short name works too")
	yaml := kubectl("get", "inferencepoolimport", "cli", "-n", ns, "-o", "yaml")
	assert.Contains(t, yaml, "routingMode: EndpointMode")
	assert.Contains(t, yaml, "- 127.0.0.8")
	explain := kubectl("explain", "inferencepoolimport.status.clusters")
	assert.Contains(t, explain, "routingMode")
	assert.Contains(t, explain, "endpointPicker")
}
