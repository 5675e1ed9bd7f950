// Package inlineinformer is an informer for one handler, called in line
// from the goroutine that reads the watch.
//
// client-go's shared informer queues every change twice before a handler
// sees it: in its FIFO, whose own goroutine applies it to the cache, then
// in a buffer per handler, which keeps room for 1,024 notifications from
// the start and has two goroutines of its own. That is what lets many
// handlers share one watch, each at its own pace. A reader of many small
// resources with one handler each (a replica reading a thousand members'
// summaries) pays it once per resource and gains nothing from it: here
// client-go's Reflector writes into a store that applies each change to an
// Indexer and calls the handler at once, so the handler's pace is the
// watch's (the member's stream waits while it runs), and an informer is
// one goroutine besides its watch's.
//
// What it keeps of client-go's informer: the Reflector itself (lists,
// watch-list, resumption, bookmarks, backoff with the same defaults), the
// order of notifications (a relist's objects as adds or updates, then the
// deletions of what it no longer holds, as DeletedFinalStateUnknown), and
// the watch error handler, which a plain client-go informer
// (cache.NewInformerWithOptions) does not offer.
package inlineinformer

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Options says what an Informer keeps and whom it calls.
type Options struct {
	// Handler is called for every change, in line, one call at a time.
	Handler cache.ResourceEventHandler
	// Transform, if set, is applied to every object before it is stored
	// or handled. It must accept an object it already transformed (a
	// streaming list's objects reach the store transformed).
	Transform cache.TransformFunc
	// Indexers of the informer's Indexer.
	Indexers cache.Indexers
	// Indexer, if set, is the informer's cache in place of a new one with
	// Indexers: one that keeps something of its own on each write.
	Indexer cache.Indexer
	// WatchErrorHandler is told what each failed ListAndWatch returned
	// before the Reflector tries again; nil is client-go's default, which
	// logs it.
	WatchErrorHandler cache.WatchErrorHandlerWithContext
	// OnProgress, if set, is called in line with a resourceVersion up to
	// which the handler has been told every change: a list's, once its
	// changes are handled, and each watch event's and bookmark's. A
	// bookmark is how a server says its version moved with no change this
	// watch sees; without it a reader would learn that only from a list.
	OnProgress func(resourceVersion string)
}

// Informer lists and watches one resource into an Indexer and calls its
// handler with every change.
type Informer struct {
	lw      cache.ListerWatcher
	example runtime.Object
	onError cache.WatchErrorHandlerWithContext
	store   *store
}

// New returns an Informer of lw's resource; example is an object of its
// type. Run starts it.
func New(lw cache.ListerWatcher, example runtime.Object, opts Options) *Informer {
	indexer := opts.Indexer
	if indexer == nil {
		indexers := opts.Indexers
		if indexers == nil {
			indexers = cache.Indexers{}
		}
		indexer = cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, indexers)
	}
	onError := opts.WatchErrorHandler
	if onError == nil {
		onError = cache.DefaultWatchErrorHandler
	}
	return &Informer{
		lw:      lw,
		example: example,
		onError: onError,
		store: &store{
			indexer:    indexer,
			handler:    opts.Handler,
			transform:  opts.Transform,
			onProgress: opts.OnProgress,
		},
	}
}

// The Reflector's backoff between failed ListAndWatch calls, as client-go
// sets it when it is given none (tools/cache/reflector.go): Run drives the
// Reflector's loop itself to hear its errors, so it sets them again.
const (
	backoffInit   = 800 * time.Millisecond
	backoffMax    = 30 * time.Second
	backoffReset  = 2 * time.Minute
	backoffFactor = 2.0
	backoffJitter = 1.0
)

