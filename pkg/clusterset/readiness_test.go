package clusterset

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/testutil"

	"github.com/mci-dev/mci/pkg/imports"
)

// A replica that starts while one member refuses its credentials has
// nothing of that member, and never will while the credentials stay
// refused: the member answers, so it is never removed. It used to hold
// readiness until --member-remove-after from joining, so every replica
// restarted during an operator's mistake on one member was out of service
// for that long. Once the member is flagged CredentialsRejected it no
// longer holds readiness: the replica serves it flagged, with none of its
// pools until it lists, in either mode the member is read in.
func TestAReplicaStartedWhileAMemberRefusesItsCredentialsIsReady(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const ns, name = "refused", "pool"
	local := summaryServingCluster(t, ctx)
	createExportedPool(ctx, t, local, ns, name)
	publishSummaries(t, ctx, local, "remote", ns, name)
	admin := kubernetes.NewForConfigOrDie(local)

	for _, tc := range []struct {
		mode      memberMode
		summaries Summaries
		// listed says the member's pool is served once it lists.
		listed func(c *Cache) bool
	}{
		// The local cluster's own pools are not imported: the import is
		// the member's pool.
		{mode: modeFull, summaries: SummariesNever, listed: func(c *Cache) bool {
			imp, ok := imports.Import(c.Snapshot(), ns, name)
			return ok && len(imp.Status.Clusters) == 1 && imp.Status.Clusters[0].Name == "remote"
		}},
		{mode: modeSummary, listed: func(c *Cache) bool { return len(summariesOf(c, "remote")) == 1 }},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			// The member is the same kube-apiserver, read as a user no
			// role binding names: it answers its probe and its
			// discovery, and refuses every list with 403.
			user := "readiness-" + string(tc.mode)
			remote := rest.CopyConfig(local)
			remote.Impersonate = rest.ImpersonationConfig{UserName: user}
			logged := captureKlog(t)
			// The removal threshold is far beyond the test: it is not what
			// makes the replica ready.
			cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 5 * time.Second, RemoveAfter: time.Hour, Summaries: tc.summaries}, func(Event) {})
			started := time.Now()
			go func() {
				_ = cache.Run(ctx, staticSource{"remote": {rest: asAnotherCluster(remote, "remote-cluster-id"), fingerprint: "1"}})
			}()

			require.Eventually(t, func() bool { return cache.Ready() == nil }, 30*time.Second, 20*time.Millisecond,
				"ready once the member is flagged CredentialsRejected, not at the removal threshold")
			t.Logf("ready %s after the cache started", time.Since(started).Round(10*time.Millisecond))
			m := cache.member("remote")
			require.NotNil(t, m)
			assert.Equal(t, tc.mode, m.mode)
			assert.False(t, m.hasSynced(), "the member has listed nothing")
			v := memberView(cache, "remote")
			require.NotNil(t, v.Unreachable, "served flagged")
			assert.True(t, v.Unreachable.CredentialsRejected)
			assert.False(t, tc.listed(cache), "none of its pools is served: nothing of it was listed")
			_, imported := imports.Import(cache.Snapshot(), ns, name)
			assert.False(t, imported, "no cluster exports the pool to this one")
			assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(`
# HELP mci_clusterset_member_credentials_rejected [ALPHA] 1 while the member answers but refuses the credentials this replica reads it with, for the reason named: unauthorized (401 to any request: expired, revoked or not its own) or forbidden (403 to its probe or to a list or watch mci needs); its last known data is served flagged CredentialsRejected and is not removed while it answers. Else 0.
# TYPE mci_clusterset_member_credentials_rejected gauge
mci_clusterset_member_credentials_rejected{member="local",reason="forbidden"} 0
mci_clusterset_member_credentials_rejected{member="local",reason="unauthorized"} 0
mci_clusterset_member_credentials_rejected{member="remote",reason="forbidden"} 1
mci_clusterset_member_credentials_rejected{member="remote",reason="unauthorized"} 0
`), "mci_clusterset_member_credentials_rejected"))
			// Said by the log line of every change of the rejection (a
			// refused path added to it is one), not by one of its own.
			assert.Contains(t, logged.String(), `"Member rejects this server's credentials: its last known data is kept, flagged CredentialsRejected" member="remote" reason="forbidden"`)

			// Granted: the member lists at its informers' next retry and
			// is no longer flagged, without a restart.
			_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: user},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			granted := time.Now()
			require.Eventually(t, func() bool {
				return tc.listed(cache) && memberView(cache, "remote").Unreachable == nil && cache.Ready() == nil
			}, 90*time.Second, 50*time.Millisecond, "served, unflagged, once it lists")
			t.Logf("listed and served %s after the grant", time.Since(granted).Round(10*time.Millisecond))
		})
	}
}
