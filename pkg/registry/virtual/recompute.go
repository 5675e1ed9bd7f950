package virtual

import (
	"context"
	"runtime"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/compact"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/versionvector"
)

// computed is one object as a recomputation found it.
type computed struct {
	key string
	obj Object // nil: not served
	// prev is the entry served under key when the object was computed,
	// and was its object, decoded then (computeKeys; nil when none, when
	// not decoded beside the computation, or when it did not decode:
	// applyLocked decodes it again, and says why).
	prev *entry
	was  Object
	// digest is obj's (digestOf), or digestErr why it has none.
	digest    compact.Digest
	digestErr error
}

// recompute brings the served objects up to date with what changed since
// the last pass: it computes the dirty objects from a snapshot of the
// ClusterSet, outside the lock, then records what differs, moves the
// version, and sends the changes to the history and the watchers. It
// returns how long it took when it computed objects, 0 when it only
// moved the version.
func (s *Store) recompute(ctx context.Context) (took time.Duration) {
	start := time.Now()
	s.pendingMu.Lock()
	dirty, advanced, events := s.pending, s.pendingV, s.pendingEvents
	s.pending, s.pendingV, s.pendingEvents = Dirty{}, Version{}, map[string]memberEvents{}
	s.pendingMu.Unlock()

	if dirty.empty() {
		// Events that change none of this Store's objects (another
		// resource's, lists, bookmarks): the version moves past them and
		// nothing is computed, so no snapshot is taken, which costs a look
		// at every member. A view that changed meanwhile is seen at the
		// next pass that computes: every change of the view is a member
		// event, and until one is computed every object served is still
		// the one computed with the view the version names.
		s.mu.Lock()
		s.moveLocked(events, advanced)
		s.mu.Unlock()
		recomputeDuration.WithLabelValues(s.kind, "versions").Observe(time.Since(start).Seconds())
		return 0
	}
	defer func() {
		took = time.Since(start)
		recomputeDuration.WithLabelValues(s.kind, "objects").Observe(took.Seconds())
	}()

	cs := s.cluster.Snapshot()
	// Every object served at a version is computed with the view the
	// version names: a view that changed before its member event arrived
	// recomputes everything now.
	view := viewOf(cs)
	s.mu.RLock()
	viewChanged := s.version[viewComponent] != view
	s.mu.RUnlock()
	if viewChanged {
		dirty.All = true
		advanced.advance(viewComponent, view)
		advanced.advance(reachabilityComponent, uint64(s.now().UnixMilli()))
	}
	results, replaceNamespace := s.compute(cs, dirty)

	now := metav1.NewTime(s.now().Truncate(time.Second))
	log := klog.FromContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	moved := s.moveLocked(events, advanced)
	changes, present := s.applyLocked(log, results, now)
	changes = append(changes, s.deleteUncomputedLocked(log, replaceNamespace, present)...)
	if len(changes) == 0 {
		return // took is set when deferred
	}
	if !moved {
		s.versionChangesLocked()
	}
	s.publishLocked(ctx, s.commitLocked(log, changes))
	return
}

// compute computes the dirty objects: every one, the whole of each dirty
// namespace, then each dirty key outside those. replaceNamespace names the
// namespaces computed whole ("" for all), whose objects not computed again
// are gone.
func (s *Store) compute(cs imports.ClusterSet, dirty Dirty) (results []computed, replaceNamespace map[string]bool) {
	replaceNamespace = map[string]bool{}
	if dirty.All {
		replaceNamespace[""] = true
		for _, o := range s.resource.ComputeNamespace(cs, "") {
			results = append(results, s.computedOf(key(o.GetNamespace(), o.GetName()), o))
		}
		return results, replaceNamespace
	}
	seen := map[string]bool{}
	for _, ns := range dirty.Namespaces {
		if replaceNamespace[ns] {
			continue
		}
		replaceNamespace[ns] = true
		for _, o := range s.resource.ComputeNamespace(cs, ns) {
			k := key(o.GetNamespace(), o.GetName())
			seen[k] = true
			results = append(results, s.computedOf(k, o))
		}
	}
	var keys []string
	for _, k := range dirty.Keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		if ns, _ := splitKey(k); replaceNamespace[ns] {
			continue
		}
		keys = append(keys, k)
	}
	return append(results, s.computeKeys(cs, keys)...), replaceNamespace
}

