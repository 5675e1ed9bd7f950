package clusterscore

import (
	"cmp"
	"container/list"
	"math"
	"slices"
	"sync"
	"time"
)

// Homes remembers the home keys (homeKey: a prompt's leading blocks) this
// sidecar has served, so that the keys that repeat, such as a system
// prompt shared by a group of conversations, are dealt to the clusters in
// equal shares of their capacity instead of by the luck of hashing (8
// groups hashed over 2 clusters put 6 or more on one in a third of the
// cases). A key is established from its second request on, or from its
// first when it was pinned: placed where an EPP reported its prefix held
// (HomeReported), where the assignment keeps it before dealing the rest.
//
// The established keys of a scope but the idle ones (below) are dealt in
// the order of their values, each to the first cluster of its rendezvous
// order that has not yet reached its share (the number of keys times its
// capacity's share, rounded down, plus one for as many clusters as the
// keys need; deal): consistent hashing with bounded loads, over keys
// rather than requests.
// The assignment is a function of the set of keys and of the candidates
// alone, so that replicas which have seen the same groups agree on it
// without talking; a key that joins or leaves moves few others. It is
// recomputed only when either changes.
//
// A key leaves the dealing while it is idle: not served for 3 minutes
// while its scope served at least 100 other requests (DefaultHomeIdle,
// homeIdleRequests). A group that stopped sending would otherwise hold
// its share of a cluster for the TTL, and the groups that do send would
// be dealt around it (in the routing benchmark, the 6 groups of a
// workload dealt among the 43 of the one before gave one cluster 0.43 to
// 0.56 of the requests and another 0.17 to 0.20). A pause of the whole
// scope idles nothing, so that groups coming back after it find the
// dealing they left. An idle key is remembered; its next request brings
// it back into the dealing.
//
// It is bounded (least recently served out) and forgets a key TTL after
// its last request. It is safe for concurrent use.
type Homes struct {
	ttl, idle time.Duration
	capacity  int

	mu     sync.Mutex
	keys   map[scopedHome]*list.Element
	order  *list.List // of *homeEntry, most recently served first
	scopes map[string]*homeScope
}

// homeScope is what Homes keeps of a scope beside its keys; it goes with
// the scope's last key (pools come and go).
type homeScope struct {
	// keys is how many keys of the scope are remembered.
	keys int
	// version counts the changes of the scope's dealt keys.
	version  uint64
	assigned *homeAssignment
	// requests counts the requests served in the scope (Served), to
	// tell a key whose scope went on without it from a pause of all.
	requests uint64
	// checked is when its keys' idleness was last looked at (idleKeys).
	checked time.Time
}

type scopedHome struct {
	scope string
	key   uint64
}

type homeEntry struct {
	k      scopedHome
	served int
	last   time.Time
	// pinned is the cluster the key is assigned to whatever the dealing
	// (its first request went where an EPP reported its prefix); 0: none.
	pinned uint32
	// at is its scope's count of requests when it was last served;
	// idle, that it is out of the dealing until its next request.
	at   uint64
	idle bool
}

// established reports whether the key has a home once served: from its
// second request, or its first when pinned.
func (e *homeEntry) established() bool { return e.served >= 2 || e.pinned != 0 }

// dealt reports whether the key takes part in the assignment.
func (e *homeEntry) dealt() bool { return e.established() && !e.idle }

// homeAssignment is the assignment of a scope's dealt keys to the
// candidates of one signature, at one version of the keys.
type homeAssignment struct {
	version, candidates uint64
	keys                []uint64
	home                map[uint64]uint32
	// second holds, by cluster, the assignment of the same keys to the
	// other candidates: where a key of that cluster goes when its home
	// cannot take it (Second). Made the first time it is asked for, as
	// most homes are never left.
	second map[uint32]map[uint64]uint32
}

// DefaultHomeKeys and DefaultHomeTTL size the home keys: 4,096 prompt
// prefixes, forgotten 10 minutes after their last request.
const (
	DefaultHomeKeys = 4096
	DefaultHomeTTL  = 10 * time.Minute
	// DefaultHomeIdle is how long a key goes unserved before it may be
	// idle (Homes); the TTL when that is shorter.
	DefaultHomeIdle = 3 * time.Minute
)

