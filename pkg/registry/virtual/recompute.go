package virtual

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/imports"
)

// computed is one object as a recomputation found it.
type computed struct {
	key string
	obj Object // nil: not served
}

// recompute brings the served objects up to date with what changed since
// the last pass: it computes the dirty objects from a snapshot of the
// ClusterSet, outside the lock, then records what differs, moves the
// version, and sends the changes to the history and the watchers.
func (s *Store) recompute(ctx context.Context) {
	s.pendingMu.Lock()
	dirty, advanced := s.pending, s.pendingV
	s.pending, s.pendingV = Dirty{}, Version{}
	s.pendingMu.Unlock()

	results, replaceNamespace := s.compute(s.cluster.Snapshot(), dirty)

	now := metav1.NewTime(s.now().Truncate(time.Second))
	s.mu.Lock()
	defer s.mu.Unlock()
	moved := s.advanceLocked(advanced)
	rv := s.version.String()
	changes, present := s.applyLocked(results, rv, now)
	changes = append(changes, s.deleteUncomputedLocked(replaceNamespace, present, rv)...)
	if len(changes) == 0 {
		return
	}
	if !moved {
		s.versionChangesLocked(changes)
	}
	s.publishLocked(ctx, changes)
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
			results = append(results, computed{key: key(o.GetNamespace(), o.GetName()), obj: o})
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
			results = append(results, computed{key: k, obj: o})
		}
	}
	for _, k := range dirty.Keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		ns, name := splitKey(k)
		if replaceNamespace[ns] {
			continue
		}
		o, ok := s.resource.Compute(cs, ns, name)
		if !ok {
			results = append(results, computed{key: k})
			continue
		}
		results = append(results, computed{key: k, obj: o})
	}
	return results, replaceNamespace
}

// advanceLocked moves the version by the member resourceVersions seen since
// the last pass, and reports whether it moved.
func (s *Store) advanceLocked(advanced Version) (moved bool) {
	for k, n := range advanced {
		if s.version.advance(k, n) {
			moved = true
		}
	}
	if moved {
		close(s.advanced)
		s.advanced = make(chan struct{})
	}
	return moved
}

// applyLocked records the computed objects that differ from those served,
// at resourceVersion rv, and returns their changes and the keys computed.
func (s *Store) applyLocked(results []computed, rv string, now metav1.Time) (changes []change, present map[string]bool) {
	present = map[string]bool{}
	for _, r := range results {
		present[r.key] = true
		prev := s.objects[r.key]
		if r.obj == nil {
			if prev != nil {
				changes = append(changes, s.deleteLocked(r.key, prev, rv))
			}
			continue
		}
		s.resource.CarryTransitionTimes(prev, r.obj, now)
		if prev != nil {
			r.obj.SetResourceVersion(prev.GetResourceVersion())
			if equality.Semantic.DeepEqual(prev, r.obj) {
				continue
			}
		}
		r.obj.SetResourceVersion(rv)
		s.objects[r.key] = r.obj
		ns := r.obj.GetNamespace()
		if s.byNamespace[ns] == nil {
			s.byNamespace[ns] = map[string]Object{}
		}
		s.byNamespace[ns][r.obj.GetName()] = r.obj
		typ := watch.Modified
		if prev == nil {
			typ = watch.Added
		}
		changes = append(changes, change{typ: typ, obj: r.obj, prev: prev})
	}
	return changes, present
}

// deleteUncomputedLocked deletes the objects of a recomputed namespace
// that are no longer computed.
func (s *Store) deleteUncomputedLocked(replaceNamespace, present map[string]bool, rv string) []change {
	var changes []change
	for ns := range replaceNamespace {
		var candidates map[string]Object
		if ns == "" {
			candidates = s.objects
		} else {
			candidates = s.byNamespace[ns]
		}
		for k, prev := range candidates {
			if ns != "" {
				k = key(ns, k)
			}
			if !present[k] {
				changes = append(changes, s.deleteLocked(k, prev, rv))
			}
		}
	}
	return changes
}

// versionChangesLocked gives changes that no member resourceVersion moved
// (deletions seen only through a relist, say) a version no client holds
// yet: one that listed at the current version would otherwise skip them
// when it resumes.
func (s *Store) versionChangesLocked(changes []change) {
	s.version.advance(reachabilityComponent, max(uint64(s.now().UnixMilli()), s.version[reachabilityComponent]+1))
	close(s.advanced)
	s.advanced = make(chan struct{})
	rv := s.version.String()
	for i := range changes {
		changes[i].obj.SetResourceVersion(rv)
	}
}

// publishLocked appends changes to the history and sends them to every
// watcher, each object encoded once for all of them.
func (s *Store) publishLocked(ctx context.Context, changes []change) {
	step := s.historyEnd.catchUp(s.version)
	for i := range changes {
		changes[i].step = step
	}
	klog.FromContext(ctx).V(4).Info("Recomputed", "changes", len(changes), "resourceVersion", s.version.String())
	s.appendHistoryLocked(changes)
	if len(s.watchers) == 0 {
		return
	}
	live := make([]change, len(changes))
	for i, c := range changes {
		c.obj = newEncodedOnce(c.obj)
		live[i] = c
	}
	for w := range s.watchers {
		w.send(live)
	}
}
