package virtual

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/imports"
)

// tableResource computes objects from a table the test edits: the Store's
// logic is what is under test, not the import computation.
type tableResource struct {
	mu      sync.Mutex
	objects map[string]*inference.InferencePoolImport
}

func (r *tableResource) set(ns, name string, labels map[string]string, clusters ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := &inference.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	for _, c := range clusters {
		o.Status.Clusters = append(o.Status.Clusters, inference.ImportedCluster{Name: c})
	}
	r.objects[key(ns, name)] = o
}

func (r *tableResource) remove(ns, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.objects, key(ns, name))
}

func (r *tableResource) Compute(_ imports.ClusterSet, ns, name string) (Object, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.objects[key(ns, name)]
	if !ok {
		return nil, false
	}
	return o.DeepCopy(), true
}

func (r *tableResource) ComputeNamespace(_ imports.ClusterSet, ns string) []Object {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Object
	for _, o := range r.objects {
		if ns == "" || o.Namespace == ns {
			out = append(out, o.DeepCopy())
		}
	}
	return out
}

func (r *tableResource) Affected(ev clusterset.Event) Dirty {
	if ev.Kind == clusterset.KindNamespace {
		return Dirty{Namespaces: []string{ev.Namespace}}
	}
	return Dirty{Keys: []string{key(ev.Namespace, ev.Name)}}
}

func (r *tableResource) CarryTransitionTimes(Object, Object, metav1.Time) {}

type emptySnapshot struct{}

func (emptySnapshot) Snapshot() imports.ClusterSet { return imports.ClusterSet{} }
func (emptySnapshot) Ready() error                 { return nil }

// syncingSnapshot is a ClusterSet whose members have not all listed yet.
type syncingSnapshot struct {
	emptySnapshot
	mu    sync.Mutex
	ready bool
}

func (s *syncingSnapshot) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		return fmt.Errorf("member cluster-a has not synced yet")
	}
	return nil
}

// startSyncingStore starts a Store over a ClusterSet that is not complete
// until the test says so (syncingSnapshot.ready).
func startSyncingStore(t *testing.T, r *tableResource) (*Store, *syncingSnapshot) {
	t.Helper()
	cluster := &syncingSnapshot{}
	s := NewStore(r, cluster, func() Object { return &inference.InferencePoolImport{} })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Run(ctx)
	require.Eventually(t, s.Ready, 5*time.Second, 5*time.Millisecond)
	return s, cluster
}

func startStore(t *testing.T, r *tableResource) *Store {
	t.Helper()
	return startStoreOf(t, r, emptySnapshot{})
}

// startStoreOf starts a Store of r over the members of cluster.
func startStoreOf(t *testing.T, r *tableResource, cluster Snapshotter) *Store {
	t.Helper()
	s := NewStore(r, cluster, func() Object { return &inference.InferencePoolImport{} })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Run(ctx)
	require.Eventually(t, s.Ready, 5*time.Second, 5*time.Millisecond)
	return s
}

// startStoreWithHistory starts a Store of r, with no members, whose watch
// history is n changes long.
func startStoreWithHistory(t *testing.T, r *tableResource, n int) *Store {
	t.Helper()
	s := NewStore(r, emptySnapshot{}, func() Object { return &inference.InferencePoolImport{} })
	s.SetHistorySize(n)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Run(ctx)
	require.Eventually(t, s.Ready, 5*time.Second, 5*time.Millisecond)
	return s
}

// notifyPool tells the store that member m changed ns/name at resourceVersion rv.
func notifyPool(s *Store, member, ns, name string, rv uint64) {
	s.Notify(clusterset.Event{Member: member, Kind: clusterset.KindInferencePool, Namespace: ns, Name: name, ResourceVersion: rv})
}

// next returns the next event of w, with the object the API server would
// encode: a live change comes wrapped for encoding once.
func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		require.True(t, ok, "watch closed")
		if co, ok := ev.Object.(runtime.CacheableObject); ok {
			ev.Object = co.GetObject()
		}
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no watch event")
	}
	return watch.Event{}
}