// computeKeys computes the objects of keys, and decodes the ones served
// that they are compared with, on as many cores as there are and outside
// the lock that readers wait for: an object of a large ClusterSet (an
// import of a pool a thousand clusters export) takes milliseconds, and a
// change waits for its pass. A pass that computes whole namespaces is
// left to compare them one at a time, under the lock, so that it never
// holds every object twice.
func (s *Store) computeKeys(cs imports.ClusterSet, keys []string) []computed {
	results := make([]computed, len(keys))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, k := range keys {
		g.Go(func() error {
			ns, name := splitKey(k)
			r := computed{key: k}
			if o, ok := s.resource.Compute(cs, ns, name); ok {
				r = s.computedOf(k, o)
				r.prev, r.was = s.served(k)
			}
			results[i] = r
			return nil
		})
	}
	_ = g.Wait() // nothing fails
	return results
}

// computedOf is o, computed under key, with its digest.
func (s *Store) computedOf(key string, o Object) computed {
	d, err := s.digestOf(o)
	return computed{key: key, obj: o, digest: d, digestErr: err}
}

// moveLocked moves the version past a pass's events, advanced, and
// reports whether it moved.
func (s *Store) moveLocked(events map[string]memberEvents, advanced Version) (moved bool) {
	unplaced := s.placeLocked(events, advanced)
	moved = s.advanceLocked(advanced)
	s.markLocked(unplaced)
	return moved
}

// served is the entry served under key and its object, decoded (nil when
// it does not decode: applyLocked decodes it again and says why). Only
// the Store's loop changes what is served, so applyLocked finds the same
// entry.
func (s *Store) served(key string) (*entry, Object) {
	s.mu.RLock()
	prev := s.objects[objectKeyOf(key)]
	s.mu.RUnlock()
	if prev == nil {
		return nil, nil
	}
	was, err := s.decode(prev)
	if err != nil {
		return prev, nil
	}
	return prev, was
}

// advanceLocked moves the version by the member resourceVersions seen since
// the last pass, and reports whether it moved.
func (s *Store) advanceLocked(advanced Version) (moved bool) {
	for k, n := range advanced {
		// The view orders nothing: a change it alone moved needs a new
		// stamp (versionChangesLocked) like any other unordered change.
		if s.version.advance(k, n) && k != viewComponent {
			moved = true
		}
	}
	if moved {
		close(s.advanced)
		s.advanced = make(chan struct{})
	}
	return moved
}

// applyLocked finds the computed objects that differ from those served
// and returns their changes (commitLocked keeps them), with the keys
// computed.
func (s *Store) applyLocked(log klog.Logger, results []computed, now metav1.Time) (changes []liveChange, present map[string]bool) {
	present = map[string]bool{}
	for _, r := range results {
		present[r.key] = true
		prev := s.objects[objectKeyOf(r.key)]
		if r.obj == nil {
			if prev != nil {
				changes = s.appendDeleteLocked(log, changes, prev)
			}
			continue
		}
		if r.digestErr != nil {
			log.Error(r.digestErr, "Cannot keep a computed object; it stays as served", "object", r.key)
			continue
		}
		var was Object
		switch {
		case prev == nil:
		case prev == r.prev && r.was != nil:
			was = r.was
		default:
			var err error
			if was, err = s.decode(prev); err != nil {
				log.Error(err, "Cannot compare a computed object with the one served; it stays as served")
				continue
			}
		}
		s.resource.CarryTransitionTimes(was, r.obj, now)
		typ := watch.Added
		if was != nil {
			r.obj.SetResourceVersion(was.GetResourceVersion())
			if equality.Semantic.DeepEqual(was, r.obj) {
				continue
			}
			typ = watch.Modified
		}
		changes = append(changes, liveChange{typ: typ, obj: r.obj, prev: prev, digest: r.digest})
	}
	return changes, present
}

