package clusterset

import (
	"fmt"
	"math"
	"strconv"
)

// A member's resourceVersions become the member's component of the
// versions this server issues (registry/virtual), which only ever moves
// forward: an event whose version is at or below it counts as one a
// client that saw that version has seen. A version this server cannot
// order would therefore either be lost (read as unknown) or, if far
// ahead, pin the member's component so that every later change of the
// member looks already seen to a watch resumed on another replica.
// kube-apiserver's resourceVersions are etcd revisions, decimal int64s
// above zero, and an mci-apiserver's member component is one of them; a
// member that sends anything else (not a number, zero, past the int64
// range) is not a kube-apiserver behaving as one, and it is frozen at
// the resourceVersion limit: nothing more it sends is applied, its last
// known data is served flagged, and it is read afresh (a full relist)
// after --member-freeze-retry, as at any other limit.
//
// A version that goes backwards within the range is not refused: events
// of a member's several watches reach this server in no set order, and a
// relist replays objects by name, not by version, so a lower version is
// not by itself a fault. It moves nothing backwards either: the
// member's component keeps its highest version (Version.advance).
func memberResourceVersion(rv string) (uint64, error) {
	n, err := strconv.ParseUint(rv, 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("it sent resourceVersion %.64q, not a decimal number", rv)
	case n == 0 || n > math.MaxInt64:
		return 0, fmt.Errorf("it sent resourceVersion %d, outside the 1 to %d of a kube-apiserver's", n, int64(math.MaxInt64))
	}
	return n, nil
}

// resourceVersion reads the resourceVersion of a change the member sent,
// and freezes the member at one it cannot order; it reports whether the
// change may be passed on. The local cluster is trusted and never
// frozen: a version of it that does not parse is read as unknown (0).
func (m *member) resourceVersion(rv string) (uint64, bool) {
	n, err := memberResourceVersion(rv)
	if err == nil {
		return n, true
	}
	if m.quota == nil {
		n, _ = strconv.ParseUint(rv, 10, 64)
		return n, true
	}
	m.freeze(quotaResourceVersion, err.Error())
	return 0, false
}
