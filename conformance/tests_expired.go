package conformance

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
)

const reqWatchExpired = "Kubernetes API conventions (concurrency control and consistency; efficient detection of changes): a watch from a " +
	"resourceVersion the server no longer holds is answered 410 Gone (reason Expired), at once or as the watch's first ERROR event, " +
	"so that the client relists; it is never answered with a stream that silently lacks changes"

func expiredTests() []Test {
	return []Test{
		{
			Name:        "a watch from a resourceVersion older than the server's history is refused with 410 Gone, never answered with a gap",
			Requirement: reqWatchExpired,
			Label:       Optional,
			Run:         testWatchExpired,
		},
	}
}

// testWatchExpired makes a list's resourceVersion too old the only way a
// client can: by making more changes after it than the server keeps.
// resourceVersions are opaque, so no client can write an old one, and how
// many changes a server keeps is its own (the watch cache of a
// kube-apiserver keeps a window of changes and etcd compacts; mci-apiserver
// keeps a history of changes per resource): --watch-history-changes says
// how many changes suffice, and the test is skipped without it. Either
// answer but a gap is conformant: a watch refused with 410, or one that
// replays every change; the second says the history was long enough, and
// the test is skipped saying so, for it proved the replay, not the 410.
func testWatchExpired(t *T) {
	n := t.suite.cfg.WatchHistoryChanges
	if n <= 0 {
		t.Skipf("no client can make a resourceVersion too old but by outrunning the server's history, whose length is the implementation's: " +
			"set --watch-history-changes to more import changes than it keeps")
	}
	a, b := t.Clusters()[0], t.Clusters()[1]
	f := newFixture(t)
	f.createNamespace(a)
	f.createNamespace(b)
	api := b.Dynamic.Resource(importsGVR).Namespace(f.ns)
	list, err := api.List(f.ctx(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing imports in %s: %v", b.Name, err)
	}
	rv := list.GetResourceVersion()
	// Each exported pool is one import added in b after rv.
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("churn-%d", i)
		f.exportPool(a, want[i])
	}
	f.eventually(fmt.Sprintf("%s imports the %d pools", b.Name, n), func(ctx context.Context) (bool, string) {
		l, err := api.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(l.Items) >= n, fmt.Sprintf("%d imports", len(l.Items))
	})

	ctx, cancel := context.WithTimeout(f.ctx(), t.PollTimeout())
	defer cancel()
	w, err := api.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	switch {
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		t.Logf("the watch from %s is refused: %v", rv, err)
		return
	case err != nil:
		t.Fatalf("a watch from a resourceVersion %d changes old is refused, but not with 410 Gone: %v", n, err)
	}
	defer w.Stop()
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch from %s ended after %d of the %d additions, without a 410: a client misses the rest", rv, len(seen), n)
			}
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					t.Logf("the watch from %s ends with 410: %v", rv, err)
					return
				}
				t.Fatalf("the watch from %s failed, but not with 410 Gone: %v", rv, err)
			}
			if obj, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type == watch.Added && slices.Contains(want, obj.GetName()) {
				seen[obj.GetName()] = true
			}
		case <-ctx.Done():
			var missing []string
			for _, name := range want {
				if !seen[name] {
					missing = append(missing, name)
				}
			}
			t.Fatalf("the watch from %s was accepted but delivered %d of the %d additions within %s and no 410: a silent gap (missing %v)",
				rv, len(seen), n, t.PollTimeout(), missing[:min(len(missing), 5)])
		}
	}
	t.Skipf("the watch from %s replayed all %d changes: the server's history outlasted them, so no 410 was due; raise --watch-history-changes past it", rv, n)
}