// Run lists and watches until ctx ends. It is the Reflector's own loop,
// with the watch error handler of the options.
func (i *Informer) Run(ctx context.Context) {
	r := cache.NewReflectorWithOptions(i.lw, i.example, i.store, cache.ReflectorOptions{})
	backoff := wait.Backoff{
		Duration: backoffInit,
		Cap:      backoffMax,
		Steps:    int(math.Ceil(float64(backoffMax) / float64(backoffInit))),
		Factor:   backoffFactor,
		Jitter:   backoffJitter,
	}
	_ = backoff.DelayWithReset(clock.RealClock{}, backoffReset).Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		if err := r.ListAndWatchWithContext(ctx); err != nil {
			i.onError(ctx, r, err)
		}
		return false, nil
	})
}

// HasSynced is true once the first list is stored and handled, and its
// version given to OnProgress.
func (i *Informer) HasSynced() bool { return i.store.synced.Load() }

// GetIndexer is the informer's cache; only the informer writes to it.
func (i *Informer) GetIndexer() cache.Indexer { return i.store.indexer }

// store is the Reflector's store: it applies each change to the indexer
// and tells the handler. The Reflector calls it from one goroutine.
type store struct {
	indexer    cache.Indexer
	handler    cache.ResourceEventHandler
	transform  cache.TransformFunc
	onProgress func(string)
	synced     atomic.Bool
}

var (
	_ cache.TransformingStore      = &store{}
	_ cache.ResourceVersionUpdater = &store{}
)

// UpdateResourceVersion is the Reflector's word, after each watch event
// (a bookmark included), that the store has it.
func (s *store) UpdateResourceVersion(rv string) {
	if s.onProgress != nil {
		s.onProgress(rv)
	}
}

func (s *store) Transformer() cache.TransformFunc { return s.transform }

func (s *store) transformed(obj interface{}) (interface{}, error) {
	if s.transform == nil {
		return obj, nil
	}
	return s.transform(obj)
}

func (s *store) Add(obj interface{}) error { return s.Update(obj) }

func (s *store) Update(obj interface{}) error {
	obj, err := s.transformed(obj)
	if err != nil {
		return err
	}
	return s.put(obj, false)
}

// put stores obj, transformed, and tells the handler: an update of what
// was stored under its key, else an add.
func (s *store) put(obj interface{}, initial bool) error {
	old, exists, err := s.indexer.Get(obj)
	if err != nil {
		return err
	}
	if exists {
		if err := s.indexer.Update(obj); err != nil {
			return err
		}
		s.handler.OnUpdate(old, obj)
		return nil
	}
	if err := s.indexer.Add(obj); err != nil {
		return err
	}
	s.handler.OnAdd(obj, initial)
	return nil
}

func (s *store) Delete(obj interface{}) error {
	obj, err := s.transformed(obj)
	if err != nil {
		return err
	}
	if err := s.indexer.Delete(obj); err != nil {
		return err
	}
	s.handler.OnDelete(obj)
	return nil
}

// Replace stores a (re)list: each object as an add or an update, then the
// deletion of every stored object the list no longer holds, with its last
// known state (DeletedFinalStateUnknown, as client-go's informers tell a
// deletion seen only by a relist). The first list's adds are initial.
func (s *store) Replace(list []interface{}, rv string) error {
	initial := !s.synced.Load()
	listed := make(map[string]struct{}, len(list))
	for _, obj := range list {
		obj, err := s.transformed(obj)
		if err != nil {
			return err
		}
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return err
		}
		listed[key] = struct{}{}
		if err := s.put(obj, initial); err != nil {
			return err
		}
	}
	for _, key := range s.indexer.ListKeys() {
		if _, ok := listed[key]; ok {
			continue
		}
		old, exists, err := s.indexer.GetByKey(key)
		if err != nil || !exists {
			continue
		}
		if err := s.indexer.Delete(old); err != nil {
			return err
		}
		s.handler.OnDelete(cache.DeletedFinalStateUnknown{Key: key, Obj: old})
	}
	s.UpdateResourceVersion(rv)
	s.synced.Store(true)
	return nil
}

// Resync does nothing: an Informer has no resync period.
func (s *store) Resync() error { return nil }
