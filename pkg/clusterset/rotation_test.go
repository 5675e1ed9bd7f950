package clusterset

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/credexpiry"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/test/localclusterset"
)

// A rotated token (the routine: a new one minted, the Secret changed, the
// old one revoked) is swapped into the member's connection: the member's
// watches go on, resume with the new token from their last
// resourceVersion when they end, and nothing is listed again.
func TestARotatedTokenIsSwappedInWithoutARelistOrAWatchGap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const ns, name = "rotated", "pool"
	local, _, proxy := exportingThroughProxy(t, ctx, ns, name)
	tm := newTokenMember(t, ctx, local, "https://"+proxy.addr())
	requests := &requestCounter{}
	tm.wrap = requests.wrap
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 2 * time.Second, RemoveAfter: time.Minute}, func(Event) {})
	source := make(reportingSource, 1)
	source <- map[string]MemberConfig{"remote": tm.memberConfig(tm.mint("token-1"))}
	go func() { _ = cache.Run(ctx, source) }()
	importedPool := func(name string) bool {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		// Not flagged: the test creates no EPP, so not Ready either.
		return ok && len(imp.Status.Clusters) == 1 && readyReason(imp) == v1alpha1.ReasonEndpointPickerNotFound
	}
	require.Eventually(t, func() bool { return cache.Ready() == nil && importedPool(name) }, time.Minute, 50*time.Millisecond)
	before := cache.member("remote")
	lists := requests.lists()

	// Watch the member's view from the rotation on: the pool must stay
	// imported and unflagged throughout.
	stopSampling := sampleGaps(ctx, func() bool { return importedPool(name) })

	token2 := tm.mint("token-2")
	rotated := tm.memberConfig(token2)
	source <- map[string]MemberConfig{"remote": rotated}
	require.Eventually(t, func() bool {
		src, _ := cache.member("remote").current()
		return src == "reporting#"+rotated.fingerprint
	}, 10*time.Second, 10*time.Millisecond, "the rotated kubeconfig is in use")
	tm.revoke("token-1")

	// End every connection to the member, the watches' included, as an
	// apiserver's watch timeout or a load balancer would: the reflectors
	// resume their watches, which the old token could no longer open.
	requests.waitForWatchesOlderThanASecond(t)
	requests.mark()
	proxy.resetConns()
	require.Eventually(t, func() bool { return requests.watchesSinceMark() > 0 }, 30*time.Second, 10*time.Millisecond,
		"the member's watches resume")
	// A change made after the old token was revoked reaches the cache
	// through the resumed watches.
	pool := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "after-rotation", Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": "after-rotation"}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
	_, err := mciclient.NewForConfigOrDie(local).InferencePoolV1().InferencePools(ns).Create(ctx, pool, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return importedPool("after-rotation") }, 10*time.Second, 10*time.Millisecond,
		"a pool created after the rotation reaches the imports")
	gaps := stopSampling()

	assert.True(t, before == cache.member("remote"), "the member was not reconnected")
	assert.Equal(t, lists, requests.lists(), "nothing was listed again")
	watches, withOld, withNew := requests.watchTokensSinceMark(tm.tokens["token-1"], token2)
	assert.Zero(t, withOld, "no watch resumed with the revoked token")
	assert.Equal(t, watches, withNew, "every resumed watch carries the new token")
	assert.Empty(t, gaps, "the pool stayed imported and unflagged throughout")
	assert.Nil(t, cache.member("remote").credentials.rejected())
	t.Logf("lists of the member: %d before the rotation, %d after; %d watches resumed, all with the new token", lists, requests.lists(), watches)

	// A new token the member refuses does not replace the one that
	// works: the connection in use goes on serving, unflagged.
	source <- map[string]MemberConfig{"remote": tm.memberConfig("not-a-token")}
	assertStaysInUse(t, ctx, cache, rotated, func() bool { return importedPool(name) }, "the working token stays in use")
}

