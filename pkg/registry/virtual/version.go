package virtual

import (
	"encoding/base64"
	"fmt"
	"sort"
	"strconv"
	"strings"
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

func (v Version) clone() Version {
	out := make(Version, len(v))
	for k, n := range v {
		out[k] = n
	}
	return out
}

// versionFormat prefixes every encoded Version, so that even the empty
// Version has a non-empty resourceVersion and the format can evolve.
const versionFormat = "v1;"

// String encodes v as an opaque resourceVersion.
func (v Version) String() string {
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(versionFormat)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.FormatUint(v[k], 10))
	}
	return base64.RawURLEncoding.EncodeToString([]byte(b.String()))
}

// ParseVersion decodes a resourceVersion made by Version.String.
func ParseVersion(s string) (Version, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("resourceVersion %q was not issued by this server", s)
	}
	body, ok := strings.CutPrefix(string(raw), versionFormat)
	if !ok {
		return nil, fmt.Errorf("resourceVersion %q was not issued by this server", s)
	}
	v := Version{}
	if body == "" {
		return v, nil
	}
	for _, part := range strings.Split(body, ",") {
		k, n, ok := strings.Cut(part, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("resourceVersion %q was not issued by this server", s)
		}
		num, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("resourceVersion %q was not issued by this server", s)
		}
		v[k] = num
	}
	return v, nil
}
