package virtual

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// watcherBuffer bounds the batches of changes queued for one watcher. A
// watcher that falls this far behind is cut off (its watch ends) rather
// than allowed to grow the server's memory; the client re-watches from its
// last resourceVersion.
const watcherBuffer = 4096

// batchQueue is a watcher's queue of batches of changes, bounded by
// watcherBuffer. It grows only as far as the watcher lags: a channel of
// that capacity cost 96 KiB per open watch however idle the watch was,
// most of the server's heap per watch.
type batchQueue struct {
	mu      sync.Mutex
	batches []batch
	// ready has a value while batches may be non-empty.
	ready chan struct{}
}

func newBatchQueue() *batchQueue { return &batchQueue{ready: make(chan struct{}, 1)} }

// push queues a batch; false when watcherBuffer batches wait already.
func (q *batchQueue) push(b batch) bool {
	q.mu.Lock()
	if len(q.batches) >= watcherBuffer {
		q.mu.Unlock()
		return false
	}
	q.batches = append(q.batches, b)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

// pop takes the oldest batch, if any.
func (q *batchQueue) pop() (batch, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.batches) == 0 {
		return batch{}, false
	}
	b := q.batches[0]
	q.batches[0] = batch{}
	q.batches = q.batches[1:]
	if len(q.batches) == 0 {
		q.batches = nil // let an emptied queue's array go
	}
	return b, true
}

// pending reports whether a batch waits.
func (q *batchQueue) pending() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.batches) > 0
}

// bookmarkInterval is how often a watcher that allows bookmarks is told the
// current resourceVersion when it moved since what the watcher last got.
// Member changes that alter no object still move the version; a client
// that resumes on another replica must hold a recent one, or that replica
// (whose state started after those changes) cannot tell that the client
// missed nothing, and answers 410.
var bookmarkInterval = time.Second

// WatchOptions select what a watch sees and where it starts.
type WatchOptions struct {
	Namespace string
	// Match selects the objects watched; nil selects every one.
	Match func(Object) bool
	// ResourceVersion to start after; "" or "0" starts with the current
	// state sent as ADDED events.
	ResourceVersion   string
	SendInitialEvents bool
	AllowBookmarks    bool
}

// Watch starts a watch. A resourceVersion older than the retained history
// gets 410 Gone, one not issued by this server 400 Bad Request. One issued
// by another replica or run resumes when the member components and the
// view (resume.go), or the state it names (state.go), prove that the
// client misses nothing, and gets 410 Gone otherwise.
func (s *Store) Watch(ctx context.Context, opts WatchOptions) (watch.Interface, error) {
	var since Version
	if opts.ResourceVersion != "" && opts.ResourceVersion != "0" {
		v, err := ParseVersion(opts.ResourceVersion)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		since = v
	}

	// A watch may arrive before the periodic check noticed that the
	// ClusterSet became complete.
	s.takeBaseline()
	// unplaced says why the member components cannot place a version
	// another Store issued; its state may still (foreignBacklogLocked).
	var unplaced error
	if since != nil && !opts.SendInitialEvents && since[epochComponent] != s.epoch {
		unplaced = s.checkBaseline(since, opts.ResourceVersion)
		// Another replica may have read further than this one: wait for
		// this Store to get there, as a LIST does, so that the passes
		// that bring it there are in the history resumeFromLocked checks.
		if unplaced == nil {
			if err := s.waitFor(ctx, since); err != nil {
				return nil, err
			}
		}
	}
	w := &watcher{
		store:  s,
		opts:   opts,
		queue:  newBatchQueue(),
		result: make(chan watch.Event),
		done:   make(chan struct{}),
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		// What the API server answers a watch during its shutdown.
		return nil, apierrors.NewTooManyRequests("the server is shutting down; retry the watch", 1)
	}
	var initial []*entry
	var backlog []change
	initialVersion := s.version.String()
	switch {
	case since == nil || opts.SendInitialEvents:
		initial = s.entriesIn("")
	case since[epochComponent] != s.epoch:
		var err error
		if backlog, err = s.foreignBacklogLocked(since, opts.ResourceVersion, unplaced); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	default:
		first, ok := s.firstUncovered(since)
		if !ok || !since.Covers(s.historyStart) {
			s.mu.Unlock()
			return nil, apierrors.NewResourceExpired("too old resource version: " + opts.ResourceVersion + " (the server keeps a limited history; relist)")
		}
		backlog = slices.Clone(s.history[first:])
	}
	s.watchers[w] = struct{}{}
	s.mu.Unlock()

	go w.run(ctx, initial, initialVersion, backlog)
	return w, nil
}