// homeIdleRequests is how many requests its scope serves after a key's
// last before the key may be idle: a group's silence, not the pool's.
const homeIdleRequests = 100

// NewHomes returns an empty table of at most capacity keys (default when
// not above 0), each kept ttl after its last request (default when not
// above 0).
func NewHomes(capacity int, ttl time.Duration) *Homes {
	if capacity <= 0 {
		capacity = DefaultHomeKeys
	}
	if ttl <= 0 {
		ttl = DefaultHomeTTL
	}
	return &Homes{
		ttl: ttl, idle: min(DefaultHomeIdle, ttl), capacity: capacity,
		keys: map[scopedHome]*list.Element{}, order: list.New(), scopes: map[string]*homeScope{},
	}
}

// Served counts a request of the key served in scope. pin, when not 0,
// pins a key new to the table to that cluster (homeEntry.pinned).
func (h *Homes) Served(scope string, key uint64, pin uint32, now time.Time) {
	if key == 0 {
		return
	}
	k := scopedHome{scope, key}
	h.mu.Lock()
	defer h.mu.Unlock()
	if el, ok := h.keys[k]; ok {
		e := el.Value.(*homeEntry)
		s := h.scopes[scope]
		s.requests++
		h.wake(s, e)
		if e.served++; e.served == 2 && e.pinned == 0 {
			s.version++
		}
		e.last, e.at = now, s.requests
		h.order.MoveToFront(el)
		return
	}
	for h.order.Len() >= h.capacity {
		h.remove(h.order.Back())
	}
	s := h.scopes[scope]
	if s == nil {
		s = &homeScope{checked: now}
		h.scopes[scope] = s
	}
	s.keys++
	s.requests++
	h.keys[k] = h.order.PushFront(&homeEntry{k: k, served: 1, last: now, pinned: pin, at: s.requests})
	if pin != 0 {
		s.version++
	}
}

// wake brings an idle key of s back into the dealing. h.mu is held.
func (h *Homes) wake(s *homeScope, e *homeEntry) {
	if e.idle {
		e.idle = false
		if e.established() {
			s.version++
		}
	}
}

func (h *Homes) remove(el *list.Element) {
	e := el.Value.(*homeEntry)
	s := h.scopes[e.k.scope]
	if e.dealt() {
		s.version++
	}
	delete(h.keys, e.k)
	h.order.Remove(el)
	if s.keys--; s.keys <= 0 {
		delete(h.scopes, e.k.scope)
	}
}

// idleKeys marks the keys of scope s that became idle, and those no
// longer idle, since it last looked: at most every quarter of the idle
// time, so that a key is out of the dealing at most that late. h.mu is
// held.
func (h *Homes) idleKeys(scope string, s *homeScope, now time.Time) {
	if now.Sub(s.checked) < h.idle/4 {
		return
	}
	s.checked = now
	for k, el := range h.keys {
		if k.scope != scope {
			continue
		}
		e := el.Value.(*homeEntry)
		idle := now.Sub(e.last) > h.idle && s.requests-e.at >= homeIdleRequests
		if idle != e.idle {
			e.idle = idle
			if e.established() {
				s.version++
			}
		}
	}
}

// Len is how many keys are remembered.
func (h *Homes) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.order.Len()
}

// Home returns the cluster id an established key of scope is assigned to
// among the candidates ids of capacities caps and distances far
// (parallel; far nil when all are as near), 0 when the key is not
// established; and how many of its requests were served.
func (h *Homes) Home(scope string, key uint64, ids []uint32, caps []float64, far []uint8, now time.Time) (uint32, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for el := h.order.Back(); el != nil && now.Sub(el.Value.(*homeEntry).last) > h.ttl; el = h.order.Back() {
		h.remove(el)
	}
	el, ok := h.keys[scopedHome{scope, key}]
	if !ok {
		return 0, 0
	}
	e := el.Value.(*homeEntry)
	s := h.scopes[scope]
	h.idleKeys(scope, s, now)
	// A key asked for is served now: it is not idle, whatever its last
	// request says until Served records this one.
	h.wake(s, e)
	if !e.established() {
		return 0, e.served
	}
	return h.assignment(scope, ids, caps, far).home[key], e.served
}

