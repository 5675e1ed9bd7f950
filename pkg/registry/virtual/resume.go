package virtual

import (
	"encoding/binary"
	"hash/fnv"
	"maps"
	"slices"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/imports"
)

// A client whose replica stopped resumes its watch here with a version
// another Store issued. Of that version only two things mean the same on
// both replicas:
//
//   - the member components: a member's own resourceVersions, which both
//     replicas read from the same member, each in the member's order;
//   - the view (viewComponent): everything of the members but their data,
//     as a digest: which members, in which mode, reachable or not, and
//     what else flags or selects their exports (viewOf).
//
// The membership stamp (reachabilityComponent) is the other replica's
// clock, and what this Store learnt of a member's data out of that
// member's order has no place in the other replica's history: a member's
// caches were replaced by a new read (it joined, or was read again with
// other credentials or in another mode: member events marked Replaced),
// or a relist found what changed while a watch was down (events without
// a resourceVersion, which the member caches send for deletions seen
// through a relist). Such a pass leaves a mark: the member and its
// component then. A member event that leaves the data as it was
// (reachability, credentials, freeze, labels, drain) leaves none: it
// changes the view, and a version of another view is refused below, so
// that a watch resumed after a member's outage is not refused for the
// outage alone. A mark is settled by the
// member's next move, to p: the member's data at p includes whatever the
// relist or the replacement found, so a version whose component is at
// least p has seen it. A version below p may hold an object this Store
// never had (created and deleted while its watch of the member was down),
// which no replay would delete: the watch is refused with 410 Gone and the
// client relists. So is a version whose view this Store's history never
// held, or that has no view (issued by an older server). A view it held
// places the client too: its states hold up to the last change this Store
// computed with that view, and the replay starts there at the latest.

// unplacedMark is a change of member's data that no member resourceVersion
// places: value is the member's component when it was made.
type unplacedMark struct {
	member string
	value  uint64
}

// memberEvents summarizes a member's events of one pass.
type memberEvents struct {
	// unplaced: a member event that replaced the member's caches, or an
	// event of its data without a resourceVersion.
	unplaced bool
	n        int
	// newest is the largest resourceVersion of the events.
	newest uint64
}

func (e memberEvents) add(ev clusterset.Event) memberEvents {
	if ev.Kind == clusterset.KindMember {
		e.unplaced = e.unplaced || ev.Replaced
	} else {
		e.unplaced = e.unplaced || ev.ResourceVersion == 0
	}
	e.n++
	e.newest = max(e.newest, ev.ResourceVersion)
	return e
}

// span is the stretch of a member's resourceVersions, from (excluded) to
// to, that passes folded: a version of another replica strictly inside it
// may have shown states this Store never computed. It ends at the newest
// event folded, not where the pass moved the member's version: a list's or
// a bookmark's version that the pass took too (Notify, KindListed) covers
// no change past that event, so the states between the two are the one
// this Store computed. Ended there, the span does not refuse a version
// that the other replica issued for that event before its own bookmark
// came.
type span struct{ from, to uint64 }

// placeLocked looks at each member's events of a pass before the pass
// moves the version to advanced. It returns the members with an event out
// of the member's order (a member event that replaced its caches, or one
// without a resourceVersion), and records the span of each member whose several events
// the pass folds (merged with the spans since the last change).
func (s *Store) placeLocked(events map[string]memberEvents, advanced Version) []string {
	var names []string
	for m, e := range events {
		if e.unplaced {
			names = append(names, m)
		}
		if e.n < 2 || advanced[m] <= s.version[m] {
			continue
		}
		if s.coalesced == nil {
			s.coalesced = map[string]span{}
		}
		sp, ok := s.coalesced[m]
		if !ok {
			sp.from = s.version[m]
		}
		to := advanced[m]
		if !e.unplaced {
			to = min(to, e.newest)
		}
		sp.to = max(sp.to, to)
		s.coalesced[m] = sp
	}
	sort.Strings(names)
	return names
}