// checkBaseline refuses a version another Store issued that does not
// cover this Store's baseline.
func (s *Store) checkBaseline(since Version, rv string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.baseline == nil || !since.coversMembers(s.baseline) {
		return apierrors.NewResourceExpired("resource version " + rv + " was issued by another replica or an earlier run of the server, before this one had listed every member cluster; relist")
	}
	return nil
}

// netChanges folds a backlog into one change per object, from its state
// before the backlog to its state now, in the order of each object's last
// change (so resourceVersions still grow). A version another replica
// issued places the client only roughly in this Store's history (by its
// member components alone), so the backlog of a foreign version starts
// early, at changes the client has seen already; replayed
// one by one, an object deleted and added again in that stretch would
// leave the client's cache and come back. Folded, the client gets its
// objects' current states, some it has already (which an informer takes as
// an update), never an object gone that exists, and the deletion of an
// object added and deleted again, whose addition it may have seen (an
// informer ignores the deletion of an object it does not have).
func netChanges(backlog []change) []change {
	type span struct{ first, last int }
	spans := map[objectKey]*span{}
	var order []objectKey
	for i, c := range backlog {
		k := c.obj.objectKey()
		if sp, ok := spans[k]; ok {
			sp.last = i
			continue
		}
		spans[k] = &span{first: i, last: i}
		order = append(order, k)
	}
	slices.SortFunc(order, func(a, b objectKey) int { return spans[a].last - spans[b].last })
	out := make([]change, 0, len(order))
	for _, k := range order {
		first, last := backlog[spans[k].first], backlog[spans[k].last]
		existed, exists := first.typ != watch.Added, last.typ != watch.Deleted
		switch {
		case existed && exists:
			out = append(out, change{typ: watch.Modified, obj: last.obj, prev: first.prev})
		case existed:
			out = append(out, change{typ: watch.Deleted, obj: last.obj, prev: first.prev})
		case exists:
			out = append(out, change{typ: watch.Added, obj: last.obj})
		default:
			// Added and deleted again: the client may have got the
			// addition from the other replica.
			out = append(out, change{typ: watch.Deleted, obj: last.obj, prev: last.prev})
		}
	}
	return out
}

type watcher struct {
	store  *Store
	opts   WatchOptions
	queue  *batchQueue
	result chan watch.Event

	stopOnce sync.Once
	done     chan struct{}
}

// send queues changes for the watcher; it is called with the store locked.
func (w *watcher) send(b batch) {
	if !w.queue.push(b) {
		// Too slow: cut it off rather than buffer without bound.
		w.stopLocked()
	}
}

// stopLocked ends the watcher; the store's lock is held.
func (w *watcher) stopLocked() {
	w.stopOnce.Do(func() {
		delete(w.store.watchers, w)
		close(w.done)
	})
}

// Stop implements watch.Interface.
func (w *watcher) Stop() {
	w.store.mu.Lock()
	w.stopLocked()
	w.store.mu.Unlock()
}

// ResultChan implements watch.Interface.
func (w *watcher) ResultChan() <-chan watch.Event { return w.result }

