package clusterset

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// A replica that starts after a member deleted an export places the
// member at its first list's version, which covers the deletion, and does
// so before it counts the member as listed; the newest summary it lists
// is older than the deletion. Without it the member's version stays at
// that summary until the member's next change, and a watch resumed from a
// version another replica issued after the deletion waits for it.
func TestAMembersVersionIsItsFirstListsOnceListed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const ns = "listed"
	local := summaryServingCluster(t, ctx)
	_, err := kubernetes.NewForConfigOrDie(local).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	publishSummaries(t, ctx, local, "remote", ns, "pool")
	client := dynamic.NewForConfigOrDie(local)
	require.NoError(t, publish(ctx, client, exportSummary(ns, "gone")))
	require.NoError(t, client.Resource(apiExportSummaries).Namespace(ns).Delete(ctx, "gone", metav1.DeleteOptions{}))
	list, err := client.Resource(apiExportSummaries).Namespace("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	afterDeletion, err := strconv.ParseUint(list.GetResourceVersion(), 10, 64)
	require.NoError(t, err)

	var (
		mu     sync.Mutex
		events []Event
	)
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: time.Second, RemoveAfter: time.Minute}, func(ev Event) {
		if ev.Member == "remote" {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}
	})
	go func() {
		_ = cache.Run(ctx, staticSource{"remote": {rest: asAnotherCluster(memberProxy(t, local, nil), "remote-cluster-id"), fingerprint: "1"}})
	}()
	require.Eventually(t, func() bool { return cache.Ready() == nil }, time.Minute, 10*time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	var listed, newest uint64
	for _, ev := range events {
		switch ev.Kind {
		case KindListed:
			// Later raises come from the watches' bookmarks.
			assert.Greater(t, ev.ResourceVersion, listed, "raised, never lowered")
			if listed != 0 {
				continue
			}
			listed = ev.ResourceVersion
		case KindExportSummary:
			assert.Zero(t, listed, "announced after every listed summary: %v", ev)
			newest = max(newest, ev.ResourceVersion)
		}
	}
	require.NotZero(t, listed, "the member's first list is announced before it counts as listed; events: %v", events)
	assert.GreaterOrEqual(t, listed, afterDeletion, "the list's version covers the deletion")
	assert.Less(t, newest, afterDeletion, "no listed summary carries the deletion")
}