func nameOf(ev watch.Event) string { return ev.Object.(*inference.InferencePoolImport).Name }

func TestStoreServesComputedObjectsAndTheirChanges(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns1", "a", nil, "cluster-a")
	s := startStore(t, r)

	o, ok, _ := s.Get("ns1", "a")
	require.True(t, ok, "the first pass computes everything")
	firstRV := o.GetResourceVersion()
	require.NotEmpty(t, firstRV)

	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: firstRV})
	require.NoError(t, err)
	defer w.Stop()

	r.set("ns1", "a", nil, "cluster-a", "cluster-c")
	notifyPool(s, "cluster-c", "ns1", "a", 10)
	ev := next(t, w)
	assert.Equal(t, watch.Modified, ev.Type)
	assert.Len(t, ev.Object.(*inference.InferencePoolImport).Status.Clusters, 2)
	v, err := ParseVersion(ev.Object.(Object).GetResourceVersion())
	require.NoError(t, err)
	assert.Equal(t, uint64(10), v["cluster-c"], "the version carries the member's resourceVersion")

	t.Run("an event that changes nothing emits nothing", func(t *testing.T) {
		notifyPool(s, "cluster-c", "ns1", "a", 11)
		r.set("ns1", "b", nil, "cluster-a")
		notifyPool(s, "cluster-a", "ns1", "b", 12)
		ev := next(t, w)
		assert.Equal(t, watch.Added, ev.Type)
		assert.Equal(t, "b", nameOf(ev), "the no-op change of a produced no event before b's")
	})

	t.Run("an object no longer computed is deleted", func(t *testing.T) {
		r.remove("ns1", "b")
		notifyPool(s, "cluster-a", "ns1", "b", 13)
		ev := next(t, w)
		assert.Equal(t, watch.Deleted, ev.Type)
		assert.Equal(t, "b", nameOf(ev))
		_, ok, _ := s.Get("ns1", "b")
		assert.False(t, ok)
	})

	t.Run("recomputing a namespace deletes what disappeared from it", func(t *testing.T) {
		r.remove("ns1", "a")
		s.Notify(clusterset.Event{Member: "cluster-b", Kind: clusterset.KindNamespace, Namespace: "ns1", ResourceVersion: 14})
		ev := next(t, w)
		assert.Equal(t, watch.Deleted, ev.Type)
		assert.Equal(t, "a", nameOf(ev))
	})
}

func TestWatchResumesFromAnyVersionInItsHistory(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStore(t, r)
	_, start, _ := s.ListWithOptions(context.Background(), ListOptions{})

	// One change at a time: changes that arrive together are computed
	// together, in one recomputation.
	for i, name := range []string{"a", "b", "c"} {
		r.set("ns", name, nil, "cluster-a")
		notifyPool(s, "cluster-a", "ns", name, uint64(100+i))
		require.Eventually(t, func() bool { _, ok, _ := s.Get("ns", name); return ok }, 5*time.Second, 5*time.Millisecond)
	}
	b, _, _ := s.Get("ns", "b")

	tests := []struct {
		name string
		rv   string
		want []string
	}{
		{name: "from before any change, every change is replayed", rv: start, want: []string{"a", "b", "c"}},
		{name: "from b's version, only what came after", rv: b.GetResourceVersion(), want: []string{"c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: tc.rv})
			require.NoError(t, err)
			defer w.Stop()
			for _, want := range tc.want {
				ev := next(t, w)
				assert.Equal(t, watch.Added, ev.Type)
				assert.Equal(t, want, nameOf(ev))
			}
		})
	}

	t.Run("a version from another replica that saw the same changes in another order resumes", func(t *testing.T) {
		v, err := ParseVersion(b.GetResourceVersion())
		require.NoError(t, err)
		w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: v.String()})
		require.NoError(t, err)
		w.Stop()
	})
	t.Run("a version the server never issued is a bad request", func(t *testing.T) {
		_, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: "%%%"})
		assert.True(t, apierrors.IsBadRequest(err), "%v", err)
	})
}

