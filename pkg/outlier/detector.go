package outlier

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Key names one cluster of one pool: the clusters of a pool are compared
// with each other, and share its MaxEjectionPercent.
type Key struct {
	// Pool is the pool's namespace/name.
	Pool string
	// Cluster is the cluster's name.
	Cluster string
}

// Result is what became of one request a cluster took.
type Result int8

const (
	// Success: a response below 500.
	Success Result = iota
	// Error5xx: a 5xx response that is not a gateway failure (500, 501,
	// 505...).
	Error5xx
	// GatewayFailure: 502, 503 or 504 (the gateway's own answers when it
	// cannot connect, is reset or times out), or no first byte within the
	// cluster's bound.
	GatewayFailure
)

// ResultOfStatus is the result of a response of HTTP status code.
func ResultOfStatus(code int) Result {
	switch {
	case code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout:
		return GatewayFailure
	case code >= 500:
		return Error5xx
	}
	return Success
}

// Reason is why a cluster was ejected: the reason label of
// mci_sidecar_outlier_ejections_total.
type Reason string

const (
	ReasonConsecutive5xx            Reason = "consecutive_5xx"
	ReasonConsecutiveGatewayFailure Reason = "consecutive_gateway_failure"
	ReasonSuccessRate               Reason = "success_rate"
	// ReasonFailedProbe: a cluster eligible again after an ejection
	// failed the first request it took.
	ReasonFailedProbe Reason = "failed_probe"
)

// Reasons lists every reason, for metrics that start at zero.
var Reasons = []Reason{ReasonConsecutive5xx, ReasonConsecutiveGatewayFailure, ReasonSuccessRate, ReasonFailedProbe}

// Config configures a Detector. A zero threshold disables its rule.
type Config struct {
	// Consecutive5xx ejects after this many failures in a row (5xx or
	// gateway failures).
	Consecutive5xx int
	// ConsecutiveGatewayFailure ejects after this many gateway failures in
	// a row; a 5xx that is not one breaks the row.
	ConsecutiveGatewayFailure int
	// SuccessRateInterval is the window of the success-rate rule; 0
	// disables it. SuccessRateMinimumRequests is the volume a cluster, and
	// the others taken together, need in it; SuccessRateFactor ejects a
	// cluster whose success rate is below this share of the others'.
	SuccessRateInterval        time.Duration
	SuccessRateMinimumRequests int
	SuccessRateFactor          float64
	// BaseEjectionTime is the first ejection's length; each ejection in a
	// row adds as much, up to MaxEjectionTime.
	BaseEjectionTime time.Duration
	MaxEjectionTime  time.Duration
	// MaxEjectionPercent bounds the share of a pool's clusters ejected at
	// once; whatever it says, one of two or more may be, and never all.
	MaxEjectionPercent int
}

// DefaultConfig is Envoy's outlier detection fitted to the clusters of a
// pool, few and each of many servers, so that a cluster answering 5xx at
// once takes at most one request in a hundred after five seconds, and
// one that recovers is back within thirty: five failures in a row eject it
// (three gateway failures: a hung first byte is slow to show); an ejection
// lasts 5 s, 10 s, 15 s, up to 20 s; half the clusters may be ejected.
func DefaultConfig() Config {
	return Config{
		Consecutive5xx:             5,
		ConsecutiveGatewayFailure:  3,
		SuccessRateInterval:        10 * time.Second,
		SuccessRateMinimumRequests: 20,
		SuccessRateFactor:          0.7,
		BaseEjectionTime:           5 * time.Second,
		MaxEjectionTime:            20 * time.Second,
		MaxEjectionPercent:         50,
	}
}

// Validate says what is wrong with c.
func (c Config) Validate() error {
	var errs []error
	if c.Consecutive5xx < 0 || c.ConsecutiveGatewayFailure < 0 || c.SuccessRateMinimumRequests < 0 {
		errs = append(errs, fmt.Errorf("consecutive failures and minimum requests must not be negative"))
	}
	if c.SuccessRateInterval < 0 {
		errs = append(errs, fmt.Errorf("success-rate interval %v must not be negative", c.SuccessRateInterval))
	}
	if !(c.SuccessRateFactor >= 0 && c.SuccessRateFactor <= 1) {
		errs = append(errs, fmt.Errorf("success-rate factor %v must be within [0, 1]", c.SuccessRateFactor))
	}
	if c.BaseEjectionTime <= 0 || c.MaxEjectionTime < c.BaseEjectionTime {
		errs = append(errs, fmt.Errorf("base ejection time %v must be positive and at most the maximum %v", c.BaseEjectionTime, c.MaxEjectionTime))
	}
	if c.MaxEjectionPercent < 0 || c.MaxEjectionPercent > 100 {
		errs = append(errs, fmt.Errorf("max ejection percent %d must be within [0, 100]", c.MaxEjectionPercent))
	}
	return errors.Join(errs...)
}

// EventKind is a change of a cluster's ejection.
type EventKind int8

const (
	// EventEjected: the cluster was ejected (Reason, For, Ejections).
	EventEjected EventKind = iota
	// EventProbing: its ejection time is over; it takes a request again.
	EventProbing
	// EventReturned: a request it took after its ejection succeeded.
	EventReturned
	// EventOverflow: a rule would eject it (Reason), but MaxEjectionPercent
	// of its pool's clusters are ejected already. Said once until it is
	// ejected or succeeds.
	EventOverflow
)

// Event is a change of one cluster's ejection.
type Event struct {
	Key
	Kind   EventKind
	Reason Reason
	// For is how long the ejection lasts, Ejections how many in a row
	// (EventEjected).
	For       time.Duration
	Ejections int
}

// Detector follows the clusters of every pool. It is safe for concurrent
// use.
type Detector struct {
	cfg    Config
	fb     FirstByteConfig
	notify func(Event)

	// mu guards pools and their members; Ejected, on every candidate of
	// every request, reads a cluster in the choice under its read lock.
	mu    sync.RWMutex
	pools map[string]*pool
	// changes counts the ejections and the clusters added and forgotten
	// (Changes); written with mu held for writing.
	changes atomic.Uint64
}

type pool struct {
	members map[string]*member
	// windowStart is when the success-rate window began.
	windowStart time.Time
}

type member struct {
	consecutive5xx, consecutiveGateway int
	// ejectedUntil is when the ejection ends; probing says it ended and
	// no request has succeeded since, probeSent that one is in flight.
	ejectedUntil       time.Time
	probing, probeSent bool
	ejections          int
	returned           time.Time
	overflow           bool
	requests, failures int
	firstBytes         history
}

// New returns a detector of cfg (which Validate accepted) and fb, which
// tells notify of every change (outside its lock; notify may be nil).
func New(cfg Config, fb FirstByteConfig, notify func(Event)) *Detector {
	if notify == nil {
		notify = func(Event) {}
	}
	return &Detector{cfg: cfg, fb: fb, notify: notify, pools: map[string]*pool{}}
}

// member returns k's member, which it adds. Called with mu held.
func (d *Detector) member(k Key, now time.Time) (*pool, *member) {
	p := d.pools[k.Pool]
	if p == nil {
		p = &pool{members: map[string]*member{}, windowStart: now}
		d.pools[k.Pool] = p
	}
	m := p.members[k.Cluster]
	if m == nil {
		m = &member{}
		p.members[k.Cluster] = m
		d.changes.Add(1)
	}
	return p, m
}

// Ejected says whether k is out of the choice of new requests at now():
// ejected, or eligible again with its probe in flight. It makes k one of
// its pool's clusters. now is called only for a cluster ejected lately:
// the time costs more than the look-up that says a cluster is in.
func (d *Detector) Ejected(k Key, now func() time.Time) bool {
	d.mu.RLock()
	in := false
	if p := d.pools[k.Pool]; p != nil {
		m := p.members[k.Cluster]
		in = m != nil && m.ejectedUntil.IsZero()
	}
	d.mu.RUnlock()
	if in {
		return false
	}
	at := now()
	var ev []Event
	defer func() { d.tell(ev) }()
	d.mu.Lock()
	defer d.mu.Unlock()
	_, m := d.member(k, at)
	if m.ejectedUntil.IsZero() {
		return false
	}
	if at.Before(m.ejectedUntil) {
		return true
	}
	if !m.probing {
		m.probing = true
		ev = append(ev, Event{Key: k, Kind: EventProbing})
	}
	return m.probeSent
}

// NotIn appends to out the indices i below n whose key(i) may be out of
// the choice: ejected, eligible again (Ejected says whether its probe is
// in flight), or not one of its pool's clusters yet (which Ejected makes
// it). The others are in, read under one read lock where Ejected takes
// one a cluster, and stay in while Changes returns the version NotIn
// returns: only an ejection takes a cluster out. The sidecar asks for
// every cluster of a backend on every pick, then Ejected of the few
// NotIn found, and asks NotIn again only when the version changes.
func (d *Detector) NotIn(n int, key func(i int) Key, out []int) (_ []int, version uint64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for i := range n {
		k := key(i)
		if p := d.pools[k.Pool]; p != nil {
			if m := p.members[k.Cluster]; m != nil && m.ejectedUntil.IsZero() {
				continue
			}
		}
		out = append(out, i)
	}
	return out, d.changes.Load()
}

// Changes is the version of the detector's clusters that NotIn read: it
// changes whenever one is ejected, added or forgotten.
func (d *Detector) Changes() uint64 { return d.changes.Load() }

// Sent notes a request sent to k: its probe, when it is eligible again
// after an ejection.
func (d *Detector) Sent(k Key, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, m := d.member(k, now); m.probing {
		m.probeSent = true
	}
}

// NoResult notes that a request sent to k ended without a result (the
// gateway went away, or did not say how the response began): its probe
// may go again.
func (d *Detector) NoResult(k Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.pools[k.Pool]; p != nil {
		if m := p.members[k.Cluster]; m != nil {
			m.probeSent = false
		}
	}
}