// A rotated client certificate (a new certificate and key from the same
// CA, and then a CA bundle that gains a second CA) is taken in place as a
// rotated token is: the member's watches go on, every request from the
// rotation on presents the new certificate (over a connection of its own:
// the member's kube-apiserver verifies the certificate at every request,
// and the old connection, which HTTP/2 would reuse, carries the old one),
// the watches resume with it from their last resourceVersion when they
// end, and nothing is listed again. A CA bundle that does not verify the
// member is not taken in place.
func TestARotatedClientCertificateIsSwappedInWithoutARelistOrAWatchGap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const ns, name = "certrotated", "pool"
	cs, local, _, proxy := exportingClusterSetThroughProxy(t, ctx, ns, name)
	cm := newCertMember(t, ctx, cs, local, ns, "https://"+proxy.addr())
	requests := &requestCounter{}
	cm.wrap = requests.wrap
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 2 * time.Second, RemoveAfter: time.Minute}, func(Event) {})
	source := make(reportingSource, 1)
	user1 := cm.mint("cert-reader-1")
	source <- map[string]MemberConfig{"remote": cm.memberConfig(user1, cm.ca)}
	go func() { _ = cache.Run(ctx, source) }()
	importedPool := func(name string) bool {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		// Not flagged: the test creates no EPP, so not Ready either.
		return ok && len(imp.Status.Clusters) == 1 && readyReason(imp) == v1alpha1.ReasonEndpointPickerNotFound
	}
	require.Eventually(t, func() bool { return cache.Ready() == nil && importedPool(name) }, time.Minute, 50*time.Millisecond)
	before := cache.member("remote")
	require.Equal(t, "cert-reader-1", whoami(t, ctx, before), "the member is read as the first certificate's user")
	lists := requests.lists()

	stopSampling := sampleGaps(ctx, func() bool { return importedPool(name) })

	// A certificate's dates are whole seconds: the second is minted in a
	// later second than the first, so that the expiry metric can tell
	// them apart.
	time.Sleep(time.Until(user1.mintedBy.Truncate(time.Second).Add(time.Second)))
	user2 := cm.mint("cert-reader-2")
	require.NotEqual(t, user1.notAfter, user2.notAfter, "the two certificates end at different times")
	rotated := cm.memberConfig(user2, cm.ca)
	rotatedAt := time.Now()
	source <- map[string]MemberConfig{"remote": rotated}
	require.Eventually(t, func() bool {
		src, _ := cache.member("remote").current()
		return src == "reporting#"+rotated.fingerprint
	}, 10*time.Second, 10*time.Millisecond, "the rotated kubeconfig is in use")
	assert.True(t, before == cache.member("remote"), "the member was not reconnected for the new certificate")
	assert.Equal(t, lists, requests.lists(), "nothing was listed for the new certificate")
	// The watches opened with the old certificate are still open, on the
	// old connection; a new request goes on a new one, with the new
	// certificate.
	assert.Equal(t, "cert-reader-2", whoami(t, ctx, cache.member("remote")), "a request after the rotation presents the new certificate")
	assert.True(t, user2.notAfter.Equal(cache.member("remote").credentials.expiries()[credentialClientCertificate].at),
		"the expiry metric has the new certificate's NotAfter")
	cm.revoke("cert-reader-1")

	// End the connections opened before the rotation, the watches'
	// included: the reflectors resume their watches, which the old
	// certificate may no longer open.
	requests.waitForWatchesOlderThanASecond(t)
	requests.mark()
	proxy.resetConnsOpenedBefore(rotatedAt)
	require.Eventually(t, func() bool { return requests.watchesSinceMark() > 0 }, 30*time.Second, 10*time.Millisecond,
		"the member's watches resume")
	createPool(t, ctx, local, ns, "after-rotation")
	require.Eventually(t, func() bool { return importedPool("after-rotation") }, 10*time.Second, 10*time.Millisecond,
		"a pool created after the rotation reaches the imports")

	// A CA bundle that gains a CA, and still verifies the member, is
	// taken in place too.
	other, _ := selfSignedKeyPair(t, time.Now().Add(time.Hour))
	bundle := cm.memberConfig(user2, append(append([]byte{}, cm.ca...), other...))
	bundledAt := time.Now()
	source <- map[string]MemberConfig{"remote": bundle}
	require.Eventually(t, func() bool {
		src, _ := cache.member("remote").current()
		return src == "reporting#"+bundle.fingerprint
	}, 10*time.Second, 10*time.Millisecond, "the kubeconfig with the new CA bundle is in use")
	requests.waitForWatchesOlderThanASecond(t)
	requests.mark()
	proxy.resetConnsOpenedBefore(bundledAt)
	require.Eventually(t, func() bool { return requests.watchesSinceMark() > 0 }, 30*time.Second, 10*time.Millisecond,
		"the member's watches resume through the new CA bundle")
	createPool(t, ctx, local, ns, "after-ca-bundle")
	require.Eventually(t, func() bool { return importedPool("after-ca-bundle") }, 10*time.Second, 10*time.Millisecond,
		"a pool created after the new CA bundle reaches the imports")
	gaps := stopSampling()

	assert.True(t, before == cache.member("remote"), "the member was not reconnected")
	assert.Equal(t, lists, requests.lists(), "nothing was listed again")
	assert.Zero(t, requests.refusedSinceMark(), "no request was refused")
	assert.Empty(t, gaps, "the pool stayed imported and unflagged throughout")
	assert.Nil(t, cache.member("remote").credentials.rejected())
	t.Logf("lists of the member: %d before the rotations, %d after", lists, requests.lists())

	// A CA bundle that does not verify the member does not replace the
	// one that does: the connection in use goes on serving, unflagged.
	source <- map[string]MemberConfig{"remote": cm.memberConfig(user2, other)}
	assertStaysInUse(t, ctx, cache, bundle, func() bool { return importedPool(name) }, "the CA bundle that verifies the member stays in use")
}

