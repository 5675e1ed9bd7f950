package clusterset

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// TestADeletionSeenOnlyThroughARelistHasNoResourceVersion runs client-go's
// informer on a member whose namespace b is deleted through the watch and
// whose namespace a is deleted while the watch is down, its resourceVersion
// expired, so that only the relist shows it gone (the informer's
// DeletedFinalStateUnknown). The first deletion carries the member's
// resourceVersion at the deletion; the second has none (0), as Event
// documents: the last version the cache knew of a is not the member's
// version at a's deletion, and a watch resumed on another replica at a
// version past it must not take the deletion as seen.
func TestADeletionSeenOnlyThroughARelistHasNoResourceVersion(t *testing.T) {
	namespace := func(name, rv string) corev1.Namespace {
		return corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
	}
	var lists atomic.Int32
	watches := make(chan *watch.FakeWatcher, 2)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			if lists.Add(1) == 1 {
				return &corev1.NamespaceList{ListMeta: metav1.ListMeta{ResourceVersion: "6"}, Items: []corev1.Namespace{namespace("a", "5"), namespace("b", "6")}}, nil
			}
			// Relisted after the watch expired: a was deleted meanwhile.
			return &corev1.NamespaceList{ListMeta: metav1.ListMeta{ResourceVersion: "9"}}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			w := watch.NewFake()
			watches <- w
			return w, nil
		},
	}
	informer := cache.NewSharedIndexInformer(noWatchList{lw}, &corev1.Namespace{}, 0, cache.Indexers{})

	var mu sync.Mutex
	var events []Event
	m := &member{name: "cluster-b", handler: func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}}
	m.watch(informer, KindNamespace)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go informer.RunWithContext(ctx)
	eventsOf := func() []Event {
		mu.Lock()
		defer mu.Unlock()
		return append([]Event(nil), events...)
	}
	ev := func(name string, rv uint64) Event {
		return Event{Member: "cluster-b", Kind: KindNamespace, Namespace: name, Name: name, ResourceVersion: rv}
	}

	var w *watch.FakeWatcher
	require.Eventually(t, func() bool {
		select {
		case w = <-watches:
			return true
		default:
			return false
		}
	}, 10*time.Second, 10*time.Millisecond, "the informer lists, then watches")
	gone := namespace("b", "7")
	w.Delete(&gone)
	require.Eventually(t, func() bool { return len(eventsOf()) == 3 }, 10*time.Second, 10*time.Millisecond)
	assert.ElementsMatch(t, []Event{ev("a", 5), ev("b", 6)}, eventsOf()[:2], "each listed namespace at its version")
	assert.Equal(t, ev("b", 7), eventsOf()[2], "a deletion the watch shows, at the member's version of the deletion")

	// The watch expires (410 Gone, as after an etcd compaction): the
	// informer lists again, and a is no longer there.
	w.Error(&apierrors.NewResourceExpired("too old resource version: 6 (8)").ErrStatus)
	require.Eventually(t, func() bool { return len(eventsOf()) == 4 }, 30*time.Second, 10*time.Millisecond, "the relist shows a gone")
	assert.Equal(t, int32(2), lists.Load())
	assert.Equal(t, ev("a", 0), eventsOf()[3], "a deletion only the relist shows has no resourceVersion, not a's last known one (5)")
}

// noWatchList is a ListerWatcher that says it streams no lists, so that the
// reflector lists, then watches.
type noWatchList struct{ *cache.ListWatch }

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }
