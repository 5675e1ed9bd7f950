package clusterscore

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Observer keeps what this sidecar itself measures of each cluster:
// requests in flight, time to the first response byte and errors. Metrics
// a remote cluster reports about itself cross a trust boundary; these do
// not. The sidecar calls Started when it sends a request to a cluster,
// FirstByte when the first byte of the response comes back, and Finished
// when the exchange ends, exactly once per Started. It is safe for
// concurrent use.
type Observer struct {
	// alpha is the EWMA weight of a new sample.
	alpha float64

	mu sync.RWMutex
	// clusters holds each scope's clusters by name: a pick over many
	// candidates finds its scope once and then hashes one name a
	// candidate, and none at all for a scope nothing was sent to yet.
	clusters map[string]map[string]*observed
}

// sentKept is how many send times a cluster keeps: enough for the
// requests of one cluster awaiting their first byte at once, and past it
// the oldest kept still shows a long wait.
const sentKept = 16

// observed is one cluster of one scope. Its fields are guarded by mu, but
// for snap.
type observed struct {
	// snap is the observation of the fields as the last change left
	// them, made by the writer (publish): a pick reads every candidate's,
	// and over a thousand candidates taking each one's lock to copy its
	// fields was a fifth of the pick; a request changes them three times.
	snap     atomic.Pointer[Observation]
	mu       sync.Mutex
	inFlight int64
	// answered counts the requests in flight that have had their first
	// byte (FirstByte): inFlight - answered are still waiting for it.
	answered int64
	// sent holds the send times (Unix nanoseconds) of the latest requests
	// started, a ring whose next slot is sent[next%sentKept].
	sent [sentKept]int64
	next int
	// ttfb is the EWMA of time to first byte in seconds; 0 before the
	// first sample. ttfbDev is the EWMA of the samples' distance from it,
	// their spread (as TCP's retransmission timer keeps a round trip's).
	ttfb, ttfbDev float64
	// least holds the least first byte, in seconds, of the samples of
	// the current window of floorWindow (least[0], sampled of them so
	// far) and of the window before (least[1]); 0 before any. floor is
	// the settled floor (sampleFloor); 0 until a window is complete.
	least   [2]float64
	sampled int
	floor   float64
	// errors is the EWMA of failures (1) and successes (0).
	errors float64
}

// floorWindow is how many first bytes a window of the floor holds: the
// floor is the least of the latest 64 to 128, so that a cluster that
// moves further away (or nearer) shows it within as many requests, and
// one slow or fast answer does not.
const floorWindow = 64

// floorSettle is the least move of the floor that a window's end takes:
// 5 ms or a fifth of the floor, whichever is more. Between windows the
// least first byte of a steady link moves by a few milliseconds of
// prefill and scheduling; the distance classes read from the floor
// (keptIDs) deal a pool's keys anew when one changes, so a floor near a
// class's edge must not cross it back and forth.
const floorSettle = 5 * time.Millisecond

// Observation is a snapshot of one cluster's observations.
type Observation struct {
	InFlight int64
	// Awaiting is how many of those have not had their first byte yet:
	// waiting for a batch place, or in their prefill.
	Awaiting int64
	// AwaitingSince is when the earliest sent of the requests awaiting
	// their first byte was sent, were the answered ones the first sent:
	// some request has awaited its first byte at least since then (zero
	// when none awaits). Answers are not matched to their requests, so
	// the wait is never overstated, only understated when a later request
	// was answered first.
	AwaitingSince time.Time
	// TTFB is the moving average of time to first byte; 0 when none was
	// measured yet. TTFBSpread is the moving average of the samples'
	// distance from it.
	TTFB, TTFBSpread time.Duration
	// TTFBFloor is the least time to first byte of the latest 64 to 128
	// requests, settled (it moves by 5 ms or a fifth at least): the round
	// trip to the cluster and its fastest answer, without the waits that
	// load adds; 0 until 64 were measured.
	TTFBFloor time.Duration
	// ErrorRatio is the moving average share of failed exchanges.
	ErrorRatio float64
}

// DefaultEWMAAlpha weighs a new sample a tenth: about the last 20
// exchanges count.
const DefaultEWMAAlpha = 0.1

// NewObserver returns an observer whose moving averages weigh a new
// sample alpha (0 < alpha <= 1; DefaultEWMAAlpha otherwise).
func NewObserver(alpha float64) *Observer {
	if !(alpha > 0 && alpha <= 1) {
		alpha = DefaultEWMAAlpha
	}
	return &Observer{alpha: alpha, clusters: map[string]map[string]*observed{}}
}