// markLocked records a mark for each of members at its component once the
// pass moved the version: a later move settles it. Before the baseline,
// the first lists of the members are what a foreign version is checked
// against (Watch), so marks start after it.
func (s *Store) markLocked(members []string) {
	if s.baseline == nil {
		return
	}
	for _, m := range members {
		s.unplaced = append(s.unplaced, unplacedMark{member: m, value: s.version[m]})
	}
}

// cutLocked moves the start of the history past a step. Its marks that no
// move at or before the new start settles stay in unplacedBefore: a
// version that resumes before they are settled is refused.
func (s *Store) cutLocked(step *historyStep) {
	s.historyStartState = step.state
	for _, m := range step.unplaced {
		s.unplacedBefore[m.member] = max(s.unplacedBefore[m.member], m.value)
	}
	for _, c := range step.moved {
		if !s.historyStart.advance(c.name, c.value) {
			continue
		}
		// Every version that is not too old covers historyStart, so a
		// mark a move before it settles is settled for them all.
		if at, ok := s.unplacedBefore[c.name]; ok && c.value > at {
			delete(s.unplacedBefore, c.name)
		}
	}
}

// foreignBacklogLocked is what a watch that resumes from since, a version
// another Store issued, is replayed, or 410 Gone when nothing proves that
// the replay leaves nothing out. The member components place it when they
// cover this Store's baseline (unplaced is nil) and its history's start
// (resumeFromLocked): only roughly, so the replay starts at changes the
// client may have seen, folded into current states (netChanges):
// duplicates the client absorbs rather than changes it misses. Otherwise,
// or when they cannot prove it, the state since names places it
// exactly, if this Store held that state (resumeByStateLocked).
func (s *Store) foreignBacklogLocked(since Version, rv string, unplaced error) ([]change, error) {
	err := unplaced
	if err == nil && !since.coversMembers(s.historyStart) {
		err = apierrors.NewResourceExpired("too old resource version: " + rv + " (the server keeps a limited history; relist)")
	}
	if err == nil {
		var from int
		if from, err = s.resumeFromLocked(since, rv); err == nil {
			return netChanges(s.history[from:]), nil
		}
	}
	if from, ok := s.resumeByStateLocked(since); ok {
		return slices.Clone(s.history[from:]), nil
	}
	return nil, err
}

// resumeFromLocked returns the index of the history from which a watch
// that resumes from since, a version another Store issued that covers
// historyStart, is replayed (folded, netChanges) so that the client misses
// nothing, or 410 Gone when that cannot be proven.
func (s *Store) resumeFromLocked(since Version, rv string) (int, error) {
	marks := make([]unplacedMark, 0, len(s.unplacedBefore))
	for m, v := range s.unplacedBefore {
		marks = append(marks, unplacedMark{member: m, value: v})
	}
	settled, crossed := true, crosses(since, s.coalesced)
	// settle keeps the marks of member that a move to p settles, and
	// checks since against them.
	settle := func(member string, p uint64) {
		marks = slices.DeleteFunc(marks, func(o unplacedMark) bool {
			if o.member != member || o.value >= p {
				return false
			}
			settled = settled && since[member] >= p
			return true
		})
	}
	n := len(s.history)
	k := n
	version := s.historyStart.clone()
	// held is where a replay must start at the latest for the client's
	// view: just after the last change computed with since's view (0 when
	// that is the history's start, -1 when this Store never had it).
	// Every view change recomputes every object, so that an object left
	// as it was from there on is the same under since's view as under
	// this Store's, and one that changed is replayed.
	held := -1
	if version[viewComponent] == since[viewComponent] {
		held = 0
	}
	var prev *historyStep
	for i, c := range s.history {
		if c.step != prev {
			prev = c.step
			marks = append(marks, c.step.unplaced...)
			crossed = crossed || crosses(since, c.step.coalesced)
			for _, mv := range c.step.moved {
				if version.advance(mv.name, mv.value) && isMemberComponent(mv.name) {
					settle(mv.name, mv.value)
				}
			}
		}
		if k == n && !since.coversMembers(version) {
			k = i
		}
		if version[viewComponent] == since[viewComponent] {
			held = i + 1
		}
	}
	if s.version[viewComponent] == since[viewComponent] {
		// A view that changed after the last change, with no object
		// changing, left every object as it was.
		held = n
	}
	// Moves since the last change settle the marks too; the current
	// component is at least the first of them.
	marks = append(marks, s.unplaced...)
	for m, p := range s.version {
		if isMemberComponent(m) {
			settle(m, p)
		}
	}
	if crossed {
		return 0, apierrors.NewResourceExpired("resource version " + rv + " was issued by another replica at a point this one computed past in one pass, whose intermediate states it never had; relist")
	}
	if !settled || len(marks) > 0 {
		return 0, apierrors.NewResourceExpired("resource version " + rv + " was issued by another replica before it had seen what this one learnt out of order (a member read anew, or a relist's deletions); relist")
	}
	if held < 0 {
		return 0, apierrors.NewResourceExpired("resource version " + rv + " was issued by another replica with a view of the members (which, in which mode, reachable or not, flagged or selected how) that this one's history does not hold, at " + s.version.String() + "; relist")
	}
	return min(k, held), nil
}

