package clusterscore

import (
	"container/list"
	"net/http"
	"strings"
	"sync"
	"time"
)

// SessionSpec says where a request's session key is: a header, else a
// cookie. Both empty means no sessions.
type SessionSpec struct {
	Header string
	Cookie string
}

// maxSessionKey bounds a session key: longer values are cut, so that a
// client cannot make the table hold large keys.
const maxSessionKey = 256

// Key returns the session key of a request whose headers get returns (the
// first value of a header by name; "" when absent): the header's value,
// else the cookie's value, else "".
func (s SessionSpec) Key(get func(name string) string) string {
	key := ""
	if s.Header != "" {
		key = strings.TrimSpace(get(s.Header))
	}
	if key == "" && s.Cookie != "" {
		if cookies, err := http.ParseCookie(get("cookie")); err == nil {
			for _, c := range cookies {
				if c.Name == s.Cookie {
					key = c.Value
					break
				}
			}
		}
	}
	if len(key) > maxSessionKey {
		key = key[:maxSessionKey]
	}
	return key
}

// Sessions pins sessions to clusters: a bounded table, least recently
// pinned first out, each pin expiring TTL after it was last refreshed. The
// session scorer reads it; Memory.Served writes it with the cluster that
// served. It is safe for concurrent use.
type Sessions struct {
	ttl      time.Duration
	capacity int

	mu    sync.Mutex
	pins  map[scopedKey]*list.Element
	order *list.List // of *sessionPin, most recently pinned first
}

// scopedKey is a name (session, cluster) within a scope.
type scopedKey struct{ scope, name string }

type sessionPin struct {
	key     scopedKey
	cluster string
	expires time.Time
}

// NewSessions returns a table of at most capacity sessions (at least 1).
func NewSessions(capacity int, ttl time.Duration) *Sessions {
	return &Sessions{ttl: ttl, capacity: max(capacity, 1), pins: map[scopedKey]*list.Element{}, order: list.New()}
}

// Pin pins a session of scope to cluster until now plus the TTL.
func (s *Sessions) Pin(scope, session, cluster string, now time.Time) {
	if session == "" {
		return
	}
	k := scopedKey{scope, session}
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.pins[k]; ok {
		p := el.Value.(*sessionPin)
		p.cluster, p.expires = cluster, now.Add(s.ttl)
		s.order.MoveToFront(el)
		return
	}
	for s.order.Len() >= s.capacity {
		oldest := s.order.Back()
		delete(s.pins, oldest.Value.(*sessionPin).key)
		s.order.Remove(oldest)
	}
	s.pins[k] = s.order.PushFront(&sessionPin{key: k, cluster: cluster, expires: now.Add(s.ttl)})
}

// Cluster returns the cluster a session of scope is pinned to; "" when
// none or expired.
func (s *Sessions) Cluster(scope, session string, now time.Time) string {
	if session == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.pins[scopedKey{scope, session}]
	if !ok {
		return ""
	}
	p := el.Value.(*sessionPin)
	if now.After(p.expires) {
		delete(s.pins, p.key)
		s.order.Remove(el)
		return ""
	}
	return p.cluster
}

// Len is how many sessions are pinned (expired ones included until read
// or pushed out).
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}
