package virtual

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"slices"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/compact"
)

// A version also names the state of the objects at it: a digest of every
// object served then, as computed (its resourceVersion empty, and the
// condition times the computation leaves for CarryTransitionTimes unset:
// those are each replica's own). Two Stores that hold states of the same
// digest serve the same objects, whatever their histories and clocks. So a
// version that the member components cannot place (another run's, issued
// before this Store's baseline: after a restart the member's own
// resourceVersion has moved with writes that change nothing served, such
// as leases) is placed by its state when this Store held that state: the
// client holds the objects this Store held there, and the changes after it
// bring it to the current ones, exactly. The digest is cryptographic
// (compact.Digest), since what the objects hold is other clusters' to
// write, and ordered by key, so that a member cannot make two states
// collide by choosing what it exports.
const (
	stateHighComponent = "~state"
	stateLowComponent  = "~statelo"
)

// unordered reports whether component k is replaced rather than raised:
// the view and the state name what was computed, they do not count it.
func unordered(k string) bool {
	return k == viewComponent || k == stateHighComponent || k == stateLowComponent
}

// digestOf is the digest of a computed object: o as computed, with no
// resourceVersion. It fails only when o does not encode, which a Store
// would not be able to keep either.
func (s *Store) digestOf(o Object) (compact.Digest, error) {
	o.SetResourceVersion("")
	return s.codec.Digest(o)
}

// stateOfDigests is the digest of the objects' digests, in key order,
// each key's parts with their lengths so that no two sets of keys read
// alike.
func stateOfDigests(digests map[objectKey]compact.Digest) compact.Digest {
	keys := make([]objectKey, 0, len(digests))
	for k := range digests {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b objectKey) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	h := sha256.New()
	var buf []byte
	for _, k := range keys {
		d := digests[k]
		buf = binary.AppendUvarint(buf[:0], uint64(len(k.namespace)))
		buf = append(buf, k.namespace...)
		buf = binary.AppendUvarint(buf, uint64(len(k.name)))
		buf = append(buf, k.name...)
		buf = append(buf, d[:]...)
		h.Write(buf)
	}
	var out compact.Digest
	copy(out[:], h.Sum(nil))
	return out
}

// setStateLocked records the objects' digests after changes and names
// the state they make in the version.
func (s *Store) setStateLocked(changes []liveChange) {
	for _, c := range changes {
		k := objectKey{c.obj.GetNamespace(), c.obj.GetName()}
		if c.typ == watch.Deleted {
			delete(s.digests, k)
		} else {
			s.digests[k] = c.digest
		}
	}
	st := stateOfDigests(s.digests)
	s.version[stateHighComponent] = binary.BigEndian.Uint64(st[:8])
	s.version[stateLowComponent] = binary.BigEndian.Uint64(st[8:])
}

// stateOf is the state v names; false when it names none (a version of
// an older server, or one within a recomputation: the state it carries
// is the recomputation's, of which it has only some changes).
func stateOf(v Version) (compact.Digest, bool) {
	high, ok := v[stateHighComponent]
	low, okLow := v[stateLowComponent]
	if _, within := v[passComponent]; within || !ok || !okLow {
		return compact.Digest{}, false
	}
	var d compact.Digest
	binary.BigEndian.PutUint64(d[:8], high)
	binary.BigEndian.PutUint64(d[8:], low)
	return d, true
}

// resumeByStateLocked returns the index of the history from which a
// client at since is replayed when this Store held the state since names:
// just after the latest recomputation that left it, or the history's
// start; false when it held no such state within its history.
func (s *Store) resumeByStateLocked(since Version) (int, bool) {
	st, ok := stateOf(since)
	if !ok {
		return 0, false
	}
	for i := len(s.history) - 1; i >= 0; i-- {
		c := s.history[i]
		endsStep := i == len(s.history)-1 || s.history[i+1].step != c.step
		if endsStep && c.step.state == st {
			return i + 1, true
		}
	}
	return 0, s.historyStartState == st
}