// Count returns how many requests of scope's key were served; 0 when the
// key is not remembered (or forgotten: its TTL passed).
func (h *Homes) Count(scope string, key uint64, now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	el, ok := h.keys[scopedHome{scope, key}]
	if !ok {
		return 0
	}
	if e := el.Value.(*homeEntry); now.Sub(e.last) <= h.ttl {
		return e.served
	}
	return 0
}

// Second returns the cluster id an established key of scope goes to when
// its home cannot take it: the keys of that home dealt over the other
// candidates as assign deals, each other candidate keeping its own keys,
// so that the groups of a home that is full or out spread over the others
// and leave them with equal shares of their capacity (within one), as
// every replica that saw the same keys deals them; 0 when the key is not
// established.
func (h *Homes) Second(scope string, key uint64, home uint32, ids []uint32, caps []float64, far []uint8) uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if el, ok := h.keys[scopedHome{scope, key}]; !ok || !el.Value.(*homeEntry).dealt() {
		return 0
	}
	a := h.assignment(scope, ids, caps, far)
	second, ok := a.second[home]
	if !ok {
		second = assignSecond(a.keys, a.home, home, ids, caps, far)
		if a.second == nil {
			a.second = map[uint32]map[uint64]uint32{}
		}
		a.second[home] = second
	}
	return second[key]
}

// assignment is the assignment of scope's dealt keys to the
// candidates ids of capacities caps and distances far, made again when
// either changed. h.mu is held.
func (h *Homes) assignment(scope string, ids []uint32, caps []float64, far []uint8) *homeAssignment {
	sig := signature(ids, caps, far)
	s := h.scopes[scope]
	a := s.assigned
	if a == nil || a.version != s.version || a.candidates != sig {
		keys, pins := h.dealtKeys(scope)
		a = &homeAssignment{version: s.version, candidates: sig, keys: keys, home: assign(keys, pins, ids, caps, far)}
		s.assigned = a
	}
	return a
}

// dealtKeys lists the keys of scope that take part in the dealing, in
// order, and the clusters of the pinned ones.
func (h *Homes) dealtKeys(scope string) (keys []uint64, pins map[uint64]uint32) {
	for k, el := range h.keys {
		e := el.Value.(*homeEntry)
		if k.scope != scope || !e.dealt() {
			continue
		}
		keys = append(keys, k.key)
		if e.pinned != 0 {
			if pins == nil {
				pins = map[uint64]uint32{}
			}
			pins[k.key] = e.pinned
		}
	}
	slices.Sort(keys)
	return keys, pins
}

// signature stands for the candidates' ids, capacities and distances,
// in their order. Each candidate's term, of its place, id and capacity
// (and of its place and distance class, when there are classes), is
// hashed on its own and the terms are summed: chained, each hash waited
// for the one before, which over a thousand candidates took a few
// microseconds of every pick; apart, the processor computes several at
// once.
func signature(ids []uint32, caps []float64, far []uint8) uint64 {
	s := mix64(uint64(len(ids)))
	for i, id := range ids {
		s += mix64(mix64(uint64(i)<<32|uint64(id)) ^ math.Float64bits(caps[i]))
	}
	for i, d := range far {
		s += mix64(uint64(i)<<8 | uint64(d) | 1<<63)
	}
	return s
}

// assign deals keys, in order, over the candidates ids of capacities
// caps and distances far (deal), after the pinned keys went to their
// clusters when those are candidates, counted in their shares.
func assign(keys []uint64, pins map[uint64]uint32, ids []uint32, caps []float64, far []uint8) map[uint64]uint32 {
	out := make(map[uint64]uint32, len(keys))
	count := make([]int, len(ids))
	rest := keys
	if len(pins) > 0 {
		index := make(map[uint32]int, len(ids))
		for i, id := range ids {
			index[id] = i
		}
		rest = make([]uint64, 0, len(keys))
		for _, k := range keys {
			if i, ok := index[pins[k]]; ok && pins[k] != 0 {
				out[k] = pins[k]
				count[i]++
				continue
			}
			rest = append(rest, k)
		}
	}
	deal(rest, len(keys), ids, caps, far, count, out)
	return out
}

