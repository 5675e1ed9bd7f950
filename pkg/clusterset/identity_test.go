package clusterset

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
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

	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/test/localclusterset"
)

func TestOfTwoMembersOfOneClusterTheOneThatJoinedLaterIsRefused(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		claims []clusterClaim
		want   map[string]string // refused member: the member keeping the cluster
	}{
		{name: "different clusters: nobody is refused", claims: []clusterClaim{
			{member: "a", id: "1", joined: t0}, {member: "b", id: "2", joined: t0},
		}, want: map[string]string{}},
		{name: "the member whose Secret was created later is refused, whatever its name", claims: []clusterClaim{
			{member: "zz", id: "1", joined: t0}, {member: "aa", id: "1", joined: t0.Add(time.Second)},
		}, want: map[string]string{"aa": "zz"}},
		{name: "joined at once: the name that sorts later is refused", claims: []clusterClaim{
			{member: "cluster-twin", id: "1", joined: t0}, {member: "cluster-c", id: "1", joined: t0},
		}, want: map[string]string{"cluster-twin": "cluster-c"}},
		{name: "a kubeconfig file counts as joined before any Secret", claims: []clusterClaim{
			{member: "from-secret", id: "1", joined: t0}, {member: "z-from-file", id: "1"},
		}, want: map[string]string{"from-secret": "z-from-file"}},
		{name: "the local cluster is never refused", claims: []clusterClaim{
			{member: "a-alias", id: "1"}, {member: "local", id: "1", local: true, joined: t0},
		}, want: map[string]string{"a-alias": "local"}},
		{name: "three names for one cluster: the first keeps it, both others are refused", claims: []clusterClaim{
			{member: "c", id: "1", joined: t0.Add(2 * time.Second)}, {member: "b", id: "1", joined: t0.Add(time.Second)}, {member: "a", id: "1", joined: t0.Add(time.Second)},
		}, want: map[string]string{"b": "a", "c": "a"}},
		{name: "a member and its replacement still listing do not refuse each other", claims: []clusterClaim{
			{member: "a", id: "1", joined: t0}, {member: "a", id: "1", joined: t0},
		}, want: map[string]string{}},
		{name: "an unknown ID claims nothing", claims: []clusterClaim{
			{member: "a", joined: t0}, {member: "b", joined: t0},
		}, want: map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for claim, keeper := range refusals(tc.claims) {
				got[claim.member] = keeper
			}
			assert.Equal(t, tc.want, got)
			// Every replica decides the same, in whatever order it read
			// the members.
			reversed := make([]clusterClaim, len(tc.claims))
			for i, c := range tc.claims {
				reversed[len(tc.claims)-1-i] = c
			}
			again := map[string]string{}
			for claim, keeper := range refusals(reversed) {
				again[claim.member] = keeper
			}
			assert.Equal(t, got, again, "the order the claims were read in changes nothing")
		})
	}
}