func createPool(t *testing.T, ctx context.Context, config *rest.Config, ns, name string) {
	t.Helper()
	pool := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
	_, err := mciclient.NewForConfigOrDie(config).InferencePoolV1().InferencePools(ns).Create(ctx, pool, metav1.CreateOptions{})
	require.NoError(t, err)
}

// whoami is the user the member's clients are authenticated as, asked
// through them.
func whoami(t *testing.T, ctx context.Context, m *member) string {
	t.Helper()
	client, err := authenticationv1client.NewForConfigAndClient(m.gatedConfig, m.gatedClient)
	require.NoError(t, err)
	review, err := client.SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	return review.Status.UserInfo.Username
}

// certMember reads a cluster as users with client certificates of its
// client CA, each allowed to read it by a ClusterRoleBinding of its own:
// deleting the binding revokes what the certificate may do.
type certMember struct {
	t       *testing.T
	ctx     context.Context
	cs      *localclusterset.ClusterSet
	cluster string
	kube    kubernetes.Interface
	server  string
	ca      []byte
	wrap    func(http.RoundTripper) http.RoundTripper
}

type certUser struct {
	cert, key []byte
	notAfter  time.Time
	// mintedBy is a time no earlier than the certificate's issue: its
	// dates are whole seconds from then.
	mintedBy time.Time
}

func newCertMember(t *testing.T, ctx context.Context, cs *localclusterset.ClusterSet, admin *rest.Config, cluster, server string) *certMember {
	t.Helper()
	return &certMember{t: t, ctx: ctx, cs: cs, cluster: cluster, kube: kubernetes.NewForConfigOrDie(admin), server: server}
}

// mint issues a client certificate for user and lets user read the
// cluster.
func (cm *certMember) mint(user string) certUser {
	cm.t.Helper()
	config, err := cm.cs.UserConfig(cm.cluster, user)
	require.NoError(cm.t, err)
	if cm.ca == nil {
		cm.ca = config.CAData
	}
	_, err = cm.kube.RbacV1().ClusterRoleBindings().Create(cm.ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{})
	require.NoError(cm.t, err)
	return certUser{cert: config.CertData, key: config.KeyData, notAfter: credexpiry.Certificate(config.CertData), mintedBy: time.Now()}
}

// revoke deletes user's binding: the cluster answers 403 to whatever the
// user asks from then on.
func (cm *certMember) revoke(user string) {
	cm.t.Helper()
	require.NoError(cm.t, cm.kube.RbacV1().ClusterRoleBindings().Delete(cm.ctx, user, metav1.DeleteOptions{}))
}

// memberConfig is the member's configuration with user's certificate and
// the CA bundle ca, as a Secret's kubeconfig gives it, counted and
// answering as a cluster of its own.
func (cm *certMember) memberConfig(user certUser, ca []byte) MemberConfig {
	cm.t.Helper()
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["remote"] = &clientcmdapi.Cluster{Server: cm.server, CertificateAuthorityData: ca}
	kubeconfig.AuthInfos["reader"] = &clientcmdapi.AuthInfo{ClientCertificateData: user.cert, ClientKeyData: user.key}
	kubeconfig.Contexts["remote"] = &clientcmdapi.Context{Cluster: "remote", AuthInfo: "reader"}
	kubeconfig.CurrentContext = "remote"
	data, err := clientcmd.Write(*kubeconfig)
	require.NoError(cm.t, err)
	mc := parseSecretKubeconfig(data)
	require.NoError(cm.t, mc.err)
	if cm.wrap != nil {
		mc.rest.Wrap(cm.wrap)
	}
	mc.rest = asAnotherCluster(mc.rest, "remote-cluster-id")
	return mc
}

