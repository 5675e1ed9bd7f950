package virtual

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/compact"
	"github.com/mci-dev/mci/pkg/imports"
)

// Object is a computed object: a runtime.Object with object metadata.
type Object interface {
	runtime.Object
	metav1.Object
}

// Dirty is what a cluster event obliges the Store to recompute.
type Dirty struct {
	Keys       []string // namespace/name
	Namespaces []string
	All        bool
}

// empty says nothing is dirty.
func (d Dirty) empty() bool {
	return !d.All && len(d.Keys) == 0 && len(d.Namespaces) == 0
}

// Resource is how one computed resource is derived from the ClusterSet.
type Resource interface {
	// Compute returns the object namespace/name, false when none is served.
	// A pass calls it for several objects at once, on one snapshot.
	Compute(cs imports.ClusterSet, namespace, name string) (Object, bool)
	// ComputeNamespace returns every object of namespace ("" for all).
	ComputeNamespace(cs imports.ClusterSet, namespace string) []Object
	// Affected says what a cluster event may have changed.
	Affected(ev clusterset.Event) Dirty
	// CarryTransitionTimes keeps lastTransitionTime of conditions whose
	// status did not change from prev (nil for a new object) to next.
	CarryTransitionTimes(prev, next Object, now metav1.Time)
}

// Snapshotter gives the current view of the ClusterSet.
type Snapshotter interface {
	Snapshot() imports.ClusterSet
	// Ready is nil once every member has listed (or is flagged
	// unreachable): from then on, every change reaches the Store as an
	// event, including deletions.
	Ready() error
}

// baselineInterval is how often a Store that has not yet seen a complete
// ClusterSet checks again.
var baselineInterval = time.Second

// DefaultHistorySize is how many changes a watch can resume across unless
// SetHistorySize says otherwise (up to an eighth more are kept between two
// cuts). An older resourceVersion gets 410 Gone and the client relists.
const DefaultHistorySize = 20000

type change struct {
	typ  watch.EventType
	obj  *entry
	prev *entry // the previous state, for MODIFIED and DELETED
	// step is how the version moved from the previous change of the
	// history to this one, shared by the changes of one recomputation.
	// A whole Version per change cost more than the change's object.
	step *historyStep
	// inPass is the change's place among the changes of its
	// recomputation, from 0 (passComponent).
	inPass int
}

// historyStep is how the version moved at one recomputation, and the
// members whose changes it cannot place (see marks.go).
type historyStep struct {
	moved     versionStep
	unplaced  []unplacedMark
	coalesced map[string]span
	// state is the state after the recomputation (state.go).
	state compact.Digest
}

// batch is the changes of one recomputation as they go to the watchers:
// live[i] is changes[i]'s object as computed, encoded once for all of them
// (nil for changes read back from the history).
type batch struct {
	changes []change
	live    []Object
}

// liveChange is a change a recomputation found, before the Store keeps it
// (commitLocked).
type liveChange struct {
	typ  watch.EventType
	obj  Object
	prev *entry
	// digest is obj's as computed (digestOf); none for a deletion.
	digest compact.Digest
}

// Store holds the current objects of one resource and their recent changes.
type Store struct {
	resource Resource
	cluster  Snapshotter
	newFunc  func() Object
	now      func() time.Time
	// kind names the objects in the Store's metrics.
	kind string

	pendingMu sync.Mutex
	pending   Dirty
	pendingV  Version
	// pendingEvents summarizes each member's events since the last pass,
	// for resume.go.
	pendingEvents map[string]memberEvents
	// observed are the member components as the members' changes alone
	// placed them, without the versions their lists and bookmarks raised
	// them to (clusterset.KindListed): what the baseline takes.
	observed Version
	signal   chan struct{}

	mu sync.RWMutex
	// codec encodes the objects the Store keeps (entry).
	codec   *compact.Codec
	objects map[objectKey]*entry
	// digests are the objects' digests as computed (state.go).
	digests map[objectKey]compact.Digest
	version Version
	// history holds the changes after historyStart, oldest first; the
	// version of each is historyStart advanced by the steps up to it, and
	// historyEnd is the version of the last.
	history      []change
	historyStart Version
	// historyStartState is the state at historyStart.
	historyStartState compact.Digest
	// historySize is how many changes of the history a cut keeps.
	historySize int
	historyEnd  Version
	watchers    map[*watcher]struct{}
	// advanced is closed (and replaced) whenever version moves, waking
	// requests that wait for a version this Store has not reached yet.
	advanced chan struct{}
	started  bool
	// stopped: Run has ended; no new watch would ever see an event.
	stopped bool
	// epoch identifies this Store's versions (epochComponent).
	epoch uint64
	// baseline is the version at which the ClusterSet was first complete
	// (nil before). A version issued elsewhere can only be resumed from if
	// it covers the baseline: before it, this Store's state came from
	// members still listing, and a member's first list reports what exists,
	// never what was deleted.
	baseline Version
	// unplaced are the marks (resume.go) made since the last change, and
	// coalesced the spans of passes since then that folded several events
	// of a member; the next change's step takes them.
	unplaced  []unplacedMark
	coalesced map[string]span
	// unplacedBefore are the marks of changes cut from the history that no
	// later move of their member resolved yet: member -> the member's
	// component at the mark, which is historyStart's.
	unplacedBefore map[string]uint64
}