// assignSecond deals the keys that home holds in homes over the other
// candidates (deal), each keeping the keys it holds already.
func assignSecond(keys []uint64, homes map[uint64]uint32, home uint32, ids []uint32, caps []float64, far []uint8) map[uint64]uint32 {
	var (
		ofHome    []uint64
		others    []uint32
		otherCaps []float64
		otherFar  []uint8
	)
	for i, id := range ids {
		if id != home {
			others, otherCaps = append(others, id), append(otherCaps, caps[i])
			if far != nil {
				otherFar = append(otherFar, far[i])
			}
		}
	}
	count := make([]int, len(others))
	for _, k := range keys {
		if homes[k] == home {
			ofHome = append(ofHome, k)
		} else if i := slices.Index(others, homes[k]); i >= 0 {
			count[i]++
		}
	}
	out := make(map[uint64]uint32, len(ofHome))
	deal(ofHome, len(keys), others, otherCaps, otherFar, count, out)
	return out
}

// deal deals keys, in order, each to the first candidate of its
// rendezvous order below its share of total keys, counting the keys each
// holds already (count): its capacity's share of total, rounded down, and
// one more for as many candidates as the keys need (extras). So equal
// candidates end within one key of each other: rounded up, 4 keys over 3
// clusters could be dealt 2, 2 and 0. The extras go to the nearest
// candidates first (far, the distance classes), and among equally near
// ones to those whose share lost most in the rounding down (a cluster
// offered 2.8 keys before one offered 1.4: Shares offers unequal shares),
// first come among those alike: a key dealt beyond an equal share is a
// group whose every turn pays its home's round trip, so 8 groups over 3
// clusters, one of them further away, leave it 2 and the near ones 3.
func deal(keys []uint64, total int, ids []uint32, caps []float64, far []uint8, count []int, out map[uint64]uint32) {
	if len(ids) == 0 {
		return
	}
	sum := 0.0
	for _, c := range caps {
		sum += c
	}
	base := make([]int, len(ids))
	lost := make([]float64, len(ids))
	room := 0
	for i, c := range caps {
		quota := float64(total) * c / sum
		base[i] = int(math.Floor(quota + 1e-9))
		lost[i] = quota - float64(base[i])
		room += max(base[i]-count[i], 0)
	}
	tier, extras := extrasInTiers(len(keys)-room, far, lost, count, base)
	for _, k := range keys {
		best, score := -1, math.Inf(-1)
		for i, id := range ids {
			open := count[i] < base[i] || (count[i] == base[i] && extras[tier[i]] > 0)
			if r := rendezvous(k, id, caps[i]); open && r > score {
				best, score = i, r
			}
		}
		if best < 0 {
			// Only when the keys held already exceed the shares: the first
			// of its rendezvous order.
			best = firstByRendezvous(k, ids, caps, -1)
		}
		if count[best] >= base[best] {
			extras[tier[best]]--
		}
		count[best]++
		out[k] = ids[best]
	}
}

// distance is candidate i's distance class; 0 when far is nil.
func distance(far []uint8, i int) uint8 {
	if far == nil {
		return 0
	}
	return far[i]
}

// extrasInTiers shares n extras among the candidates that may take one
// (not above their share: count, base), one a candidate, in tiers: by
// distance class, nearest first, and within a class by what their share
// lost in the rounding down (lost), most first; candidates alike in both
// are one tier. It returns each candidate's tier and each tier's extras:
// the first tiers take one for each of their candidates, the next the
// rest, to be taken first come.
func extrasInTiers(n int, far []uint8, lost []float64, count, base []int) (tier, extras []int) {
	order := make([]int, 0, len(count))
	for i := range count {
		if count[i] <= base[i] {
			order = append(order, i)
		}
	}
	// Losses a rounding error apart are alike.
	loss := func(i int) float64 { return math.Round(lost[i] * 1e6) }
	slices.SortStableFunc(order, func(a, b int) int {
		if c := cmp.Compare(distance(far, a), distance(far, b)); c != 0 {
			return c
		}
		return cmp.Compare(loss(b), loss(a))
	})
	tier = make([]int, len(count))
	for i := range tier {
		tier[i] = -1
	}
	extras = make([]int, len(order)+1) // the last for candidates in none
	t := -1
	for k, i := range order {
		if k == 0 || distance(far, i) != distance(far, order[k-1]) || loss(i) != loss(order[k-1]) {
			t++
		}
		tier[i] = t
		if n > 0 {
			extras[t]++
			n--
		}
	}
	for i := range tier {
		if tier[i] < 0 {
			tier[i] = len(extras) - 1
		}
	}
	return tier, extras
}
