package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
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
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterset"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

const importsPath = "/apis/" + v1alpha1.GroupName + "/v1alpha1/inferencepoolimports"

// directClient talks to cluster's mci-apiserver itself, not through the
// aggregator, presenting cert when it is not nil.
func directClient(t *testing.T, cert *tls.Certificate) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(clusters.MCIServingCA()))
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

func directGet(t *testing.T, client *http.Client, cluster, path string, header http.Header) (int, string) {
	t.Helper()
	c, err := clusters.Cluster(cluster)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", c.MCIAPIServerReplicaPorts[0], path), nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(body)
}

func TestSecurityAnonymousRequestsAreDenied(t *testing.T) {
	b, err := clusters.Cluster("cluster-b")
	require.NoError(t, err)

	t.Run("through the aggregator", func(t *testing.T) {
		anonymous := mciclient.NewForConfigOrDie(rest.AnonymousClientConfig(b.Config)).InferenceV1alpha1()
		_, err := anonymous.InferencePoolImports(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err), "anonymous list of imports: %v", err)
		_, err = anonymous.InferencePoolExports("default").List(t.Context(), metav1.ListOptions{})
		assert.True(t, apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err), "anonymous list of exports: %v", err)
	})

	t.Run("straight to mci-apiserver", func(t *testing.T) {
		client := directClient(t, nil)
		code, body := directGet(t, client, "cluster-b", "/readyz", nil)
		require.Equal(t, http.StatusOK, code, "health endpoints stay open to probes: %s", body)
		code, body = directGet(t, client, "cluster-b", importsPath, nil)
		assert.Contains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, code, "anonymous: %s", body)
		code, body = directGet(t, client, "cluster-b", "/apis/"+v1alpha1.GroupName+"/v1alpha1", nil)
		assert.Contains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, code, "anonymous discovery of the group: %s", body)
	})
}

// Only the aggregator may tell mci-apiserver who the user is: a client
// certificate from the requestheader CA counts only with the common name
// kube-apiserver lists in --requestheader-allowed-names, and identity
// headers from anyone else are ignored.
func TestSecurityTheRequestHeaderCAIsTrustedOnlyForTheAggregatorsName(t *testing.T) {
	admin := http.Header{"X-Remote-User": {"mci-e2e-admin"}, "X-Remote-Group": {"system:masters"}}
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) *http.Client
		allow  bool
	}{
		{"the aggregator's name may assert an identity", func(t *testing.T) *http.Client {
			cert, err := clusters.FrontProxyClientCert(localclusterset.FrontProxyClientName)
			require.NoError(t, err)
			return directClient(t, &cert)
		}, true},
		{"another name from the same CA may not", func(t *testing.T) *http.Client {
			cert, err := clusters.FrontProxyClientCert("intruder")
			require.NoError(t, err)
			return directClient(t, &cert)
		}, false},
		{"a user certificate's identity headers are ignored", func(t *testing.T) *http.Client {
			cfg, err := clusters.UserConfig("cluster-b", "mallory")
			require.NoError(t, err)
			cert, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
			require.NoError(t, err)
			return directClient(t, &cert)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := directGet(t, tc.client(t), "cluster-b", importsPath, admin)
			if tc.allow {
				assert.Equal(t, http.StatusOK, code, body)
				return
			}
			assert.Contains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, code, body)
			assert.NotContains(t, body, "mci-e2e-admin", "the asserted user must not be who the request runs as")
		})
	}
}