// requestCounter counts the lists (plain, or watches that start with the
// initial objects) and the watches sent to a member, and which
// token each watch since a mark carried.
type requestCounter struct {
	mu          sync.Mutex
	listCount   int
	marked      bool
	watchTokens []string
	// refused counts the lists and watches answered 401 or 403 since the
	// mark.
	refused int
	// lastWatch is when the latest watch was sent, a list's included.
	lastWatch time.Time
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		if needed(r) && r.URL.Path != "/readyz" {
			c.mu.Lock()
			// client-go lists through a watch that sends the initial
			// objects first (WatchList), or a plain list when the
			// server cannot: either is a list.
			q := r.URL.Query()
			if q.Get("watch") == "true" {
				c.lastWatch = time.Now()
			}
			if q.Get("watch") == "true" && q.Get("sendInitialEvents") != "true" {
				if c.marked {
					c.watchTokens = append(c.watchTokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
				}
			} else {
				c.listCount++
			}
			c.mu.Unlock()
		}
		resp, err := rt.RoundTrip(r)
		if err == nil && needed(r) && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			c.mu.Lock()
			if c.marked {
				c.refused++
			}
			c.mu.Unlock()
		}
		return resp, err
	})
}

// waitForWatchesOlderThanASecond waits until the latest watch sent to
// the member is more than a second old. client-go's reflector takes a
// watch that ends within a second of its start, having delivered nothing,
// for a failure ("very short watch"): it backs off and lists again. The
// tests cut the member's connections once its watches are older than that,
// as they are in a server that has run for a while; a cut right after the
// member listed, or right after an earlier cut, would make them list.
func (c *requestCounter) waitForWatchesOlderThanASecond(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return time.Since(c.lastWatch) > 1200*time.Millisecond
	}, 30*time.Second, 20*time.Millisecond, "the member's watches grow older than a second")
}

func (c *requestCounter) lists() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.listCount
}

func (c *requestCounter) mark() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.marked, c.watchTokens = true, nil
}

func (c *requestCounter) refusedSinceMark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

func (c *requestCounter) watchesSinceMark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.watchTokens)
}

func (c *requestCounter) watchTokensSinceMark(old, new string) (watches, withOld, withNew int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tok := range c.watchTokens {
		switch tok {
		case old:
			withOld++
		case new:
			withNew++
		}
	}
	return len(c.watchTokens), withOld, withNew
}

// resetConns ends every open connection and goes on accepting new ones.
func (p *cutProxy) resetConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]time.Time{}
}

// resetConnsOpenedBefore ends every open connection accepted before t,
// as an apiserver's watch timeout or a load balancer would end the
// connections of a member's old transport, and leaves the newer ones:
// ending those too, one after the other, could fail a watch that a
// reflector just resumed on one of them, which makes it list again.
func (p *cutProxy) resetConnsOpenedBefore(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, opened := range p.conns {
		if opened.Before(t) {
			_ = c.Close()
			delete(p.conns, c)
		}
	}
}

// sampleGaps checks held every 5 ms until the returned stop is called,
// which returns the times at which it did not hold.
func sampleGaps(ctx context.Context, held func() bool) (stop func() []string) {
	var gaps []string
	sampling, cancel := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			if !held() {
				gaps = append(gaps, time.Now().Format(time.StampMilli))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return func() []string {
		cancel()
		<-sampled
		return gaps
	}
}

// assertStaysInUse holds, for 5 s, that the member remote is still read
// through config, unflagged, and that served still holds.
func assertStaysInUse(t *testing.T, ctx context.Context, cache *Cache, config MemberConfig, served func() bool, msg string) {
	t.Helper()
	assert.Never(t, func() bool {
		m := cache.member("remote")
		if m == nil {
			// The cache has stopped: a check of Never may still run
			// once the test has returned.
			return ctx.Err() == nil
		}
		src, _ := m.current()
		return src != "reporting#"+config.fingerprint || !served() || m.credentials.rejected() != nil
	}, 5*time.Second, 20*time.Millisecond, msg)
}
