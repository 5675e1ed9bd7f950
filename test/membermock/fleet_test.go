package membermock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
)

// startFleet runs a fleet for the test with members joined.
func startFleet(t *testing.T, opts Options, members ...string) *Fleet {
	t.Helper()
	f, err := NewFleet(opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	require.Eventually(t, func() bool { return f.running() }, 10*time.Second, 10*time.Millisecond)
	for _, m := range members {
		_, err := f.Join(m)
		require.NoError(t, err)
	}
	return f
}

func applyPool(t *testing.T, m *Member, ns, name string, exported, ready bool) {
	t.Helper()
	require.NoError(t, m.Apply(Namespace(ns)))
	require.NoError(t, m.Apply(EPPService(ns, name, "127.0.0.9")))
	require.NoError(t, m.Apply(EPPEndpoints(ns, name, ready)))
	require.NoError(t, m.Apply(ExportedPool(ns, name, exported)))
}

// Each member answers with its own CA and its own token only, and grants
// its reader the summaries and its cluster ID, nothing else.
func TestEachMemberServesItsOwnSummariesToItsOwnToken(t *testing.T) {
	f := startFleet(t, Options{ClusterSetName: "fleet", Reader: "importer"}, "member-1", "member-2")
	applyPool(t, f.Member("member-1"), "ns", "llm", true, true)
	ctx := context.Background()

	one, err := f.RESTConfig("member-1")
	require.NoError(t, err)
	client := mciclient.NewForConfigOrDie(one)
	require.Eventually(t, func() bool {
		l, err := client.InferenceV1alpha1().InferencePoolExportSummaries("").List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 1
	}, 10*time.Second, 20*time.Millisecond)
	s, err := client.InferenceV1alpha1().InferencePoolExportSummaries("ns").Get(ctx, "llm", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, metav1.ConditionTrue, readyOf(s))
	cs, err := client.InferenceV1alpha1().InferenceClusterSummaries().Get(ctx, "member-1", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"ns"}, cs.Status.Namespaces)

	two, err := f.RESTConfig("member-2")
	require.NoError(t, err)
	l, err := mciclient.NewForConfigOrDie(two).InferenceV1alpha1().InferencePoolExportSummaries("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Empty(t, l.Items, "member-2 exports nothing")

	kube := kubernetes.NewForConfigOrDie(one)
	id1, err := kube.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	require.NoError(t, err)
	id2, err := kubernetes.NewForConfigOrDie(two).CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEqual(t, id1.UID, id2.UID, "each member is a cluster of its own")
	_, err = kube.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	require.True(t, apierrors.IsForbidden(err), "%v", err)
	_, err = client.InferenceV1alpha1().InferencePoolImports("").List(ctx, metav1.ListOptions{})
	require.Error(t, err)
	require.NoError(t, kube.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error())

	otherToken := rest.CopyConfig(one)
	otherToken.BearerToken = two.BearerToken
	_, err = mciclient.NewForConfigOrDie(otherToken).InferenceV1alpha1().InferencePoolExportSummaries("").List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsUnauthorized(err), "another member's token: %v", err)
	otherCA := rest.CopyConfig(one)
	otherCA.CAData = two.CAData
	_, err = mciclient.NewForConfigOrDie(otherCA).InferenceV1alpha1().InferencePoolExportSummaries("").List(ctx, metav1.ListOptions{})
	require.ErrorContains(t, err, "certificate", "another member's CA")
}

// A watch follows a readiness flap and an export withdrawn, resumes from
// a resourceVersion it was sent, and gets 410 Gone from one older than
// the history.
func TestWatchFollowsChangesResumesAndExpires(t *testing.T) {
	f := startFleet(t, Options{ClusterSetName: "fleet", HistorySize: 2}, "member-1")
	m := f.Member("member-1")
	applyPool(t, m, "ns", "llm", true, true)
	cfg, err := f.RESTConfig("member-1")
	require.NoError(t, err)
	api := mciclient.NewForConfigOrDie(cfg).InferenceV1alpha1().InferencePoolExportSummaries("")
	ctx := context.Background()
	var list *v1alpha1.InferencePoolExportSummaryList
	require.Eventually(t, func() bool {
		list, err = api.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 1
	}, 10*time.Second, 20*time.Millisecond)
	w, err := api.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()
	require.NoError(t, m.Apply(EPPEndpoints("ns", "llm", false)))
	ev := next(t, w)
	require.Equal(t, watch.Modified, ev.Type)
	flapped := ev.Object.(*v1alpha1.InferencePoolExportSummary)
	require.Equal(t, metav1.ConditionFalse, readyOf(flapped))
	require.NoError(t, m.Apply(ExportedPool("ns", "llm", false)))
	ev = next(t, w)
	require.Equal(t, watch.Deleted, ev.Type)

	resumed, err := api.Watch(ctx, metav1.ListOptions{ResourceVersion: flapped.ResourceVersion})
	require.NoError(t, err)
	defer resumed.Stop()
	require.Equal(t, watch.Deleted, next(t, resumed).Type, "resumed after the flap: the withdrawal only")

	// Each change seen before the next, so that no pass folds them.
	for i := 0; i < 4; i++ {
		require.NoError(t, m.Apply(ExportedPool("ns", "llm", i%2 == 0)))
		next(t, w)
	}
	require.Eventually(t, func() bool {
		gone, err := api.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err == nil {
			defer gone.Stop()
			select {
			case ev := <-gone.ResultChan():
				status, ok := ev.Object.(*metav1.Status)
				return ev.Type == watch.Error && ok && status.Code == 410
			case <-time.After(2 * time.Second):
				return false
			}
		}
		return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
	}, 10*time.Second, 50*time.Millisecond)
}

func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			require.True(t, ok, "the watch ended")
			if ev.Type == watch.Bookmark {
				continue
			}
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10s")
		}
	}
}

func readyOf(s *v1alpha1.InferencePoolExportSummary) metav1.ConditionStatus {
	for _, c := range s.Status.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			return c.Status
		}
	}
	return ""
}

// A member's reader is counted a LIST for a LIST and for a watch that asks
// for its initial events, a WATCH for a watch from a resourceVersion, and
// nothing for what it asks besides the summaries.
func TestReadsAreCountedPerMember(t *testing.T) {
	f := startFleet(t, Options{ClusterSetName: "fleet", Reader: "importer"}, "member-1", "member-2")
	ctx := context.Background()
	one, err := f.RESTConfig("member-1")
	require.NoError(t, err)
	summaries := mciclient.NewForConfigOrDie(one).InferenceV1alpha1()

	l, err := summaries.InferencePoolExportSummaries("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	w, err := summaries.InferencePoolExportSummaries("").Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	require.NoError(t, err)
	w.Stop()
	w, err = summaries.InferenceClusterSummaries().Watch(ctx, metav1.ListOptions{
		SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
	})
	require.NoError(t, err)
	w.Stop()
	_, err = kubernetes.NewForConfigOrDie(one).CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	require.NoError(t, err)

	require.Equal(t, map[string]Reads{"member-1": {Lists: 2, Watches: 1}}, f.Reads())
}
