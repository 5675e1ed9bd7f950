package clusterset

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/testutil"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/test/localclusterset"
)

// Reading Pods is the one permission mci does without. A member identity
// that may not list them (a member-reader role from before exports
// published their pods' addresses) is served: it holds back neither the
// cache's readiness nor the rest of what it exports, and it is not taken
// as rejecting its credentials. Its exports publish no addresses, with a
// reason that says what to grant, and do once the permission is granted.
func TestAMemberThatMayNotListPodsIsServedAndPublishesNoAddresses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const ns, name, podIP = "no-pods", "pool", "10.1.0.5"
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"local"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	local := cs.Clusters[0].Config
	admin := kubernetes.NewForConfigOrDie(local)
	createExportedPool(ctx, t, local, ns, name)
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "model-server", Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "model", Image: "model"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}}}
	_, err = admin.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)

	// The member reads the same kube-apiserver as another cluster, as an
	// identity that may read everything mci reads but Pods.
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces", "services"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"gateways", "backendtlspolicies"}, Verbs: []string{"get", "list", "watch"}},
	}
	role, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "member-without-pods"}, Rules: rules}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "member-without-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "member-without-pods"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	remote := rest.CopyConfig(local)
	remote.Impersonate = rest.ImpersonationConfig{UserName: "member-without-pods"}
	remote = asAnotherCluster(remote, "remote-cluster-id")

	logged := captureKlog(t)
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 5 * time.Second, RemoveAfter: time.Minute, Summaries: SummariesNever}, func(Event) {})
	go func() { _ = cache.Run(ctx, staticSource{"remote": {rest: remote, fingerprint: "1"}}) }()

	entry := func() (inference.ImportedCluster, bool) {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		if !ok || len(imp.Status.Clusters) != 1 {
			return inference.ImportedCluster{}, false
		}
		return imp.Status.Clusters[0], true
	}
	readyCondition := func(c inference.ImportedCluster) metav1.Condition {
		for _, cond := range c.Conditions {
			if cond.Type == v1alpha1.ConditionReady {
				return cond
			}
		}
		return metav1.Condition{}
	}
	require.Eventually(t, func() bool {
		c, ok := entry()
		return cache.Ready() == nil && ok && readyCondition(c).Reason == v1alpha1.ReasonInvalidEndpointAddresses
	}, time.Minute, 50*time.Millisecond, "the cache is ready and the member's export is imported, publishing no addresses")
	c, _ := entry()
	assert.Empty(t, c.EndpointAddresses)
	assert.Equal(t, metav1.ConditionFalse, readyCondition(c).Status)
	assert.Contains(t, readyCondition(c).Message, "may not list the pods of namespace no-pods")
	assert.Nil(t, memberView(cache, "remote").Unreachable, "not flagged: neither unreachable nor rejecting its credentials")
	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(`
# HELP mci_clusterset_member_pods_forbidden [ALPHA] Namespaces of the member's pools whose Pods the credentials this replica reads it with may not list (403): the exports there publish no endpoint addresses (or the last ones listed), so importers accept no destination their EPPs name. The rest of the member is served. 0 when it may list them all.
# TYPE mci_clusterset_member_pods_forbidden gauge
mci_clusterset_member_pods_forbidden{member="local"} 0
mci_clusterset_member_pods_forbidden{member="remote"} 1
`), "mci_clusterset_member_pods_forbidden"))

	// Granted: the next list of the member's Pods publishes the address.
	role.Rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}})
	_, err = admin.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, ok := entry()
		return ok && len(c.EndpointAddresses) == 1 && c.EndpointAddresses[0] == podIP
	}, time.Minute, 100*time.Millisecond, "the pod's address is published once the member's credentials may list pods")
	c, _ = entry()
	assert.NotEqual(t, v1alpha1.ReasonInvalidEndpointAddresses, readyCondition(c).Reason)
	require.Eventually(t, func() bool {
		return strings.Count(logged.String(), `"Member's pods can be listed again`) == 1
	}, 10*time.Second, 100*time.Millisecond, "the member's pods said readable again")
	assert.Empty(t, cache.member("remote").poolNamespaces.podsDenied(), "no longer counted as forbidden")
	assert.Equal(t, 1, strings.Count(logged.String(), `"Member's credentials may not list pods`), "said once, not at every retry of the list:\n%s", logged.String())
	assert.NotContains(t, logged.String(), "Member rejects this server's credentials")
}