func TestWatchOlderThanTheHistoryIsGone(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStore(t, r)
	s.mu.Lock()
	s.historyStart = Version{"cluster-a": 50}
	s.mu.Unlock()
	_, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: Version{"cluster-a": 10, epochComponent: s.epoch}.String()})
	assert.True(t, apierrors.IsResourceExpired(err) || apierrors.IsGone(err), "%v", err)
}

func TestAWatchOutrunByMoreChangesThanTheHistorySizeIsGone(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStoreWithHistory(t, r, 4)
	_, start, _ := s.ListWithOptions(context.Background(), ListOptions{})

	// Four changes fit the history; the sixth runs it over by more than an
	// eighth and cuts the changes start needs.
	for i := range 6 {
		name := fmt.Sprintf("pool-%d", i)
		r.set("ns", name, nil, "cluster-a")
		notifyPool(s, "cluster-a", "ns", name, uint64(100+i))
		require.Eventually(t, func() bool { _, ok, _ := s.Get("ns", name); return ok }, 5*time.Second, 5*time.Millisecond)
		if i == 3 {
			w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: start})
			require.NoError(t, err, "four changes are within a history of four")
			w.Stop()
		}
	}
	_, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: start})
	assert.True(t, apierrors.IsResourceExpired(err) || apierrors.IsGone(err), "%v", err)
}

func TestWatchWithInitialEventsEndsThemWithABookmark(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	r.set("other", "b", nil, "cluster-a")
	s := startStore(t, r)

	w, err := s.Watch(context.Background(), WatchOptions{Namespace: "ns", SendInitialEvents: true, AllowBookmarks: true, ResourceVersion: ""})
	require.NoError(t, err)
	defer w.Stop()
	ev := next(t, w)
	assert.Equal(t, watch.Added, ev.Type)
	assert.Equal(t, "a", nameOf(ev), "only the watched namespace")
	ev = next(t, w)
	require.Equal(t, watch.Bookmark, ev.Type)
	assert.Equal(t, "true", ev.Object.(Object).GetAnnotations()[metav1.InitialEventsAnnotationKey])
	assert.NotEmpty(t, ev.Object.(Object).GetResourceVersion())
}

func TestWatchSeesObjectsEnterAndLeaveItsLabelSelector(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", map[string]string{"team": "x"}, "cluster-a")
	s := startStore(t, r)
	match := func(o Object) bool { return o.GetLabels()["team"] == "y" }
	w, err := s.Watch(context.Background(), WatchOptions{Match: match, ResourceVersion: "0"})
	require.NoError(t, err)
	defer w.Stop()

	r.set("ns", "a", map[string]string{"team": "y"}, "cluster-a")
	notifyPool(s, "cluster-a", "ns", "a", 5)
	assert.Equal(t, watch.Added, next(t, w).Type, "it starts matching")
	r.set("ns", "a", map[string]string{"team": "x"}, "cluster-a")
	notifyPool(s, "cluster-a", "ns", "a", 6)
	assert.Equal(t, watch.Deleted, next(t, w).Type, "it stops matching")
}

func TestASlowWatcherIsCutOffInsteadOfGrowingMemory(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStore(t, r)
	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: "0"})
	require.NoError(t, err)
	// Nobody reads w. Each recompute queues one batch for it.
	for i := 0; i < watcherBuffer+10; i++ {
		name := fmt.Sprintf("p%d", i)
		r.set("ns", name, nil, "cluster-a")
		s.Notify(clusterset.Event{Member: "cluster-a", Kind: clusterset.KindInferencePool, Namespace: "ns", Name: name, ResourceVersion: uint64(i + 1)})
		s.recompute(context.Background())
	}
	s.mu.RLock()
	_, still := s.watchers[w.(*watcher)]
	s.mu.RUnlock()
	assert.False(t, still, "the watcher was removed")
	// Its channel is closed once its goroutine notices.
	require.Eventually(t, func() bool {
		for {
			select {
			case _, ok := <-w.ResultChan():
				if !ok {
					return true
				}
			default:
				return false
			}
		}
	}, 5*time.Second, 10*time.Millisecond)
}