// Member credentials reach mci-apiserver through kubeconfig files and
// Secrets; none of them may show in its logs or in what it serves.
func TestSecurityNoSecretMaterialInLogsOrServedObjects(t *testing.T) {
	ctx := t.Context()
	b, c := clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-secrets"
	b.createNamespace(t, ctx, ns)
	c.createNamespace(t, ctx, ns)
	c.createEPPService(t, ctx, ns, "127.0.0.10")
	c.setEPPEndpoint(t, ctx, ns, true)
	_, err := c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	// cluster-b exports a pool too: its InferencePoolExport's status has a
	// row, with a message, for each member, "leaky" included.
	_, err = b.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "from-b", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	log := followLog(t, clusters, "cluster-b-mci-apiserver")

	// cluster-c joins cluster-b a second time, as "leaky", with the token
	// of a read-only ServiceAccount. A second name for a cluster already a
	// member is refused (its cluster ID is cluster-c's), but only once
	// mci-apiserver has used the token to read it: the token went through
	// its clients, and the refusal goes into its log and into cluster-b's
	// InferencePoolExport, where none of it may show...
	token := memberReaderToken(t, ctx, c, "e2e-leaky-reader", t)
	kc, err := clusters.Cluster("cluster-c")
	require.NoError(t, err)
	kubeconfig := tokenKubeconfig(t, "leaky", kc.Server, kc.Config.CAData, token)
	secrets := b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace)
	member := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "member-leaky", Labels: map[string]string{clusterset.MemberClusterLabel: "leaky"}},
		Data:       map[string][]byte{clusterset.MemberKubeconfigKey: kubeconfig},
	}
	_, err = secrets.Create(ctx, member, metav1.CreateOptions{})
	require.NoError(t, err)
	// ...and a broken kubeconfig carries a marker where a parse error could
	// quote it.
	const marker = "mci-e2e-do-not-log-4c1f"
	broken := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "member-broken", Labels: map[string]string{clusterset.MemberClusterLabel: "broken"}},
		Data:       map[string][]byte{clusterset.MemberKubeconfigKey: []byte("users:\n- name: x\n  user:\n    token: " + marker + "\n    password: [" + marker)},
	}
	_, err = secrets.Create(ctx, broken, metav1.CreateOptions{})
	require.NoError(t, err)
	cleanup := func() {
		_ = secrets.Delete(context.Background(), member.Name, metav1.DeleteOptions{})
		_ = secrets.Delete(context.Background(), broken.Name, metav1.DeleteOptions{})
	}
	defer cleanup()
	t.Logf("refused: %s", waitForIdentityRefusal(t, log, "cluster-b", "leaky", "cluster-c"))
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		st, err := exportStatus(ctx, b, ns, "from-b")
		if err != nil {
			return false, err.Error()
		}
		return st["leaky"] == v1alpha1.ReasonClusterUnreachable, fmt.Sprintf("%v", st)
	})
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-c:Ready")

	// What every server was given, and must keep to itself.
	forbidden := map[string]string{
		"the member token":             token,
		"the member token's signature": token[strings.LastIndex(token, ".")+1:],
		"the broken Secret's marker":   marker,
		"a PEM private key":            "PRIVATE KEY",
		"kubeconfig key data":          "client-key-data",
	}
	for _, name := range clusters.Names() {
		data, err := os.ReadFile(clusters.MembersDir() + "/" + name + ".kubeconfig")
		require.NoError(t, err)
		cfg, err := clientcmd.Load(data)
		require.NoError(t, err)
		for _, auth := range cfg.AuthInfos {
			key := base64.StdEncoding.EncodeToString(auth.ClientKeyData)
			forbidden[name+" member key (base64)"] = key[len(key)/2:][:40]
			forbidden[name+" member key (PEM)"] = strings.Split(string(auth.ClientKeyData), "\n")[1]
		}
	}

	// Served objects: imports and exports, as objects and as tables.
	var served []string
	for _, cl := range []*cluster{b, c} {
		rc := cl.mci.InferenceV1alpha1().RESTClient()
		for _, resource := range []string{"inferencepoolimports", "inferencepoolexports"} {
			raw, err := rc.Get().Resource(resource).DoRaw(ctx)
			require.NoError(t, err)
			served = append(served, string(raw))
			raw, err = rc.Get().Resource(resource).SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
			require.NoError(t, err)
			served = append(served, string(raw))
		}
	}
	imp, err := b.importOf(ctx, ns, "llm")
	require.NoError(t, err)
	raw, err := json.Marshal(imp)
	require.NoError(t, err)
	served = append(served, string(raw))
	for what, secret := range forbidden {
		for _, s := range served {
			assert.NotContains(t, s, secret, "a served object contains %s", what)
		}
	}

	// Logs, after the member left again (its disconnection is logged too).
	cleanup()
	waitForImportClusters(t, ctx, b, ns, "llm", "cluster-c:Ready")
	var checked int
	for _, p := range clusters.Processes() {
		if !strings.Contains(p.Name, "mci-apiserver") {
			continue
		}
		data, err := os.ReadFile(p.Log)
		require.NoError(t, err)
		checked++
		for what, secret := range forbidden {
			assert.NotContains(t, string(data), secret, "%s's log contains %s", p.Name, what)
		}
	}
	require.NotZero(t, checked, "no mci-apiserver log found")
}

// memberReaderToken creates a ServiceAccount in c bound to the member
// reader role and returns a token of it. The ServiceAccount goes away when
// owner ends (t, or a parent test that uses it longer).
func memberReaderToken(t *testing.T, ctx context.Context, c *cluster, name string, owner testing.TB) string {
	t.Helper()
	ns := localclusterset.MCIAPIServerNamespace
	_, err := c.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	owner.Cleanup(func() {
		_ = c.kube.CoreV1().ServiceAccounts(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	bindMemberReader(t, ctx, c.kube, ns, name, owner)
	tr, err := c.kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}

// memberReaderRoles are what the identity a member hands to the others
// may do: read its summaries (summary mode) and its objects (full mode,
// which servers started with --member-summaries=never use).
var memberReaderRoles = []string{"mci-member-summary-reader", "mci-member-reader"}

// bindMemberReader binds memberReaderRoles to the ServiceAccount
// namespace/name, until owner's cleanup.
func bindMemberReader(t *testing.T, ctx context.Context, kube kubernetes.Interface, namespace, name string, owner testing.TB) {
	t.Helper()
	for _, role := range memberReaderRoles {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}},
		}
		_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
		require.NoError(t, err)
		owner.Cleanup(func() {
			_ = kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		})
	}
}

// tokenKubeconfig is a one-context kubeconfig that authenticates with a
// bearer token.
func tokenKubeconfig(t *testing.T, name, server string, ca []byte, token string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	require.NoError(t, err)
	return data
}
