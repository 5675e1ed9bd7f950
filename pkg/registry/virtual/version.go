package virtual

import (
	"strings"

	"github.com/mci-dev/mci/pkg/versionvector"
)

// Version is a resourceVersion made of the resourceVersions of the member
// clusters the computed objects were derived from: one component per
// member. Unlike a per-process counter it means the same on every replica
// of the server, so a client may resume a watch on another replica.
// Components only grow. A component that is absent counts as zero.
type Version map[string]uint64

// reachabilityComponent orders, on the replica that issued a version, the
// changes no member resourceVersion orders: member joins, departures and
// reachability changes, replaced caches, deletions seen only through a
// relist. Its value is a Unix time in milliseconds of that replica's clock,
// so it is compared only with the versions of the same Store: another
// replica stamps the same change at another moment by another clock.
const reachabilityComponent = "~membership"

// epochComponent names the Store that issued a version (its start time in
// Unix milliseconds). It orders nothing: Covers ignores it. It tells a
// Store whether a version is its own, whose whole history it has, or one
// from another replica or an earlier run of the server.
const epochComponent = "~epoch"

// viewComponent is a digest of the membership view the objects at a
// version were computed with: which members, in which mode, reachable or
// not (viewOf). It orders nothing; unlike the other components it is
// replaced, not raised. Two replicas with the same members and the same
// view compute the same objects, so it is what a Store compares to know
// whether a version another replica issued saw the membership it sees.
const viewComponent = "~view"

// passComponent places a version among the changes of one recomputation,
// which share its other components: a version with passComponent k has
// the first k of them (a change's own version, for all of the
// recomputation's changes but its last, whose version is the
// recomputation's). A watch cut off within a recomputation resumes with
// the rest of it (firstUncovered), as a watch of the Kubernetes API
// resumes after the last event it got, each event having a version of its
// own. Only a Store's own versions are placed by it: a version of another
// replica or run places the client roughly and replays from earlier
// anyway (resumeFromLocked).
const passComponent = "~pass"

// isMemberComponent reports whether k is a member's resourceVersion rather
// than a reserved component: the only components that mean the same on
// every replica.
func isMemberComponent(k string) bool { return !strings.HasPrefix(k, "~") }

// Covers reports whether v has seen everything o has: every component of o
// is at most the same component of v. The epoch, the view and the place
// within a recomputation are not compared.
func (v Version) Covers(o Version) bool {
	for k, n := range o {
		if k == epochComponent || k == passComponent || unordered(k) {
			continue
		}
		if v[k] < n {
			return false
		}
	}
	return true
}

// coversMembers is Covers of the member components only, for a version
// another Store issued: the reserved components are that Store's own.
func (v Version) coversMembers(o Version) bool {
	for k, n := range o {
		if isMemberComponent(k) && v[k] < n {
			return false
		}
	}
	return true
}

// advance raises component k to n if n is larger (sets an unordered one
// if it differs), and reports whether it did.
func (v Version) advance(k string, n uint64) bool {
	if n > v[k] || (unordered(k) && n != v[k]) {
		v[k] = n
		return true
	}
	return false
}

// versionStep is the components of a version that moved from the one
// before, with their new values: a Version as a difference.
type versionStep []versionComponent

type versionComponent struct {
	name  string
	value uint64
}

// catchUp raises v to to and returns the step that did it: the components
// of to above v.
func (v Version) catchUp(to Version) versionStep {
	var step versionStep
	for k, n := range to {
		if v.advance(k, n) {
			step = append(step, versionComponent{name: k, value: n})
		}
	}
	return step
}

// apply advances v by step.
func (v Version) apply(step versionStep) {
	for _, c := range step {
		v.advance(c.name, c.value)
	}
}

func (v Version) clone() Version {
	out := make(Version, len(v))
	for k, n := range v {
		out[k] = n
	}
	return out
}

// String encodes v as an opaque resourceVersion.
func (v Version) String() string { return versionvector.Encode(v) }

// ParseVersion decodes a resourceVersion made by Version.String, in the
// current format or an older one.
func ParseVersion(s string) (Version, error) {
	v, err := versionvector.Decode(s)
	if err != nil {
		return nil, err
	}
	return Version(v), nil
}