func TestVersionCovers(t *testing.T) {
	tests := []struct {
		name string
		v, o Version
		want bool
	}{
		{"equal", Version{"a": 1, "b": 2}, Version{"a": 1, "b": 2}, true},
		{"ahead in one component", Version{"a": 2, "b": 2}, Version{"a": 1, "b": 2}, true},
		{"behind in one component", Version{"a": 2, "b": 1}, Version{"a": 1, "b": 2}, false},
		{"a component the other lacks counts as zero", Version{"a": 1}, Version{"a": 1, "b": 0}, true},
		{"missing a component the other has", Version{"a": 1}, Version{"a": 1, "b": 3}, false},
		{"everything covers the empty version", Version{}, Version{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.v.Covers(tc.o))
		})
	}
}

func TestVersionRoundTrips(t *testing.T) {
	v := Version{"cluster-a": 12, "cluster-b": 7, reachabilityComponent: 1700000000000}
	got, err := ParseVersion(v.String())
	require.NoError(t, err)
	assert.Equal(t, v, got)
	assert.Equal(t, v.String(), got.String(), "the encoding is canonical")
	for _, bad := range []string{"%%", "", "YQ", "djE7YT0", "djE7YT14"} { // "%%", "", "a", "v1;a=", "v1;a=x"
		_, err := ParseVersion(bad)
		assert.Error(t, err, bad)
	}
}

func TestInitialEventsWithoutBookmarksEndWithoutABookmark(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	s := startStore(t, r)
	// What the API server asks for on a plain watch without a resourceVersion.
	w, err := s.Watch(context.Background(), WatchOptions{SendInitialEvents: true})
	require.NoError(t, err)
	defer w.Stop()
	assert.Equal(t, watch.Added, next(t, w).Type)
	r.set("ns", "b", nil, "cluster-a")
	notifyPool(s, "cluster-a", "ns", "b", 3)
	ev := next(t, w)
	assert.Equal(t, watch.Added, ev.Type, "no bookmark between the initial events and the live ones")
	assert.Equal(t, "b", nameOf(ev))
}

func TestAForeignVersionResumesOnlyOnceEveryMemberListed(t *testing.T) {
	baselineInterval = 10 * time.Millisecond
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	s, cluster := startSyncingStore(t, r)
	_, own, _ := s.ListWithOptions(context.Background(), ListOptions{})
	foreign := Version{"cluster-a": 5, epochComponent: 1}.String()

	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: own})
	require.NoError(t, err, "a version this Store issued resumes from its own history at any time")
	w.Stop()
	// Before every member has listed, a deletion that happened earlier may
	// never be reported: a version from elsewhere is refused and the client
	// relists.
	_, err = s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign})
	require.True(t, apierrors.IsResourceExpired(err), "%v", err)

	// The last member's list arrives (resourceVersion 7), then the
	// ClusterSet is complete.
	r.set("ns", "a", nil, "cluster-a", "cluster-c")
	notifyPool(s, "cluster-a", "ns", "a", 7)
	require.Eventually(t, func() bool {
		o, _, _ := s.Get("ns", "a")
		v, _ := ParseVersion(o.GetResourceVersion())
		return v["cluster-a"] == 7
	}, 5*time.Second, 5*time.Millisecond)
	cluster.mu.Lock()
	cluster.ready = true
	cluster.mu.Unlock()
	require.Eventually(t, func() bool {
		// The other replica's membership component is its own clock's.
		later := uint64(time.Now().Add(time.Hour).UnixMilli())
		w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: Version{"cluster-a": 7, reachabilityComponent: later, epochComponent: 1, viewComponent: viewOf(imports.ClusterSet{})}.String()})
		if err != nil {
			return false
		}
		w.Stop()
		return true
	}, 5*time.Second, 10*time.Millisecond, "a foreign version that covers the baseline resumes")
	_, err = s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign})
	assert.True(t, apierrors.IsResourceExpired(err), "a foreign version older than the baseline is still refused: %v", err)
}

