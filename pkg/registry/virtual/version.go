package virtual

import (
	"github.com/mci-dev/mci/pkg/versionvector"
)

// Version is a resourceVersion made of the resourceVersions of the member
// clusters the computed objects were derived from: one component per
// member. Unlike a per-process counter it means the same on every replica
// of the server, so a client may resume a watch on another replica.
// Components only grow. A component that is absent counts as zero.
type Version map[string]uint64

// reachabilityComponent orders member joins, departures and reachability
// changes, which have no member resourceVersion: its value is a Unix time
// in milliseconds, comparable across replicas whose clocks agree.
const reachabilityComponent = "~membership"

// epochComponent names the Store that issued a version (its start time in
// Unix milliseconds). It orders nothing: Covers ignores it. It tells a
// Store whether a version is its own, whose whole history it has, or one
// from another replica or an earlier run of the server.
const epochComponent = "~epoch"

// Covers reports whether v has seen everything o has: every component of o
// is at most the same component of v. The epoch is not compared.
func (v Version) Covers(o Version) bool {
	for k, n := range o {
		if k == epochComponent {
			continue
		}
		if v[k] < n {
			return false
		}
	}
	return true
}

// coversMembers is Covers for a version another Store issued: its
// reachabilityComponent was stamped by another clock at other moments (each
// replica stamps the same join when it sees it), so only the member
// components are compared. What that cannot see: a member departure this
// Store processed before its baseline that the other had not seen when it
// issued the version (a window of a few probe intervals); that departure
// is not reported to the resuming client.
func (v Version) coversMembers(o Version) bool {
	for k, n := range o {
		if k != epochComponent && k != reachabilityComponent && v[k] < n {
			return false
		}
	}
	return true
}

// advance raises component k to n if n is larger, and reports whether it did.
func (v Version) advance(k string, n uint64) bool {
	if n > v[k] {
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