// appendDeleteLocked appends the deletion of the object whose entry is
// prev: the deleted object, which commitLocked gives the version of its
// deletion, as the Kubernetes API does (prev is kept so that a LIST at an
// exact earlier version can undo the deletion).
func (s *Store) appendDeleteLocked(log klog.Logger, changes []liveChange, prev *entry) []liveChange {
	gone, err := s.decode(prev)
	if err != nil {
		log.Error(err, "Cannot delete a served object; it stays as served")
		return changes
	}
	return append(changes, liveChange{typ: watch.Deleted, obj: gone, prev: prev})
}

// deleteUncomputedLocked deletes the objects of a recomputed namespace
// that are no longer computed.
func (s *Store) deleteUncomputedLocked(log klog.Logger, replaceNamespace, present map[string]bool) []liveChange {
	var changes []liveChange
	for ns := range replaceNamespace {
		for _, prev := range s.entriesIn(ns) {
			if !present[prev.key()] {
				changes = s.appendDeleteLocked(log, changes, prev)
			}
		}
	}
	return changes
}

// versionChangesLocked gives changes that no member resourceVersion moved
// (deletions seen only through a relist, say) a version no client holds
// yet: one that listed at the current version would otherwise skip them
// when it resumes.
func (s *Store) versionChangesLocked() {
	s.version.advance(reachabilityComponent, max(uint64(s.now().UnixMilli()), s.version[reachabilityComponent]+1))
	close(s.advanced)
	s.advanced = make(chan struct{})
}

// commitLocked gives each change its version (versionWithin) and keeps its object:
// encoded (entry), in place of the one it changes. A change whose object
// cannot be encoded (a bug) is logged and left out: the object stays as
// served.
func (s *Store) commitLocked(log klog.Logger, changes []liveChange) batch {
	// Every change is kept: its object encoded for its digest, so the
	// encoding below (the same, and compressed into memory) cannot fail
	// but by a bug, and the state names them all.
	s.setStateLocked(changes)
	rv := s.version.String()
	b := batch{changes: make([]change, 0, len(changes)), live: make([]Object, 0, len(changes))}
	for i, c := range changes {
		c.obj.SetResourceVersion(s.versionWithin(rv, len(b.changes), i == len(changes)-1))
		e, err := s.encode(c.obj)
		if err != nil {
			log.Error(err, "Cannot keep a computed object; it stays as served", "object", key(c.obj.GetNamespace(), c.obj.GetName()))
			continue
		}
		if c.typ == watch.Deleted {
			delete(s.objects, e.objectKey())
		} else {
			s.objects[e.objectKey()] = e
		}
		b.changes = append(b.changes, change{typ: c.typ, obj: e, prev: c.prev, inPass: len(b.changes)})
		b.live = append(b.live, c.obj)
	}
	return b
}

// versionWithin is the version of the k-th change kept of a
// recomputation (from 0): rv, the current version, for its last change;
// for the others, the current version with passComponent at k+1, so that
// a client cut off after the k-th resumes with the rest of them.
func (s *Store) versionWithin(rv string, k int, last bool) string {
	if last {
		return rv
	}
	if within, err := versionvector.With(rv, passComponent, uint64(k+1)); err == nil {
		return within
	}
	// rv is s.version's encoding, which always decodes: the same
	// version, the slow way.
	s.version[passComponent] = uint64(k + 1)
	defer delete(s.version, passComponent)
	return s.version.String()
}

// publishLocked appends a batch to the history and sends it to every
// watcher, each object encoded once for all of them.
func (s *Store) publishLocked(ctx context.Context, b batch) {
	state, _ := stateOf(s.version) // commitLocked named it
	step := &historyStep{moved: s.historyEnd.catchUp(s.version), unplaced: s.unplaced, coalesced: s.coalesced, state: state}
	s.unplaced, s.coalesced = nil, nil
	for i := range b.changes {
		b.changes[i].step = step
	}
	klog.FromContext(ctx).V(4).Info("Recomputed", "changes", len(b.changes), "resourceVersion", s.version.String())
	if len(s.watchers) > 0 {
		for i, o := range b.live {
			b.live[i] = newEncodedOnce(o)
		}
		for w := range s.watchers {
			w.send(b)
		}
	}
	s.appendHistoryLocked(b.changes)
}