// A replica that starts after a member deleted something places the
// member at its first list's version, not at the newest object the list
// holds: a watch resumed from another replica's version that saw the
// deletion goes on at once (it used to wait for the member's next change,
// and get 504 when the member stayed quiet). The baseline stays at the
// newest object listed: a version from between it and the list resumes
// too (a replica running since before the list moved past changes no
// object here reflects, and is resumed from as before), one from before
// it is refused.
func TestAMembersFirstListPlacesVersionsOfAnotherReplica(t *testing.T) {
	baselineInterval = 10 * time.Millisecond
	blockTimeout = 300 * time.Millisecond
	t.Cleanup(func() { blockTimeout = 3 * time.Second })
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	s, cluster := startSyncingStore(t, r)

	// The member's first list: ns/a, last changed at 5; the list's own
	// version is 9 (ns/b was deleted at 9, which the other replica saw).
	notifyPool(s, "cluster-a", "ns", "a", 5)
	s.Notify(clusterset.Event{Member: "cluster-a", Kind: clusterset.KindListed, ResourceVersion: 9})
	require.Eventually(t, func() bool {
		_, rv, _ := s.ListWithOptions(context.Background(), ListOptions{})
		v, _ := ParseVersion(rv)
		return v["cluster-a"] == 9
	}, 5*time.Second, 5*time.Millisecond)
	cluster.mu.Lock()
	cluster.ready = true
	cluster.mu.Unlock()
	later := uint64(time.Now().Add(time.Hour).UnixMilli())
	foreign := func(n uint64) string {
		return Version{"cluster-a": n, reachabilityComponent: later, epochComponent: 1, viewComponent: viewOf(imports.ClusterSet{})}.String()
	}
	require.Eventually(t, func() bool {
		w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign(9)})
		if err != nil {
			return false
		}
		w.Stop()
		return true
	}, 5*time.Second, 10*time.Millisecond, "a version that saw the deletion before the list resumes")
	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign(7)})
	if assert.NoError(t, err, "a version from between the newest listed object and the list resumes") {
		w.Stop()
	}
	_, err = s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign(4)})
	assert.True(t, apierrors.IsResourceExpired(err), "a version from before the newest listed object is refused: %v", err)
}

func TestAChangeWithoutANewerMemberVersionStillGetsANewVersion(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	s := startStore(t, r)
	notifyPool(s, "cluster-a", "ns", "a", 5)
	_, listed, _ := s.ListWithOptions(context.Background(), ListOptions{})

	// A deletion seen only through a relist carries no resourceVersion.
	r.remove("ns", "a")
	notifyPool(s, "cluster-a", "ns", "a", 0)
	require.Eventually(t, func() bool { _, ok, _ := s.Get("ns", "a"); return !ok }, 5*time.Second, 5*time.Millisecond)
	_, after, _ := s.ListWithOptions(context.Background(), ListOptions{})
	assert.NotEqual(t, listed, after)

	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: listed})
	require.NoError(t, err)
	defer w.Stop()
	ev := next(t, w)
	assert.Equal(t, watch.Deleted, ev.Type, "a client that listed before the deletion sees it when it resumes")
	assert.Equal(t, after, ev.Object.(Object).GetResourceVersion())
}

