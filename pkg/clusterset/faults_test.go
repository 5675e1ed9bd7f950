package clusterset

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/testutil"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/test/localclusterset"
)

func TestARemovedMemberServesOnlyItsNamespaces(t *testing.T) {
	m := &member{name: "cluster-b", reachability: reachability{unreachable: true, removed: true, failingSince: time.Unix(1, 0), lastError: "connection refused"}}
	v := m.view()
	require.NotNil(t, v.Unreachable)
	assert.Contains(t, v.Unreachable.Message, "connection refused")
	assert.Contains(t, v.Unreachable.Message, "no longer served")
	assert.Nil(t, v.Pools, "nothing the member exported is served")
	assert.Nil(t, v.Services)
	assert.Nil(t, v.EndpointSlices)
	assert.Nil(t, v.Gateways)
}

// TestMemberFaultsAgainstKubeAPIServer watches a real kube-apiserver as the
// local cluster and, through a TCP proxy the test can cut, as member
// "remote": the member's export is flagged, then removed, then served
// again when the link comes back.
func TestMemberFaultsAgainstKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	// The harness finds kube-apiserver and etcd ($MCI_BIN_DIR, else the
	// repository's _output/bin) and says how to build them when missing.
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const ns, name = "faults", "pool"
	local, remote, proxy := exportingThroughProxy(t, ctx, ns, name)

	var mu sync.Mutex
	memberEvents := 0
	options := Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: time.Second, RemoveAfter: 3 * time.Second}
	members := staticSource{"remote": {rest: remote, fingerprint: "1"}}
	cache := New(options, func(ev Event) {
		if ev.Member == "remote" && ev.Kind == KindMember {
			mu.Lock()
			memberEvents++
			mu.Unlock()
		}
	})
	go func() { _ = cache.Run(ctx, members) }()

	remoteIn := func(c *Cache) imports.Member {
		for _, m := range c.Snapshot().Members {
			if m.Name == "remote" {
				return m
			}
		}
		return imports.Member{}
	}
	remoteOf := func() imports.Member { return remoteIn(cache) }
	importedBy := func(c *Cache) bool {
		imp, ok := imports.Import(c.Snapshot(), ns, name)
		return ok && len(imp.Status.Clusters) == 1 && imp.Status.Clusters[0].Name == "remote"
	}
	imported := func() bool { return importedBy(cache) }
	require.Eventually(t, func() bool { return cache.Ready() == nil && imported() }, time.Minute, 50*time.Millisecond,
		"the local cluster imports the pool that member remote exports")

	proxy.setCut(true)
	start := time.Now()
	require.Eventually(t, func() bool { return remoteOf().Unreachable != nil }, 10*time.Second, 20*time.Millisecond)
	t.Logf("flagged unreachable after %s (threshold 1s)", time.Since(start).Round(10*time.Millisecond))
	assert.True(t, imported(), "an unreachable member's last known data is kept")
	imp, _ := imports.Import(cache.Snapshot(), ns, name)
	assert.Equal(t, v1alpha1.ReasonClusterUnreachable, readyReason(imp))

	require.Eventually(t, func() bool { return !imported() }, 15*time.Second, 20*time.Millisecond)
	t.Logf("export removed after %s (threshold 3s)", time.Since(start).Round(10*time.Millisecond))
	assert.True(t, remoteOf().Namespaces != nil, "a removed member's namespaces are kept")
	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(`
# HELP mci_clusterset_member_removed [ALPHA] 1 while the member has not answered for --member-remove-after, so the pools it exported are not served, else 0.
# TYPE mci_clusterset_member_removed gauge
mci_clusterset_member_removed{member="local"} 0
mci_clusterset_member_removed{member="remote"} 1
# HELP mci_clusterset_member_unreachable [ALPHA] 1 while the member is flagged ClusterUnreachable (it has not answered for --member-unreachable-after; its last known data is kept), else 0.
# TYPE mci_clusterset_member_unreachable gauge
mci_clusterset_member_unreachable{member="local"} 0
mci_clusterset_member_unreachable{member="remote"} 1
`), "mci_clusterset_member_removed", "mci_clusterset_member_unreachable"), "a removed member is said so in the metrics")

	proxy.setCut(false)
	start = time.Now()
	require.Eventually(t, func() bool { return imported() && remoteOf().Unreachable == nil }, time.Minute, 20*time.Millisecond)
	t.Logf("served again %s after the link came back", time.Since(start).Round(10*time.Millisecond))
	// The handler runs after the member's state changes, so the last event
	// may follow the snapshot that shows it.
	assert.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return memberEvents >= 4
	}, 5*time.Second, 20*time.Millisecond, "joined, flagged, removed and back are each an event")

	// A replica that starts while the member is partitioned has never
	// listed it, while replicas that did serve its last known pools: it
	// stays unready until the member answers and lists...
	proxy.setCut(true)
	startFresh := func() *Cache {
		fresh := New(options, func(Event) {})
		freshCtx, stop := context.WithCancel(ctx)
		t.Cleanup(stop)
		go func() { _ = fresh.Run(freshCtx, members) }()
		return fresh
	}
	fresh := startFresh()
	require.Eventually(t, func() bool { return remoteIn(fresh).Unreachable != nil }, time.Minute, 20*time.Millisecond)
	err := fresh.Ready()
	require.Error(t, err, "a replica that never listed an unreachable member is not ready before its removal threshold")
	assert.Contains(t, err.Error(), "member remote has not listed since this replica started and is unreachable")
	proxy.setCut(false)
	require.Eventually(t, func() bool { return fresh.Ready() == nil && importedBy(fresh) }, time.Minute, 20*time.Millisecond,
		"ready, with the member's pools, once the member lists")

	// ... or until its removal threshold, past which every replica agrees
	// that the member's pools are gone.
	proxy.setCut(true)
	start = time.Now()
	fresh = startFresh()
	require.Eventually(t, func() bool { return fresh.Ready() == nil }, 15*time.Second, 20*time.Millisecond)
	took := time.Since(start)
	t.Logf("a replica started during the partition became ready after %s (removal threshold 3s)", took.Round(10*time.Millisecond))
	assert.GreaterOrEqual(t, took, 3*time.Second, "not ready before the removal threshold")
	assert.False(t, importedBy(fresh), "past the removal threshold the member's pools are not served")
	proxy.setCut(false)

	// Nor is a replica ready before its membership sources have said who
	// the members are: it would serve imports without any of them.
	silent := New(options, func(Event) {})
	go func() { _ = silent.Run(ctx, silentSource{}) }()
	require.Eventually(t, func() bool {
		err := silent.Ready()
		return err != nil && strings.Contains(err.Error(), "membership sources not reported yet: silent")
	}, time.Minute, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		return len(silent.Snapshot().Members) == 1 && silent.Snapshot().Members[0].Namespaces != nil
	}, time.Minute, 20*time.Millisecond)
	assert.Error(t, silent.Ready(), "the local cluster has listed, but the members are not known yet")
}

