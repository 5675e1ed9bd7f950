package clusterset

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/imports"
)

// A member whose token is revoked answers 401. It used to look like a
// partition: flagged ClusterUnreachable after --member-unreachable-after,
// and its pools left every import after --member-remove-after. It is
// flagged CredentialsRejected within a probe interval of refusing the
// token, and keeps its pools for as long as it answers.
func TestAMemberThatRefusesItsRevokedTokenIsFlaggedAndKeepsItsPools(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const ns, name = "revoked", "pool"
	local, _, proxy := exportingThroughProxy(t, ctx, ns, name)
	tm := newTokenMember(t, ctx, local, "https://"+proxy.addr())
	const removeAfter = 3 * time.Second
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: time.Second, RemoveAfter: removeAfter}, func(Event) {})
	source := make(reportingSource, 1)
	source <- map[string]MemberConfig{"remote": tm.memberConfig(tm.mint("token-1"))}
	go func() { _ = cache.Run(ctx, source) }()
	imported := func() bool {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		return ok && len(imp.Status.Clusters) == 1 && imp.Status.Clusters[0].Name == "remote"
	}
	reason := func() string {
		imp, _ := imports.Import(cache.Snapshot(), ns, name)
		return readyReason(imp)
	}
	require.Eventually(t, func() bool { return cache.Ready() == nil && imported() }, time.Minute, 50*time.Millisecond)
	require.Equal(t, "EndpointPickerNotFound", reason(), "the member's pool is imported, not flagged, while its token works (the test creates no EPP)")

	refused := tm.revoke("token-1")
	require.Eventually(t, func() bool { return reason() == "CredentialsRejected" }, 2*time.Second, 10*time.Millisecond,
		"flagged CredentialsRejected within a probe interval (1s by default) of the member refusing the token")
	t.Logf("flagged CredentialsRejected %s after the member first refused the revoked token", time.Since(refused).Round(10*time.Millisecond))
	assert.Never(t, func() bool { return !imported() || reason() != "CredentialsRejected" }, 2*removeAfter, 50*time.Millisecond,
		"past --member-remove-after the pool is still imported, flagged: a member that answers is not removed")
	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(`
# HELP mci_clusterset_member_credentials_rejected [ALPHA] 1 while the member answers but refuses the credentials this replica reads it with, for the reason named: unauthorized (401 to any request: expired, revoked or not its own) or forbidden (403 to its probe or to a list or watch mci needs); its last known data is served flagged CredentialsRejected and is not removed while it answers. Else 0.
# TYPE mci_clusterset_member_credentials_rejected gauge
mci_clusterset_member_credentials_rejected{member="local",reason="forbidden"} 0
mci_clusterset_member_credentials_rejected{member="local",reason="unauthorized"} 0
mci_clusterset_member_credentials_rejected{member="remote",reason="forbidden"} 0
mci_clusterset_member_credentials_rejected{member="remote",reason="unauthorized"} 1
# HELP mci_clusterset_member_removed [ALPHA] 1 while the member has not answered for --member-remove-after, so the pools it exported are not served, else 0.
# TYPE mci_clusterset_member_removed gauge
mci_clusterset_member_removed{member="local"} 0
mci_clusterset_member_removed{member="remote"} 0
# HELP mci_clusterset_member_unreachable [ALPHA] 1 while the member is flagged ClusterUnreachable (it has not answered for --member-unreachable-after; its last known data is kept), else 0.
# TYPE mci_clusterset_member_unreachable gauge
mci_clusterset_member_unreachable{member="local"} 0
mci_clusterset_member_unreachable{member="remote"} 0
`), "mci_clusterset_member_credentials_rejected", "mci_clusterset_member_removed", "mci_clusterset_member_unreachable"))

	// A new token heals it without a restart.
	source <- map[string]MemberConfig{"remote": tm.memberConfig(tm.mint("token-2"))}
	healed := time.Now()
	require.Eventually(t, func() bool { return reason() == "EndpointPickerNotFound" }, time.Minute, 20*time.Millisecond,
		"the pool is no longer flagged once the member has the new token")
	t.Logf("no longer flagged %s after the new token", time.Since(healed).Round(10*time.Millisecond))
}