func TestAStoppedStoreEndsItsWatchesAndRefusesNewOnes(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := NewStore(r, emptySnapshot{}, func() Object { return &inference.InferencePoolImport{} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	require.Eventually(t, s.Ready, 5*time.Second, 5*time.Millisecond)
	w, err := s.Watch(context.Background(), WatchOptions{})
	require.NoError(t, err)

	cancel()
	<-done
	select {
	case _, ok := <-w.ResultChan():
		assert.False(t, ok, "the watch ends")
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end when the store stopped")
	}
	_, err = s.Watch(context.Background(), WatchOptions{})
	assert.True(t, apierrors.IsTooManyRequests(err), "%v", err)
}

// watchedWithBookmarks starts a Store serving ns1/a and a watch of it from
// a's version that allows bookmarks, sent every interval (restored when
// the test ends).
func watchedWithBookmarks(t *testing.T, interval time.Duration) (*Store, watch.Interface) {
	t.Helper()
	was := bookmarkInterval
	t.Cleanup(func() { bookmarkInterval = was })
	bookmarkInterval = interval
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns1", "a", nil, "cluster-a")
	s := startStore(t, r)
	o, _, _ := s.Get("ns1", "a")
	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: o.GetResourceVersion(), AllowBookmarks: true})
	require.NoError(t, err)
	return s, w
}

// A member change that alters no object still moves the version; a watcher
// that allows bookmarks is told so, and nothing when the version stays.
func TestBookmarksFollowTheVersionWithoutChanges(t *testing.T) {
	s, w := watchedWithBookmarks(t, 20*time.Millisecond)
	defer w.Stop()

	select {
	case ev := <-w.ResultChan():
		t.Fatalf("nothing moved, yet the watcher got %s", ev.Type)
	case <-time.After(100 * time.Millisecond):
	}

	notifyPool(s, "cluster-c", "ns1", "a", 42) // the computed object stays the same
	ev := next(t, w)
	require.Equal(t, watch.Bookmark, ev.Type)
	v, err := ParseVersion(ev.Object.(Object).GetResourceVersion())
	require.NoError(t, err)
	assert.Equal(t, uint64(42), v["cluster-c"], "the bookmark carries the moved version")
}

// A client whose watch breaks (its replica stopped) resumes on another
// replica with a version this one did not issue: its member components
// place it only roughly, so the backlog may start at changes it has seen.
// The backlog is folded, so an object deleted and added again in that
// stretch never leaves the client's cache, and one added and deleted again
// is deleted (the client may have got the addition from the other replica).
func TestAForeignVersionResumesWithoutReplayingADeletionThatWasUndone(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStore(t, r)
	step := func(member, name string, rv uint64, change func()) {
		change()
		notifyPool(s, member, "ns", name, rv)
		s.recompute(context.Background())
	}
	r.set("ns", "a", nil, "cluster-c")
	r.set("ns", "c", nil, "cluster-c")
	notifyPool(s, "cluster-c", "ns", "a", 4)
	notifyPool(s, "cluster-c", "ns", "c", 5)
	s.recompute(context.Background())
	s.takeBaseline()
	// A membership change (cluster-b became unreachable, say) stamped by
	// this replica's clock, with a change of c.
	r.set("ns", "c", nil, "cluster-c", "cluster-b")
	s.Notify(clusterset.Event{Member: "cluster-b", Kind: clusterset.KindMember, Namespace: "ns", Name: "c"})
	s.recompute(context.Background())
	c, ok, _ := s.Get("ns", "c")
	require.True(t, ok)
	stamped, err := ParseVersion(c.GetResourceVersion())
	require.NoError(t, err)
	// cluster-b moves on: whatever the membership change brought of it is
	// in its data at 1.
	notifyPool(s, "cluster-b", "ns", "c", 1)
	s.recompute(context.Background())
	// Then a was withdrawn and exported again, and b came and went.
	step("cluster-c", "a", 6, func() { r.remove("ns", "a") })
	step("cluster-c", "a", 7, func() { r.set("ns", "a", nil, "cluster-c") })
	step("cluster-c", "b", 8, func() { r.set("ns", "b", nil, "cluster-c") })
	step("cluster-c", "b", 9, func() { r.remove("ns", "b") })

	// The other replica saw the membership change and cluster-b's move,
	// and stamped them by its own clock; of cluster-c, it saw 5.
	foreign := Version{"cluster-b": 1, "cluster-c": 5, reachabilityComponent: stamped[reachabilityComponent] + 1, epochComponent: 1, viewComponent: stamped[viewComponent]}
	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign.String()})
	require.NoError(t, err)
	defer w.Stop()
	var got []string
	for {
		select {
		case ev := <-w.ResultChan():
			got = append(got, string(ev.Type)+" "+nameOf(ev))
			continue
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	assert.Equal(t, []string{"MODIFIED a", "DELETED b"}, got, "current states, in the order of their last change; nothing deleted that exists")
}

// BenchmarkAppendToAFullHistory is the cost of recording one change once
// the history holds DefaultHistorySize changes, as it does on a busy server.
func BenchmarkAppendToAFullHistory(b *testing.B) {
	s := NewStore(&tableResource{}, emptySnapshot{}, func() Object { return &inference.InferencePoolImport{} })
	e, err := s.encode(&inference.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}})
	require.NoError(b, err)
	one := []change{{typ: watch.Modified, obj: e, prev: e, step: &historyStep{moved: versionStep{{name: "cluster-a", value: 1}}}}}
	for range DefaultHistorySize {
		s.appendHistoryLocked(one)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.appendHistoryLocked(one)
	}
}