// silentSource never reports, as a Secret source whose informer cannot
// list.
type silentSource struct{}

func (silentSource) Name() string { return "silent" }

func (silentSource) Run(ctx context.Context, _ func(string, map[string]MemberConfig)) { <-ctx.Done() }

// exportingThroughProxy starts a one-cluster ClusterSet whose cluster
// exports the pool ns/name, and returns its configuration, the same
// reached through a proxy that the test can cut, and that proxy.
func exportingThroughProxy(t *testing.T, ctx context.Context, ns, name string) (local, remote *rest.Config, proxy *cutProxy) {
	t.Helper()
	_, local, remote, proxy = exportingClusterSetThroughProxy(t, ctx, ns, name)
	return local, remote, proxy
}

// exportingClusterSetThroughProxy is exportingThroughProxy that also
// returns the ClusterSet, whose one cluster is named ns, for tests that
// mint its users.
func exportingClusterSetThroughProxy(t *testing.T, ctx context.Context, ns, name string) (cs *localclusterset.ClusterSet, local, remote *rest.Config, proxy *cutProxy) {
	t.Helper()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{ns}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	local = cs.Clusters[0].Config
	_, err = kubernetes.NewForConfigOrDie(local).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pool := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
	_, err = mciclient.NewForConfigOrDie(local).InferencePoolV1().InferencePools(ns).Create(ctx, pool, metav1.CreateOptions{})
	require.NoError(t, err)
	proxy = newCutProxy(t, strings.TrimPrefix(local.Host, "https://"))
	remote = asAnotherCluster(local, "remote-cluster-id")
	remote.Host = "https://" + proxy.addr()
	return cs, local, remote, proxy
}