func (w *watcher) run(ctx context.Context, initial []*entry, initialVersion string, backlog []change) {
	defer close(w.result)
	defer w.Stop()
	// sent is the resourceVersion the client last got: at first, the one
	// it asked to start from.
	sent := w.opts.ResourceVersion
	emit := func(e watch.Event) bool {
		select {
		case w.result <- e:
			if o, ok := e.Object.(metav1.Object); ok {
				sent = o.GetResourceVersion()
			}
			return true
		case <-w.done:
			return false
		case <-ctx.Done():
			return false
		}
	}
	// deliver sends what a change shows this watcher and says whether to
	// go on: an object the Store cannot decode ends the watch with an
	// error (the client relists).
	deliver := func(c change, live Object) bool {
		e, ok := w.filter(c, live)
		return !ok || (emit(e) && e.Type != watch.Error)
	}
	for _, e := range initial {
		if !deliver(change{typ: watch.Added, obj: e}, nil) {
			return
		}
	}
	// The end of the initial events is a bookmark, so it is sent only to a
	// client that allows bookmarks: the API server defaults
	// sendInitialEvents to true for a watch without a resourceVersion, and
	// such a client expects plain ADDED events and nothing else.
	if w.opts.SendInitialEvents && w.opts.AllowBookmarks {
		b := w.bookmark(initialVersion)
		b.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		if !emit(watch.Event{Type: watch.Bookmark, Object: b}) {
			return
		}
	}
	for _, c := range backlog {
		if !deliver(c, nil) {
			return
		}
	}
	var ticks <-chan time.Time
	if w.opts.AllowBookmarks {
		t := time.NewTicker(bookmarkInterval)
		defer t.Stop()
		ticks = t.C
	}
	for {
		select {
		case <-w.done:
			return
		case <-ctx.Done():
			return
		case <-w.queue.ready:
			for b, ok := w.queue.pop(); ok; b, ok = w.queue.pop() {
				for i, c := range b.changes {
					if !deliver(c, b.live[i]) {
						return
					}
				}
			}
		case <-ticks:
			// A batch is queued under the Store's lock as its version
			// moves: with none queued, this watcher has been sent every
			// change up to the version read under that lock. With one
			// queued, a bookmark sent ahead of it would place a client
			// cut off before it past it.
			w.store.mu.RLock()
			rv, behind := w.store.version.String(), w.queue.pending()
			w.store.mu.RUnlock()
			if behind || rv == sent {
				continue
			}
			if !emit(watch.Event{Type: watch.Bookmark, Object: w.bookmark(rv)}) {
				return
			}
		}
	}
}

func (w *watcher) bookmark(rv string) Object {
	o := w.store.newFunc()
	o.SetResourceVersion(rv)
	return o
}

// filter turns a change into the event this watcher sees: an object that
// starts or stops matching the watcher's selectors is ADDED or DELETED.
// The objects are decoded only for a watcher that selects them.
func (w *watcher) filter(c change, live Object) (watch.Event, bool) {
	if w.opts.Namespace != "" && c.obj.namespace != w.opts.Namespace {
		return watch.Event{}, false
	}
	obj := live
	if obj == nil {
		var err error
		if obj, err = w.store.decode(c.obj); err != nil {
			return errorEvent(err), true
		}
	}
	now := w.opts.Match == nil || w.opts.Match(obj)
	if c.typ != watch.Modified {
		return watch.Event{Type: c.typ, Object: obj}, now
	}
	was := c.prev != nil
	if was && w.opts.Match != nil {
		prev, err := w.store.decode(c.prev)
		if err != nil {
			return errorEvent(err), true
		}
		was = w.opts.Match(prev)
	}
	switch {
	case now && was:
		return watch.Event{Type: watch.Modified, Object: obj}, true
	case now:
		return watch.Event{Type: watch.Added, Object: obj}, true
	case was:
		return watch.Event{Type: watch.Deleted, Object: obj}, true
	}
	return watch.Event{}, false
}

// errorEvent is the event that ends a watch with err, as the API server's
// watch cache sends one.
func errorEvent(err error) watch.Event {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		status = apierrors.NewInternalError(err)
	}
	st := status.Status()
	return watch.Event{Type: watch.Error, Object: &st}
}