// An object the Store cannot decode (its own encoding, so a bug) is an
// internal error to whoever reads it, never a panic nor an object
// silently missing: GET and LIST fail, a watch that would send it ends
// with an error event.
func TestAnObjectThatDoesNotDecodeIsAnErrorToItsReaders(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	r.set("ns", "b", nil, "cluster-a")
	s := startStore(t, r)
	s.mu.Lock()
	s.objects[objectKey{"ns", "b"}] = &entry{namespace: "ns", name: "b", data: "garbage"}
	s.mu.Unlock()

	_, _, err := s.Get("ns", "b")
	assert.True(t, apierrors.IsInternalError(err), "GET: %v", err)
	_, ok, err := s.Get("ns", "a")
	assert.True(t, ok && err == nil, "the other objects read as ever: %v", err)
	_, _, err = s.ListWithOptions(context.Background(), ListOptions{})
	assert.True(t, apierrors.IsInternalError(err), "LIST: %v", err)
	pg, _, err := s.ListWithOptions(context.Background(), ListOptions{Limit: 1})
	require.NoError(t, err, "a page without the object decodes")
	assert.Len(t, pg.items, 1)

	w, err := s.Watch(context.Background(), WatchOptions{})
	require.NoError(t, err)
	defer w.Stop()
	var types []watch.EventType
	for ev := range w.ResultChan() {
		types = append(types, ev.Type)
		if ev.Type == watch.Error {
			status, ok := ev.Object.(*metav1.Status)
			require.True(t, ok, "%T", ev.Object)
			assert.Equal(t, metav1.StatusReasonInternalError, status.Reason)
		}
	}
	assert.Contains(t, types, watch.Error, "the watch ended with an error event: %v", types)
}