// tokenMember reads a cluster as ServiceAccount credentials-test/reader,
// with tokens bound to Secrets: deleting a token's Secret revokes it.
type tokenMember struct {
	t      *testing.T
	ctx    context.Context
	kube   kubernetes.Interface
	server string
	ca     []byte
	tokens map[string]string
	// wrap, when set, wraps the member's transport, innermost.
	wrap func(http.RoundTripper) http.RoundTripper
}

const tokenNamespace, tokenAccount = "credentials-test", "reader"

func newTokenMember(t *testing.T, ctx context.Context, admin *rest.Config, server string) *tokenMember {
	t.Helper()
	kube := kubernetes.NewForConfigOrDie(admin)
	ca := admin.CAData
	if len(ca) == 0 {
		var err error
		ca, err = os.ReadFile(admin.CAFile)
		require.NoError(t, err)
	}
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tokenNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kube.CoreV1().ServiceAccounts(tokenNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: tokenAccount}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// What it may read is not what this test is about.
	_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "credentials-test-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: tokenNamespace, Name: tokenAccount}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return &tokenMember{t: t, ctx: ctx, kube: kube, server: server, ca: ca, tokens: map[string]string{}}
}

// mint returns a new token bound to a new Secret named binding.
func (tm *tokenMember) mint(binding string) string {
	tm.t.Helper()
	secret, err := tm.kube.CoreV1().Secrets(tokenNamespace).Create(tm.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: binding}}, metav1.CreateOptions{})
	require.NoError(tm.t, err)
	tr, err := tm.kube.CoreV1().ServiceAccounts(tokenNamespace).CreateToken(tm.ctx, tokenAccount, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: secret.Name, UID: secret.UID},
	}}, metav1.CreateOptions{})
	require.NoError(tm.t, err)
	tm.tokens[binding] = tr.Status.Token
	return tr.Status.Token
}

// revoke deletes the Secret the token of binding is bound to, and returns
// once the cluster refuses that token (kube-apiserver caches a token it
// accepted for 10 s).
func (tm *tokenMember) revoke(binding string) time.Time {
	tm.t.Helper()
	require.NoError(tm.t, tm.kube.CoreV1().Secrets(tokenNamespace).Delete(tm.ctx, binding, metav1.DeleteOptions{}))
	cfg := &rest.Config{Host: tm.server, BearerToken: tm.tokens[binding], TLSClientConfig: rest.TLSClientConfig{CAData: tm.ca}}
	probe := kubernetes.NewForConfigOrDie(cfg)
	var refused time.Time
	require.Eventually(tm.t, func() bool {
		_, err := probe.CoreV1().Namespaces().Get(tm.ctx, "default", metav1.GetOptions{})
		if apierrors.IsUnauthorized(err) {
			refused = time.Now()
			return true
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "the cluster refuses the revoked token")
	return refused
}

// memberConfig is the member's configuration with token, as a Secret's
// kubeconfig gives it, counted and answering as a cluster of its own.
func (tm *tokenMember) memberConfig(token string) MemberConfig {
	tm.t.Helper()
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["remote"] = &clientcmdapi.Cluster{Server: tm.server, CertificateAuthorityData: tm.ca}
	kubeconfig.AuthInfos["reader"] = &clientcmdapi.AuthInfo{Token: token}
	kubeconfig.Contexts["remote"] = &clientcmdapi.Context{Cluster: "remote", AuthInfo: "reader"}
	kubeconfig.CurrentContext = "remote"
	data, err := clientcmd.Write(*kubeconfig)
	require.NoError(tm.t, err)
	mc := parseSecretKubeconfig(data)
	require.NoError(tm.t, mc.err)
	if tm.wrap != nil {
		mc.rest.Wrap(tm.wrap)
	}
	mc.rest = asAnotherCluster(mc.rest, "remote-cluster-id")
	return mc
}