func readyReason(imp *inference.InferencePoolImport) string {
	if imp == nil || len(imp.Status.Clusters) == 0 {
		return ""
	}
	for _, c := range imp.Status.Clusters[0].Conditions {
		if c.Type == "Ready" {
			return c.Reason
		}
	}
	return ""
}

// staticSource reports a fixed set of members once.
type staticSource map[string]MemberConfig

func (s staticSource) Name() string { return "static" }

func (s staticSource) Run(ctx context.Context, report func(string, map[string]MemberConfig)) {
	report(s.Name(), s)
	<-ctx.Done()
}

// cutProxy forwards TCP connections to a backend until cut: then it closes
// every open connection and refuses new ones, as a crashed apiserver or a
// partition would.
type cutProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	cut     bool
	// conns are the open connections, and when each was accepted.
	conns map[net.Conn]time.Time
}

func newCutProxy(t *testing.T, backend string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, backend: backend, conns: map[net.Conn]time.Time{}}
	t.Cleanup(func() { _ = ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve(c net.Conn) {
	if !p.track(c) {
		return
	}
	b, err := net.Dial("tcp", p.backend)
	if err != nil || !p.track(b) {
		_ = c.Close()
		return
	}
	go func() { _, _ = io.Copy(b, c); _ = b.Close() }()
	_, _ = io.Copy(c, b)
	_ = c.Close()
}

func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		_ = c.Close()
		return false
	}
	p.conns[c] = time.Now()
	return true
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			_ = c.Close()
		}
		p.conns = map[net.Conn]time.Time{}
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// reportingSource reports whatever the test sends it.
type reportingSource chan map[string]MemberConfig

func (s reportingSource) Name() string { return "reporting" }

func (s reportingSource) Run(ctx context.Context, report func(string, map[string]MemberConfig)) {
	for {
		select {
		case <-ctx.Done():
			return
		case members := <-s:
			report(s.Name(), members)
		}
	}
}

// A member whose kubeconfig changes (rotated credentials) while it is cut
// off: the replacement cannot list, and used to be swapped in after the
// unreachable threshold with an empty cache, which dropped every pool the
// member exported until the link came back.
func TestARotationDuringAPartitionKeepsTheMembersLastKnownData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const ns, name = "rotation", "pool"
	local, remote, proxy := exportingThroughProxy(t, ctx, ns, name)
	const threshold = time.Second
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: threshold, RemoveAfter: time.Minute}, func(Event) {})
	source := make(reportingSource, 1)
	source <- map[string]MemberConfig{"remote": {rest: remote, fingerprint: "1"}}
	go func() { _ = cache.Run(ctx, source) }()
	imported := func() bool {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		return ok && len(imp.Status.Clusters) == 1 && imp.Status.Clusters[0].Name == "remote"
	}
	unreachable := func() bool {
		for _, m := range cache.Snapshot().Members {
			if m.Name == "remote" {
				return m.Unreachable != nil
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return cache.Ready() == nil && imported() }, time.Minute, 50*time.Millisecond)

	proxy.setCut(true)
	require.Eventually(t, unreachable, 10*time.Second, 20*time.Millisecond)
	source <- map[string]MemberConfig{"remote": {rest: remote, fingerprint: "2"}}
	// Well past the time at which the replacement used to be swapped in:
	// its start (discovery, whose requests client-go retries on a reset
	// connection for about 10s) and then the threshold.
	rotated := time.Now()
	assert.Never(t, func() bool { return !imported() || !unreachable() }, 20*time.Second, 50*time.Millisecond,
		"a rotated member that cannot list yet keeps its last known data, flagged")
	t.Logf("last known data kept %s after the rotation", time.Since(rotated).Round(100*time.Millisecond))

	proxy.setCut(false)
	healed := time.Now()
	inUse := func() bool {
		cache.mu.RLock()
		defer cache.mu.RUnlock()
		return cache.members["remote"].source == "reporting#2"
	}
	require.Eventually(t, func() bool { return inUse() && imported() && !unreachable() }, 30*time.Second, 20*time.Millisecond,
		"the rotated kubeconfig is in use once it has listed")
	t.Logf("rotated kubeconfig in use %s after the heal", time.Since(healed).Round(10*time.Millisecond))
}