// crosses reports whether since falls strictly inside one of the spans.
func crosses(since Version, spans map[string]span) bool {
	for m, sp := range spans {
		if sp.from < since[m] && since[m] < sp.to {
			return true
		}
	}
	return false
}

// viewOf is the digest of the membership view of cs (viewComponent):
// everything of each member that its member events change and that
// decides what is computed from its data: its name, mode and
// reachability, the reason it is flagged for, whether its data is served
// at all (past the removal threshold it is not), its drain and its
// labels (export scopes select by them). Two replicas with the same
// member components and the same view compute the same objects, but for
// times and messages, which each stamps its own. Never zero, the value
// of a version without a view.
func viewOf(cs imports.ClusterSet) uint64 {
	// It is taken at every recomputation, of every member: the members
	// come sorted (Snapshot), and are copied to sort only when not.
	members := cs.Members
	byName := func(a, b imports.Member) int { return strings.Compare(a.Name, b.Name) }
	if !slices.IsSortedFunc(members, byName) {
		members = slices.Clone(members)
		slices.SortFunc(members, byName)
	}
	h := fnv.New64a()
	var buf []byte
	for _, m := range members {
		buf = appendMemberView(buf[:0], m)
		_, _ = h.Write(buf)
	}
	if v := h.Sum64(); v != 0 {
		return v
	}
	return 1
}

// The state bits of a member's view. The first two were the whole view
// once: a member in none of the others digests as it did then, so that
// replicas of both releases agree on it.
const (
	viewUnreachable byte = 1 << iota
	viewSummaries
	viewCredentialsRejected
	viewDataWithheld
	viewDraining
	viewLabelled
)

func appendMemberView(buf []byte, m imports.Member) []byte {
	var state byte
	if m.Unreachable != nil {
		state |= viewUnreachable
		if m.Unreachable.CredentialsRejected {
			state |= viewCredentialsRejected
		}
	}
	if m.Summaries != nil {
		state |= viewSummaries
	}
	if m.Summaries == nil && m.Pools == nil {
		// Neither mode's data: a member past its removal threshold.
		state |= viewDataWithheld
	}
	if m.Draining {
		state |= viewDraining
	}
	if len(m.Labels) > 0 {
		state |= viewLabelled
	}
	buf = append(append(buf, m.Name...), 0, state)
	if len(m.Labels) == 0 {
		return buf
	}
	// Lengths first, so that no two label sets (nor a label and the next
	// member) encode alike.
	buf = binary.AppendUvarint(buf, uint64(len(m.Labels)))
	for _, k := range slices.Sorted(maps.Keys(m.Labels)) {
		buf = binary.AppendUvarint(buf, uint64(len(k)))
		buf = append(buf, k...)
		buf = binary.AppendUvarint(buf, uint64(len(m.Labels[k])))
		buf = append(buf, m.Labels[k]...)
	}
	return buf
}