// Changes computed in one pass share the pass's member components; a
// watch cut after some of them resumes from the version of the last it
// got and gets the rest of the pass, not the next pass: each change
// carries a version of its own, as each event of the Kubernetes API does.
func TestAWatchCutWithinAPassResumesWithTheRestOfIt(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStore(t, r)
	_, start, _ := s.ListWithOptions(context.Background(), ListOptions{})
	for _, name := range []string{"a", "b", "c"} {
		r.set("ns", name, nil, "cluster-a")
	}
	// A namespace's change recomputes all its objects in one pass.
	s.Notify(clusterset.Event{Member: "cluster-a", Kind: clusterset.KindNamespace, Namespace: "ns", ResourceVersion: 7})

	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: start})
	require.NoError(t, err)
	first := next(t, w)
	w.Stop()
	require.Equal(t, watch.Added, first.Type)
	versions := map[string]bool{}
	for _, name := range []string{"a", "b", "c"} {
		o, ok, _ := s.Get("ns", name)
		require.True(t, ok)
		versions[o.GetResourceVersion()] = true
	}
	assert.Len(t, versions, 3, "each change of the pass has its own version")

	resumed, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: first.Object.(Object).GetResourceVersion()})
	require.NoError(t, err)
	defer resumed.Stop()
	var rest []string
	for range 2 {
		ev := next(t, resumed)
		assert.Equal(t, watch.Added, ev.Type)
		rest = append(rest, nameOf(ev))
	}
	assert.ElementsMatch(t, slices.DeleteFunc([]string{"a", "b", "c"}, func(n string) bool { return n == nameOf(first) }), rest,
		"the resumed watch gets the pass's other changes")

	exact, _, err := s.ListWithOptions(context.Background(), ListOptions{ResourceVersion: first.Object.(Object).GetResourceVersion(), ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	require.NoError(t, err)
	require.Len(t, exact.items, 1, "the state at a change's version has the changes up to it")
	assert.Equal(t, nameOf(first), exact.items[0].GetName())
}

// The history is cut between recomputations, never within one: a version
// within a recomputation that was cut is too old, as a version before it
// is; one within a recomputation the history keeps resumes.
func TestTheHistoryIsCutBetweenRecomputations(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStoreWithHistory(t, r, 4)
	// pass makes the objects names of namespace ns in one recomputation
	// and returns the version of the first change.
	pass := func(ns string, rv uint64, names ...string) string {
		for _, name := range names {
			r.set(ns, name, nil, "cluster-a")
		}
		s.Notify(clusterset.Event{Member: "cluster-a", Kind: clusterset.KindNamespace, Namespace: ns, ResourceVersion: rv})
		var versions []string
		require.Eventually(t, func() bool {
			versions = versions[:0]
			for _, name := range names {
				o, ok, _ := s.Get(ns, name)
				if !ok {
					return false
				}
				versions = append(versions, o.GetResourceVersion())
			}
			return true
		}, 5*time.Second, 5*time.Millisecond)
		slices.Sort(versions)
		return versions[0]
	}
	inFirst := pass("one", 10, "a", "b", "c")
	inSecond := pass("two", 11, "a", "b", "c")
	// Six changes run a history of 4 over by more than an eighth: two
	// are cut, and the rest of their recomputation with them.
	s.mu.RLock()
	assert.Len(t, s.history, 3, "the first recomputation is cut whole")
	s.mu.RUnlock()

	_, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: inFirst})
	assert.True(t, apierrors.IsResourceExpired(err) || apierrors.IsGone(err), "a version within a cut recomputation: %v", err)
	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: inSecond})
	require.NoError(t, err, "a version within a kept recomputation")
	defer w.Stop()
	for _, want := range []watch.EventType{watch.Added, watch.Added} {
		assert.Equal(t, want, next(t, w).Type, "its recomputation's other two changes")
	}
}

// A bookmark carries the Store's version: sent while a batch is still
// queued for the watcher, it would place a client cut off before the
// batch past it. The batch here is queued as a pass queues one, under the
// Store's lock with the version moved, and held from the watcher's loop
// so that only the bookmark's tick can run.
func TestNoBookmarkOvertakesAQueuedChange(t *testing.T) {
	s, w := watchedWithBookmarks(t, 10*time.Millisecond)
	defer w.Stop()

	s.mu.Lock()
	var queued *watcher
	for qw := range s.watchers {
		queued = qw
	}
	s.version.advance("cluster-a", 99)
	queued.queue.mu.Lock()
	a := s.objects[objectKey{"ns1", "a"}]
	queued.queue.batches = append(queued.queue.batches, batch{changes: []change{{typ: watch.Modified, obj: a, prev: a}}, live: []Object{nil}})
	queued.queue.mu.Unlock()
	s.mu.Unlock()

	select {
	case ev := <-w.ResultChan():
		t.Fatalf("a change is queued, yet the watcher got a %s first", ev.Type)
	case <-time.After(20 * bookmarkInterval):
	}
	select { // as push signals it
	case queued.queue.ready <- struct{}{}:
	default:
	}
	ev := next(t, w)
	assert.Equal(t, watch.Modified, ev.Type, "the queued change, then bookmarks")
	assert.Equal(t, watch.Bookmark, next(t, w).Type)
}
