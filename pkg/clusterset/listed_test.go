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

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/localclusterset"
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
	checkPlacedAtItsLists(t, "remote", events, KindExportSummary, afterDeletion)
}

// checkPlacedAtItsLists checks a member's events until it counted as
// listed: one KindListed, after every event of kind, whose version is at
// least afterDeletion, which none of those carries.
func checkPlacedAtItsLists(t *testing.T, member string, events []Event, kind Kind, afterDeletion uint64) {
	t.Helper()
	var listed, newest uint64
	for _, ev := range events {
		switch ev.Kind {
		case KindListed:
			assert.Zero(t, listed, "%s: announced once", member)
			listed = ev.ResourceVersion
		case kind:
			assert.Zero(t, listed, "%s: announced after every listed object: %v", member, ev)
			newest = max(newest, ev.ResourceVersion)
		}
	}
	require.NotZero(t, listed, "%s: the member's first lists are announced before it counts as listed; events: %v", member, events)
	assert.GreaterOrEqual(t, listed, afterDeletion, "%s: the lists' version covers the deletion", member)
	assert.Less(t, newest, afterDeletion, "%s: no listed object carries the deletion", member)
}

// The same in full mode, for a member read through its kube-apiserver and
// for the replica's own cluster (whose version is what its summaries
// carry to every other cluster): each is placed at its first lists'
// version, which covers a pool deleted before it.
func TestAMemberReadInFullModeIsPlacedAtItsFirstListsOnceListed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const ns = "listed"
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"local"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	local := cs.Clusters[0].Config
	_, err = kubernetes.NewForConfigOrDie(local).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	pools := mciclient.NewForConfigOrDie(local).InferencePoolV1().InferencePools(ns)
	for _, name := range []string{"pool", "gone"} {
		_, err := pools.Create(ctx, &poolv1.InferencePool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
			Spec: poolv1.InferencePoolSpec{
				Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				TargetPorts:       []poolv1.Port{{Number: 8000}},
				EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, pools.Delete(ctx, "gone", metav1.DeleteOptions{}))
	list, err := pools.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	afterDeletion, err := strconv.ParseUint(list.ResourceVersion, 10, 64)
	require.NoError(t, err)

	var (
		mu     sync.Mutex
		events = map[string][]Event{}
	)
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 5 * time.Second, RemoveAfter: time.Minute, Summaries: SummariesNever}, func(ev Event) {
		mu.Lock()
		events[ev.Member] = append(events[ev.Member], ev)
		mu.Unlock()
	})
	go func() {
		_ = cache.Run(ctx, staticSource{"remote": {rest: asAnotherCluster(local, "remote-cluster-id"), fingerprint: "1"}})
	}()
	require.Eventually(t, func() bool { return cache.Ready() == nil }, time.Minute, 10*time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	for _, member := range []string{"local", "remote"} {
		checkPlacedAtItsLists(t, member, events[member], KindInferencePool, afterDeletion)
	}
}
