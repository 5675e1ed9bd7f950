package inlineinformer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// recorder writes down what the handler was told, in order.
type recorder struct{ calls []string }

func (r *recorder) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, initial bool) {
			r.calls = append(r.calls, fmt.Sprintf("add %s initial=%t", describe(obj), initial))
		},
		UpdateFunc: func(old, obj interface{}) {
			r.calls = append(r.calls, fmt.Sprintf("update %s -> %s", describe(old), describe(obj)))
		},
		DeleteFunc: func(obj interface{}) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				r.calls = append(r.calls, fmt.Sprintf("delete unknown %s (%s)", d.Key, describe(d.Obj)))
				return
			}
			r.calls = append(r.calls, "delete "+describe(obj))
		},
	}
}

func describe(obj interface{}) string {
	s := obj.(*corev1.ConfigMap)
	return s.Namespace + "/" + s.Name + "@" + s.ResourceVersion + s.Labels["transformed"]
}

func configMap(name, rv string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}}
}

// mark is a transform that shows it ran, once.
func mark(obj interface{}) (interface{}, error) {
	c := obj.(*corev1.ConfigMap).DeepCopy()
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	c.Labels["transformed"] += "+t"
	return c, nil
}

func newStore(r *recorder) *store {
	return &store{indexer: cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{}), handler: r.handler(), transform: mark}
}

func TestTheHandlerIsToldEachChangeAsAClientGoInformerTellsIt(t *testing.T) {
	tests := []struct {
		name string
		do   func(s *store) error
		want []string
	}{{
		name: "the first list's objects are initial adds, and the informer has synced after them",
		do: func(s *store) error {
			return s.Replace([]interface{}{configMap("a", "1"), configMap("b", "2")}, "2")
		},
		want: []string{"add ns/a@1+t initial=true", "add ns/b@2+t initial=true"},
	}, {
		name: "a watched add is not initial; a second add of the same key is an update",
		do: func(s *store) error {
			if err := s.Replace(nil, "1"); err != nil {
				return err
			}
			if err := s.Add(configMap("a", "2")); err != nil {
				return err
			}
			return s.Add(configMap("a", "3"))
		},
		want: []string{"add ns/a@2+t initial=false", "update ns/a@2+t -> ns/a@3+t"},
	}, {
		name: "an update of an unknown key is an add, a deletion is told with the object",
		do: func(s *store) error {
			if err := s.Replace(nil, "1"); err != nil {
				return err
			}
			if err := s.Update(configMap("a", "2")); err != nil {
				return err
			}
			return s.Delete(configMap("a", "3"))
		},
		want: []string{"add ns/a@2+t initial=false", "delete ns/a@3+t"},
	}, {
		name: "a relist updates what it holds, adds what is new, then deletes what it no longer holds with its last state",
		do: func(s *store) error {
			if err := s.Replace([]interface{}{configMap("a", "1"), configMap("b", "2")}, "2"); err != nil {
				return err
			}
			return s.Replace([]interface{}{configMap("b", "5"), configMap("c", "6")}, "6")
		},
		want: []string{
			"add ns/a@1+t initial=true", "add ns/b@2+t initial=true",
			"update ns/b@2+t -> ns/b@5+t", "add ns/c@6+t initial=false", "delete unknown ns/a (ns/a@1+t)",
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{}
			s := newStore(r)
			require.NoError(t, tt.do(s))
			assert.Equal(t, tt.want, r.calls)
			assert.True(t, s.synced.Load())
		})
	}
}

func TestTheIndexerHoldsWhatTheHandlerWasLastTold(t *testing.T) {
	r := &recorder{}
	s := newStore(r)
	assert.False(t, s.synced.Load(), "nothing listed yet")
	require.NoError(t, s.Replace([]interface{}{configMap("a", "1"), configMap("b", "2")}, "2"))
	require.NoError(t, s.Update(configMap("b", "3")))
	require.NoError(t, s.Delete(configMap("a", "4")))
	keys := s.indexer.ListKeys()
	assert.Equal(t, []string{"ns/b"}, keys)
	obj, _, err := s.indexer.GetByKey("ns/b")
	require.NoError(t, err)
	assert.Equal(t, "ns/b@3+t", describe(obj), "stored transformed, once")
}

// The informer's progress comes after the changes it covers: a list's
// version once its objects are handled, then each watch event's, and a
// bookmark's, which is the only word a watcher gets that its server's
// version moved with no change it sees. It runs client-go's Reflector on a
// scripted list and watch.
func TestProgressComesAfterTheChangesItCovers(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := &recorder{}
	watcher := watch.NewFake()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []corev1.ConfigMap{*configMap("a", "3")}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if opts.ResourceVersion != "5" {
				return nil, fmt.Errorf("watch from %q, not from the list's version", opts.ResourceVersion)
			}
			return watcher, nil
		},
	}
	progressed := make(chan string, 10)
	i := New(lw, &corev1.ConfigMap{}, Options{Handler: r.handler(), OnProgress: func(rv string) {
		r.calls = append(r.calls, "progress "+rv)
		progressed <- rv
	}})
	next := func() string {
		select {
		case rv := <-progressed:
			return rv
		case <-time.After(10 * time.Second):
			t.Fatalf("no progress told; the handler was told %v", r.calls)
			return ""
		}
	}
	go i.Run(ctx)
	require.Equal(t, "5", next())
	assert.True(t, i.HasSynced(), "synced once its list's progress is told")
	watcher.Add(configMap("b", "7"))
	require.Equal(t, "7", next())
	watcher.Action(watch.Bookmark, configMap("", "12"))
	require.Equal(t, "12", next())
	cancel()
	assert.Equal(t, []string{"add ns/a@3 initial=true", "progress 5", "add ns/b@7 initial=false", "progress 7", "progress 12"}, r.calls)
}