// Two members read in full mode whose kubeconfigs reach one cluster (the
// same kubeconfig in two Secrets): full mode reads no cluster name, so
// nothing used to tell them apart, and the cluster's exports were imported
// twice, under both names. Now the member whose name sorts later (both
// joined at once) is refused as the summary case is: frozen at quota
// identity, nothing of it served, flagged, said once however often it is
// read again. A third member whose credentials may not read kube-system is
// served as before, and said so (log and metric). Once the member that
// kept the cluster leaves, the refused one is served.
func TestASecondMemberNameForAClusterIsRefusedInFullMode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	defer restoreModeTimings(time.Second)()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const ns, name = "identity", "pool"
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"local", "remote"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	local, remote := cs.Clusters[0].Config, cs.Clusters[1].Config
	_, err = kubernetes.NewForConfigOrDie(local).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	createExportedPool(ctx, t, remote, ns, name)
	logged := captureKlog(t)

	// A member identity that may read the six kinds and not kube-system,
	// as member Secrets minted before the check.
	admin := kubernetes.NewForConfigOrDie(remote)
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "old-member-reader"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"namespaces", "services"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"gateways", "backendtlspolicies"}, Verbs: []string{"get", "list", "watch"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "old-member-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "old-member-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "old-member"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The old member is the same cluster: its ID not being read, it is
	// not refused (and its pool is imported under its name too, which is
	// what the missing permission costs).
	old := rest.CopyConfig(remote)
	old.Impersonate = rest.ImpersonationConfig{UserName: "old-member"}
	kubeSystem, err := admin.CoreV1().Namespaces().Get(ctx, clusterIDNamespace, metav1.GetOptions{})
	require.NoError(t, err)

	limits := DefaultLimits
	limits.FreezeRetry = time.Second
	var mu sync.Mutex
	twinEvents := 0
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 5 * time.Second, RemoveAfter: time.Minute, Summaries: SummariesNever, Limits: limits}, func(ev Event) {
		if ev.Member == "cluster-twin" && ev.Kind == KindMember {
			mu.Lock()
			twinEvents++
			mu.Unlock()
		}
	})
	// The same kubeconfig for two member names, and the old identity.
	source := make(reportingSource, 1)
	source <- map[string]MemberConfig{
		"cluster-c":    {rest: remote, fingerprint: "1"},
		"cluster-twin": {rest: remote, fingerprint: "1"},
		"old":          {rest: old, fingerprint: "1"},
	}
	go func() { _ = cache.Run(ctx, source) }()

	require.Eventually(t, func() bool {
		twin := cache.member("cluster-twin")
		if twin == nil {
			return false
		}
		reason, _, _ := twin.quota.state()
		return cache.Ready() == nil && reason == quotaIdentity
	}, time.Minute, 50*time.Millisecond, "the member whose name sorts later is refused")
	_, _, message := cache.member("cluster-twin").quota.state()
	assert.Contains(t, message, `the member named "cluster-c"`)
	assert.Contains(t, message, string(kubeSystem.UID))
	reason, _, _ := cache.member("cluster-c").quota.state()
	assert.Empty(t, reason, "the member that keeps the cluster is served")

	imported := func() []string {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		if !ok {
			return nil
		}
		var names []string
		for _, c := range imp.Status.Clusters {
			names = append(names, c.Name)
		}
		return names
	}
	require.Eventually(t, func() bool { return strings.Join(imported(), ",") == "cluster-c,old" }, 30*time.Second, 50*time.Millisecond,
		"the pool is imported from cluster-c, and from the member whose ID could not be read, not from the refused twin")
	v := memberView(cache, "cluster-twin")
	require.NotNil(t, v.Unreachable, "the refused member is flagged")
	assert.Contains(t, v.Unreachable.Message, "under a second name")
	_, err = v.Namespaces.Get(ns)
	assert.Error(t, err, "nothing of the refused member is served, not even its namespaces")

	// It is read again every --member-freeze-retry, refused each time
	// (each fresh read that freezes is a member event), and said once.
	refusedAt := cache.member("cluster-twin")
	mu.Lock()
	seen := twinEvents
	mu.Unlock()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return twinEvents >= seen+3
	}, 30*time.Second, 50*time.Millisecond, "read again and refused at least three more times")
	assert.Same(t, refusedAt, cache.member("cluster-twin"), "the refused member stays, its fresh reads are dropped")
	assert.Equal(t, 1, strings.Count(logged.String(), `"Member frozen: it speaks for another cluster`), "the refusal is logged once, not at every fresh read:\n%s", logged.String())
	assert.Equal(t, 1, strings.Count(logged.String(), `"Cannot read the member's cluster ID`), "the unread ID is logged once")
	assert.Equal(t, 1, strings.Count(logged.String(), `"Reading the frozen member again`), "its first read again is said, not every one")
	assert.Contains(t, logged.String(), `member="old" reason="forbidden"`)

	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(`
# HELP mci_clusterset_member_cluster_id_unknown [ALPHA] 1 while the member's cluster ID (the uid of its kube-system Namespace) cannot be read, for the reason named: forbidden (its credentials may not get that Namespace) or error; whether it is another member's cluster under a second name is then not checked, and it is served as it is. Else 0.
# TYPE mci_clusterset_member_cluster_id_unknown gauge
mci_clusterset_member_cluster_id_unknown{member="cluster-c",reason="error"} 0
mci_clusterset_member_cluster_id_unknown{member="cluster-c",reason="forbidden"} 0
mci_clusterset_member_cluster_id_unknown{member="cluster-twin",reason="error"} 0
mci_clusterset_member_cluster_id_unknown{member="cluster-twin",reason="forbidden"} 0
mci_clusterset_member_cluster_id_unknown{member="local",reason="error"} 0
mci_clusterset_member_cluster_id_unknown{member="local",reason="forbidden"} 0
mci_clusterset_member_cluster_id_unknown{member="old",reason="error"} 0
mci_clusterset_member_cluster_id_unknown{member="old",reason="forbidden"} 1
`), "mci_clusterset_member_cluster_id_unknown"))
	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(`
# HELP mci_clusterset_member_frozen [ALPHA] 1 while the member is frozen because it exceeded the limit named by quota (objects, bytes, namespaces, eventRate, responseBytes, identity, resourceVersion): its last known data is served flagged ClusterUnreachable and nothing more it sends is applied; else 0.
# TYPE mci_clusterset_member_frozen gauge
mci_clusterset_member_frozen{member="cluster-c",quota="bytes"} 0
mci_clusterset_member_frozen{member="cluster-c",quota="eventRate"} 0
mci_clusterset_member_frozen{member="cluster-c",quota="identity"} 0
mci_clusterset_member_frozen{member="cluster-c",quota="namespaces"} 0
mci_clusterset_member_frozen{member="cluster-c",quota="objects"} 0
mci_clusterset_member_frozen{member="cluster-c",quota="resourceVersion"} 0
mci_clusterset_member_frozen{member="cluster-c",quota="responseBytes"} 0
mci_clusterset_member_frozen{member="cluster-twin",quota="bytes"} 0
mci_clusterset_member_frozen{member="cluster-twin",quota="eventRate"} 0
mci_clusterset_member_frozen{member="cluster-twin",quota="identity"} 1
mci_clusterset_member_frozen{member="cluster-twin",quota="namespaces"} 0
mci_clusterset_member_frozen{member="cluster-twin",quota="objects"} 0
mci_clusterset_member_frozen{member="cluster-twin",quota="resourceVersion"} 0
mci_clusterset_member_frozen{member="cluster-twin",quota="responseBytes"} 0
mci_clusterset_member_frozen{member="old",quota="bytes"} 0
mci_clusterset_member_frozen{member="old",quota="eventRate"} 0
mci_clusterset_member_frozen{member="old",quota="identity"} 0
mci_clusterset_member_frozen{member="old",quota="namespaces"} 0
mci_clusterset_member_frozen{member="old",quota="objects"} 0
mci_clusterset_member_frozen{member="old",quota="resourceVersion"} 0
mci_clusterset_member_frozen{member="old",quota="responseBytes"} 0
`), "mci_clusterset_member_frozen"))

	// The member that kept the cluster leaves: the next read of the
	// refused one finds no other member with its cluster ID, and serves it.
	source <- map[string]MemberConfig{
		"cluster-twin": {rest: remote, fingerprint: "1"},
		"old":          {rest: old, fingerprint: "1"},
	}
	require.Eventually(t, func() bool {
		reason, _, _ := cache.member("cluster-twin").quota.state()
		return reason == "" && strings.Join(imported(), ",") == "cluster-twin,old"
	}, 30*time.Second, 50*time.Millisecond, "served under its name once it is the cluster's only one")
	// The line is said just after the member is swapped in, so it may
	// follow the condition above by a moment.
	assert.Eventually(t, func() bool {
		return strings.Contains(logged.String(), `"Member read again within its limits: it is no longer frozen" member="cluster-twin"`)
	}, 5*time.Second, 10*time.Millisecond, "the end of the freeze is said:\n%s", logged.String())
}

// asAnotherCluster returns config, reaching the same kube-apiserver, with
// the identity of another cluster: its kube-system Namespace is answered
// with uid id, in the member's own transport, and every other request goes
// through. Tests that read one kube-apiserver as the local cluster and as
// a member (a cheaper ClusterSet than one kube-apiserver per cluster) use
// it so that the member is not refused as the local cluster under a second
// name.
func asAnotherCluster(config *rest.Config, id string) *rest.Config {
	config = rest.CopyConfig(config)
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet || r.URL.Path != "/api/v1/namespaces/"+clusterIDNamespace {
				return rt.RoundTrip(r)
			}
			body := fmt.Sprintf(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":%q,"uid":%q}}`, clusterIDNamespace, id)
			return &http.Response{
				StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header:  http.Header{"Content-Type": []string{"application/json"}},
				Body:    io.NopCloser(strings.NewReader(body)),
				Request: r, ContentLength: int64(len(body)),
			}, nil
		})
	})
	return config
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