func (o *Observer) get(scope, cluster string) *observed {
	o.mu.RLock()
	c := o.clusters[scope][cluster]
	o.mu.RUnlock()
	if c != nil {
		return c
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	byName := o.clusters[scope]
	if byName == nil {
		byName = map[string]*observed{}
		o.clusters[scope] = byName
	}
	if c = byName[cluster]; c == nil {
		c = &observed{}
		byName[cluster] = c
	}
	return c
}

// Started counts a request sent to a cluster of scope at at.
func (o *Observer) Started(scope, cluster string, at time.Time) {
	c := o.get(scope, cluster)
	c.mu.Lock()
	c.inFlight++
	c.sent[c.next%sentKept] = at.UnixNano()
	c.next = (c.next + 1) % sentKept
	c.publish()
	c.mu.Unlock()
}

// FirstByte records the time from sending a request to the first byte of
// its response.
func (o *Observer) FirstByte(scope, cluster string, d time.Duration) {
	c := o.get(scope, cluster)
	c.mu.Lock()
	c.answered = min(c.answered+1, c.inFlight)
	if s := d.Seconds(); c.ttfb == 0 {
		c.ttfb, c.ttfbDev = max(s, 1e-9), s/2
	} else {
		c.ttfbDev += o.alpha * (math.Abs(s-c.ttfb) - c.ttfbDev)
		c.ttfb += o.alpha * (s - c.ttfb)
	}
	c.sampleFloor(max(d.Seconds(), 1e-9))
	c.publish()
	c.mu.Unlock()
}

// sampleFloor counts a first byte of s seconds in the floor's window;
// a complete window settles the floor and starts the next. c.mu is held.
func (c *observed) sampleFloor(s float64) {
	if c.least[0] == 0 || s < c.least[0] {
		c.least[0] = s
	}
	if c.sampled++; c.sampled < floorWindow {
		return
	}
	least := c.least[0]
	if c.least[1] > 0 {
		least = min(least, c.least[1])
	}
	if c.floor == 0 || math.Abs(least-c.floor) > max(floorSettle.Seconds(), c.floor/5) {
		c.floor = least
	}
	c.least[1], c.least[0], c.sampled = c.least[0], 0, 0
}

// Finished ends a request Started before; failed says it failed (no
// answer, or an error status).
func (o *Observer) Finished(scope, cluster string, failed bool) {
	c := o.get(scope, cluster)
	sample := 0.0
	if failed {
		sample = 1
	}
	c.mu.Lock()
	c.inFlight = max(c.inFlight-1, 0)
	// Finished does not say whether the request had its first byte: one
	// that ends without (refused, failed) takes an answered one's count
	// too, which overstates Awaiting by one until the answered requests in
	// flight drain. Overstated, it only keeps a loaded home from keeping a
	// request (homeBound.noWait), as if it had no figures.
	c.answered = min(max(c.answered-1, 0), c.inFlight)
	c.errors += o.alpha * (sample - c.errors)
	c.publish()
	c.mu.Unlock()
}

// Observe returns the observations of a cluster of scope; zero when none.
func (o *Observer) Observe(scope, cluster string) Observation {
	o.mu.RLock()
	c := o.clusters[scope][cluster]
	o.mu.RUnlock()
	return c.observation()
}

// observeKept appends the observations of the kept candidates of scope
// to obs, reading the clusters' map under one lock rather than one a
// candidate.
func (o *Observer) observeKept(scope string, cands []Candidate, kept []int, obs []Observation) []Observation {
	o.mu.RLock()
	defer o.mu.RUnlock()
	byName := o.clusters[scope]
	if len(byName) == 0 {
		// Nothing sent in the scope yet: every observation is zero.
		return append(obs, make([]Observation, len(kept))...)
	}
	for _, i := range kept {
		obs = append(obs, byName[cands[i].Name].observation())
	}
	return obs
}

// observation is a snapshot of c; zero when c is nil or has not changed
// yet.
func (c *observed) observation() Observation {
	if c == nil {
		return Observation{}
	}
	if ob := c.snap.Load(); ob != nil {
		return *ob
	}
	return Observation{}
}

// publish makes the observation of c's fields the one readers get. c.mu
// is held.
func (c *observed) publish() {
	ob := Observation{InFlight: c.inFlight, Awaiting: c.inFlight - c.answered, TTFB: seconds(c.ttfb), TTFBSpread: seconds(c.ttfbDev), TTFBFloor: seconds(c.floor), ErrorRatio: c.errors}
	if ob.Awaiting > 0 {
		// The Awaiting-th latest send, or the oldest kept.
		k := int(min(ob.Awaiting, sentKept))
		if at := c.sent[(c.next-k+sentKept)%sentKept]; at != 0 {
			ob.AwaitingSince = time.Unix(0, at)
		}
	}
	c.snap.Store(&ob)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Retain forgets the clusters of scopes keep reports false, as the
// routing table drops pools and clusters; the map is otherwise bounded by
// the pools and clusters of the ClusterSet.
func (o *Observer) Retain(keep func(scope, cluster string) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for scope, byName := range o.clusters {
		for name := range byName {
			if !keep(scope, name) {
				delete(byName, name)
			}
		}
		if len(byName) == 0 {
			delete(o.clusters, scope)
		}
	}
}
