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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/imports"
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
	var gaps []string
	var gapsMu sync.Mutex
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			if !importedPool(name) {
				gapsMu.Lock()
				gaps = append(gaps, time.Now().Format(time.StampMilli))
				gapsMu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

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
	stopSampling()
	<-sampled

	assert.True(t, before == cache.member("remote"), "the member was not reconnected")
	assert.Equal(t, lists, requests.lists(), "nothing was listed again")
	watches, withOld, withNew := requests.watchTokensSinceMark(tm.tokens["token-1"], token2)
	assert.Zero(t, withOld, "no watch resumed with the revoked token")
	assert.Equal(t, watches, withNew, "every resumed watch carries the new token")
	gapsMu.Lock()
	assert.Empty(t, gaps, "the pool stayed imported and unflagged throughout")
	gapsMu.Unlock()
	assert.Nil(t, cache.member("remote").credentials.rejected())
	t.Logf("lists of the member: %d before the rotation, %d after; %d watches resumed, all with the new token", lists, requests.lists(), watches)

	// A new token the member refuses does not replace the one that
	// works: the connection in use goes on serving, unflagged.
	source <- map[string]MemberConfig{"remote": tm.memberConfig("not-a-token")}
	assert.Never(t, func() bool {
		src, _ := cache.member("remote").current()
		return src != "reporting#"+rotated.fingerprint || !importedPool(name) || cache.member("remote").credentials.rejected() != nil
	}, 5*time.Second, 20*time.Millisecond, "the working token stays in use")
}

// requestCounter counts the lists (plain, or watches that start with the
// initial objects) and the watches sent to a member, and which
// token each watch since a mark carried.
type requestCounter struct {
	mu          sync.Mutex
	listCount   int
	marked      bool
	watchTokens []string
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		if needed(r) && r.URL.Path != "/readyz" {
			c.mu.Lock()
			// client-go lists through a watch that sends the initial
			// objects first (WatchList), or a plain list when the
			// server cannot: either is a list.
			q := r.URL.Query()
			if q.Get("watch") == "true" && q.Get("sendInitialEvents") != "true" {
				if c.marked {
					c.watchTokens = append(c.watchTokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
				}
			} else {
				c.listCount++
			}
			c.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
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
	p.conns = map[net.Conn]struct{}{}
}