// NewStore returns a Store for resource; Run keeps it up to date.
func NewStore(resource Resource, cluster Snapshotter, newFunc func() Object) *Store {
	epoch := uint64(time.Now().UnixMilli())
	kind := kindOf(newFunc)
	return &Store{
		epoch:          epoch,
		historySize:    DefaultHistorySize,
		resource:       resource,
		cluster:        cluster,
		newFunc:        newFunc,
		kind:           kind,
		now:            time.Now,
		pendingV:       Version{},
		pendingEvents:  map[string]memberEvents{},
		observed:       Version{},
		unplacedBefore: map[string]uint64{},
		signal:         make(chan struct{}, 1),
		codec:          codecFor(kind),
		objects:        map[objectKey]*entry{},
		digests:        map[objectKey]compact.Digest{},
		version:        Version{epochComponent: epoch},
		historyStart:   Version{},
		// Empty, as the Store starts.
		historyStartState: stateOfDigests(nil),
		historyEnd:        Version{},
		watchers:          map[*watcher]struct{}{},
		advanced:          make(chan struct{}),
	}
}

// Notify records a cluster event. It never blocks: events are coalesced
// until the Store's loop recomputes what they touched.
func (s *Store) Notify(ev clusterset.Event) {
	if ev.Kind == clusterset.KindListed {
		s.notifyListed(ev)
		return
	}
	d := s.resource.Affected(ev)
	s.pendingMu.Lock()
	if d.All {
		s.pending.All = true
	}
	if !s.pending.All {
		s.pending.Keys = append(s.pending.Keys, d.Keys...)
		s.pending.Namespaces = append(s.pending.Namespaces, d.Namespaces...)
	}
	if ev.ResourceVersion > 0 {
		s.pendingV.advance(ev.Member, ev.ResourceVersion)
		s.observed.advance(ev.Member, ev.ResourceVersion)
	}
	if ev.Kind == clusterset.KindMember {
		s.pendingV.advance(reachabilityComponent, uint64(s.now().UnixMilli()))
	}
	s.pendingEvents[ev.Member] = s.pendingEvents[ev.Member].add(ev)
	s.pendingMu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// notifyListed raises a member's component to a version its caches are
// known to hold everything up to (a list's or a bookmark's). Nothing is
// recomputed: every object up to it has come as an event already. Without
// it a member's component would stay at the newest object it holds, below
// a deletion made before a list, or a move of the member's version that
// changed nothing here, that another replica's versions include, and a
// watch resumed here from such a version would wait for the member's next
// change. The baseline does not take it (takeBaseline): a list's version
// also moves with changes that no object here reflects, and a replica
// running since before them, whose versions never moved past them, must
// still be resumed from.
func (s *Store) notifyListed(ev clusterset.Event) {
	if ev.ResourceVersion == 0 {
		return
	}
	s.pendingMu.Lock()
	s.pendingV.advance(ev.Member, ev.ResourceVersion)
	s.pendingMu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// Run recomputes what changed until ctx ends. The first pass computes
// everything.
func (s *Store) Run(ctx context.Context) {
	s.pendingMu.Lock()
	s.pending.All = true
	s.pendingMu.Unlock()
	s.recompute(ctx)
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	s.takeBaseline()
	tick := time.NewTicker(baselineInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			s.takeBaseline()
		case <-ctx.Done():
			// Ending every watch lets clients resume on another replica from
			// their last resourceVersion while this one shuts down.
			s.mu.Lock()
			s.stopped = true
			for w := range s.watchers {
				w.stopLocked()
			}
			s.mu.Unlock()
			return
		case <-s.signal:
			if took := s.recompute(ctx); took > 0 {
				s.rest(ctx, took)
			}
		}
	}
}

// maxRest bounds how long a Store rests after a pass (rest).
const maxRest = time.Second

// rest waits as long as a pass that computed objects took (at most
// maxRest), gathering the events that arrive meanwhile for the next
// pass. A Store so spends at most half its time computing, and under
// churn it sends a changed object at most once a rest: each event costs
// every watcher a decode of the whole object, which for an import of a
// pool that a thousand clusters export is half a megabyte, and watchers
// that cannot keep up fall behind by seconds. A pass of a small
// ClusterSet takes a millisecond or less, and its rest is as short.
func (s *Store) rest(ctx context.Context, took time.Duration) {
	t := time.NewTimer(min(took, maxRest))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// takeBaseline records the version at which the ClusterSet first became
// complete; see Store.baseline.
func (s *Store) takeBaseline() {
	s.mu.RLock()
	done := s.baseline != nil
	s.mu.RUnlock()
	if done || s.cluster.Ready() != nil {
		return
	}
	s.pendingMu.Lock()
	observed := s.observed.clone()
	s.pendingMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.baseline == nil {
		s.baseline = s.version.clone()
		for k, n := range s.baseline {
			if isMemberComponent(k) {
				s.baseline[k] = min(n, observed[k])
			}
		}
	}
}

// SetHistorySize sets how many changes a watch can resume across; an
// eighth more are kept between two cuts (cutting at every change would copy
// the whole history, about a megabyte at the default size, at every change
// once it is full). Call it before Run; n below 1 keeps the default.
func (s *Store) SetHistorySize(n int) {
	if n >= 1 {
		s.historySize = n
	}
}

func (s *Store) appendHistoryLocked(changes []change) {
	s.history = append(s.history, changes...)
	if over := len(s.history) - s.historySize; over > s.historySize/8 {
		// Whole recomputations: a version within one is placed by its
		// changes (firstUncovered).
		for over < len(s.history) && s.history[over].step == s.history[over-1].step {
			over++
		}
		for _, c := range s.history[:over] {
			s.cutLocked(c.step)
		}
		s.history = append(s.history[:0:0], s.history[over:]...)
	}
}

// firstUncovered is the index of the first change of the history that v
// does not cover (len(history) when v covers them all). Versions only
// grow, so the changes v covers are a prefix of the history. v must cover
// historyStart; ok is false when v is within a recomputation that the
// history no longer has (the changes after v's are cut). The store's lock
// is held.
func (s *Store) firstUncovered(v Version) (first int, ok bool) {
	version := s.historyStart.clone()
	first = len(s.history)
	for i, c := range s.history {
		version.apply(c.step.moved)
		if !v.Covers(version) {
			first = i
			break
		}
	}
	k, within := v[passComponent]
	if !within {
		return first, true
	}
	if first == 0 {
		// The history starts after v's recomputation: the history is
		// cut between recomputations (appendHistoryLocked).
		return 0, false
	}
	// v covers its recomputation's step but only the first k of its
	// changes: the rest of them are uncovered too.
	step := s.history[first-1].step
	for first > 0 && s.history[first-1].step == step && uint64(s.history[first-1].inPass) >= k {
		first--
	}
	return first, true
}

// Ready reports whether the first computation has finished.
func (s *Store) Ready() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.started
}

// Get returns the object namespace/name.
func (s *Store) Get(namespace, name string) (Object, bool, error) {
	s.mu.RLock()
	e, ok := s.objects[objectKey{namespace, name}]
	s.mu.RUnlock()
	if !ok {
		return nil, false, nil
	}
	o, err := s.decode(e)
	return o, err == nil, err
}

func key(namespace, name string) string { return namespace + "/" + name }

func splitKey(k string) (string, string) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return "", k
}

// One adapts a typed computation's (object, ok) result to a Resource's: a
// typed nil must not become a non-nil Object.
func One[T Object](o T, ok bool) (Object, bool) {
	if !ok {
		return nil, false
	}
	return o, true
}

// All adapts a typed computation's objects to a Resource's.
func All[T Object](objs []T) []Object {
	out := make([]Object, len(objs))
	for i, o := range objs {
		out[i] = o
	}
	return out
}