// Record notes the result of a request k took, at now.
func (d *Detector) Record(k Key, r Result, now time.Time) {
	var ev []Event
	defer func() { d.tell(ev) }()
	d.mu.Lock()
	defer d.mu.Unlock()
	p, m := d.member(k, now)
	ev = d.evaluate(p, k.Pool, now, ev)
	m.requests++
	if r == Success {
		m.consecutive5xx, m.consecutiveGateway, m.overflow = 0, 0, false
		if m.probing {
			m.probing, m.probeSent, m.ejectedUntil, m.returned = false, false, time.Time{}, now
			ev = append(ev, Event{Key: k, Kind: EventReturned})
		}
		return
	}
	m.failures++
	m.consecutive5xx++
	if r == GatewayFailure {
		m.consecutiveGateway++
	} else {
		m.consecutiveGateway = 0
	}
	switch {
	case m.probing:
		ev = d.eject(p, m, k, ReasonFailedProbe, now, ev)
	case !m.ejectedUntil.IsZero():
		// A request sent before the ejection: it is out already.
	case d.cfg.ConsecutiveGatewayFailure > 0 && m.consecutiveGateway >= d.cfg.ConsecutiveGatewayFailure:
		ev = d.eject(p, m, k, ReasonConsecutiveGatewayFailure, now, ev)
	case d.cfg.Consecutive5xx > 0 && m.consecutive5xx >= d.cfg.Consecutive5xx:
		ev = d.eject(p, m, k, ReasonConsecutive5xx, now, ev)
	}
}

// evaluate applies the success-rate rule to p once its window is over,
// and starts the next.
func (d *Detector) evaluate(p *pool, name string, now time.Time, ev []Event) []Event {
	if d.cfg.SuccessRateInterval <= 0 || now.Sub(p.windowStart) < d.cfg.SuccessRateInterval {
		return ev
	}
	min := max(d.cfg.SuccessRateMinimumRequests, 1)
	var requests, failures int
	for _, m := range p.members {
		if m.ejectedUntil.IsZero() {
			requests, failures = requests+m.requests, failures+m.failures
		}
	}
	for cluster, m := range p.members {
		if !m.ejectedUntil.IsZero() || m.requests < min || requests-m.requests < min {
			continue
		}
		rate := 1 - float64(m.failures)/float64(m.requests)
		others := 1 - float64(failures-m.failures)/float64(requests-m.requests)
		if rate < d.cfg.SuccessRateFactor*others {
			ev = d.eject(p, m, Key{Pool: name, Cluster: cluster}, ReasonSuccessRate, now, ev)
		}
	}
	for _, m := range p.members {
		m.requests, m.failures = 0, 0
	}
	p.windowStart = now
	return ev
}

// eject ejects m (k) for reason, unless its pool has as many ejected as it
// may.
func (d *Detector) eject(p *pool, m *member, k Key, reason Reason, now time.Time, ev []Event) []Event {
	if !m.probing && !d.mayEject(p, now) {
		if !m.overflow {
			m.overflow = true
			ev = append(ev, Event{Key: k, Kind: EventOverflow, Reason: reason})
		}
		return ev
	}
	if !m.returned.IsZero() {
		// A cluster back for a base ejection time forgets one ejection.
		m.ejections = max(m.ejections-int(now.Sub(m.returned)/d.cfg.BaseEjectionTime), 0)
	}
	m.ejections++
	length := min(d.cfg.BaseEjectionTime*time.Duration(m.ejections), d.cfg.MaxEjectionTime)
	m.ejectedUntil, m.probing, m.probeSent, m.overflow, m.returned = now.Add(length), false, false, false, time.Time{}
	d.changes.Add(1)
	m.consecutive5xx, m.consecutiveGateway = 0, 0
	return append(ev, Event{Key: k, Kind: EventEjected, Reason: reason, For: length, Ejections: m.ejections})
}

// mayEject says whether one more of p's clusters may be ejected: fewer
// than MaxEjectionPercent of them are (or are being probed), at least one
// of two or more, never all.
func (d *Detector) mayEject(p *pool, now time.Time) bool {
	n := len(p.members)
	limit := n * d.cfg.MaxEjectionPercent / 100
	limit = min(max(limit, 1), n-1)
	out := 0
	for _, m := range p.members {
		if !m.ejectedUntil.IsZero() {
			out++
		}
	}
	return out < limit
}

// Retain forgets the clusters keep reports false for: they left the
// routing table.
func (d *Detector) Retain(keep func(Key) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, p := range d.pools {
		for cluster := range p.members {
			if !keep(Key{Pool: name, Cluster: cluster}) {
				delete(p.members, cluster)
				d.changes.Add(1)
			}
		}
		if len(p.members) == 0 {
			delete(d.pools, name)
		}
	}
}

func (d *Detector) tell(ev []Event) {
	for _, e := range ev {
		d.notify(e)
	}
}
