package clusterscore

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Shares are the shares of its home keys this sidecar offers each
// cluster (Homes deals the keys in these shares, and the home bound is
// relative to them). While the sidecar's traffic is all the clusters
// serve, a cluster's share is its capacity's. When their EPPs count the
// requests they route by the cluster that relayed them
// (PoolMetrics.RelayedRequests, mci-epp), the shares are leveled against
// the traffic the sidecar does not place: the clusters' own users, other
// importing clusters. So each cluster ends with its capacity's share of
// all the requests rather than of this sidecar's alone: an exporter busy
// with its own users is dealt fewer keys, and the importing cluster's own
// servers more.
//
// The level is water-filling: this cluster's rate of requests R (to every
// cluster, as their EPPs count them) is poured over the clusters, each
// holding the others' rate already, up to the level at which every one
// holds the same per unit of capacity (one above it gets none); each
// cluster's part of R is its share. Without other traffic that is
// capacity's share.
//
// Every replica of the sidecar reads the same counts (they relay under the
// same cluster name), so replicas deal alike, as Homes needs. The rates
// are smoothed (sharesSmoothing), and the shares adopted only when one
// moved by sharesStep or the candidates changed, and quantized, because
// every adoption deals the keys again and each key moved is a cold
// prefill: the shares follow a shift of the traffic, not its bursts. A
// cluster whose EPP counts nothing (an upstream EPP) is taken to carry no
// other traffic. It is safe for concurrent use.
type Shares struct {
	mu     sync.Mutex
	scopes map[string]*offered
}

// NewShares returns shares with nothing counted yet.
func NewShares() *Shares { return &Shares{scopes: map[string]*offered{}} }

const (
	// sharesSmoothing is the time constant of the rates' moving
	// averages: several scrapes, so that the shares follow the traffic's
	// mix rather than its bursts.
	sharesSmoothing = 10 * time.Second
	// sharesSampled is how often the counts are read: once a scrape (the
	// pool metrics change no more often).
	sharesSampled = time.Second
	// sharesPause is how long without a pick is a pause in the traffic.
	sharesPause = 5 * time.Second
	// sharesStep is how far one cluster's share must move from the one
	// adopted before the keys are dealt again.
	sharesStep = 0.1
	// sharesQuantum is what leveled shares are rounded to, and the least
	// share a kept candidate is offered (so that it keeps its place in
	// the deal's order).
	sharesQuantum = 1.0 / 64
)

// offered is one scope's state, for the kept candidates of signature
// set: by candidate index, the cluster the index held when last read
// (ids), the smoothed rates of requests (this cluster's own and the
// others'), whether they are known, the counts they were last read at;
// and the adopted shares (0 for a candidate not kept), which are
// replaced, never written to.
type offered struct {
	set     uint64
	sampled time.Time
	ids     []uint32
	// names are the clusters at the indexes, for Each.
	names       []string
	own, others []float64
	known       []bool
	last        []relayedCount
	shares      []float64
	// over is, by candidate index, how far the kept candidate's part of
	// all the requests the counts saw is above its capacity's share of
	// the kept candidates' capacity (below it: negative); nil unless
	// every kept candidate's counts are known. Replaced, never written
	// to, as shares are.
	over []float64
}

// relayedCount is a candidate's counts as last read, and when its EPP
// was scraped for them; zero when none was read.
type relayedCount struct {
	at          time.Time
	own, others float64
}

// offer rewrites caps, the capacities of the kept candidates (kept[k]'s
// at k), as the shares this sidecar offers them, and returns the shares by
// candidate index, and how far each is above its capacity's share of all
// the requests (offered.over; nil when not known). The candidates' slots
// say whether their pool metrics are fresh.
func (s *Shares) offer(req *Request, cands []Candidate, kept []int, slots []slot, caps []float64) (shares, over []float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.scopes[req.Scope]
	if o == nil {
		o = &offered{}
		s.scopes[req.Scope] = o
	}
	set := keptSignature(cands, kept, caps)
	if changed := set != o.set || len(o.shares) != len(cands); changed || req.Now.Sub(o.sampled) >= sharesSampled {
		o.sample(req, cands, kept, slots)
		o.adopt(set, changed, kept, caps)
		o.measureOver(kept, caps)
	}
	for k, i := range kept {
		caps[k] = o.shares[i]
	}
	return o.shares, o.over
}

// Retain forgets the scopes keep reports false, as the routing table drops
// pools.
func (s *Shares) Retain(keep func(scope string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for scope := range s.scopes {
		if !keep(scope) {
			delete(s.scopes, scope)
		}
	}
}

// Each calls f with every scope's adopted share of each kept cluster (in
// no order), for the metrics; under the shares' lock, which picks take,
// so f only copies.
func (s *Shares) Each(f func(scope, cluster string, share float64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for scope, o := range s.scopes {
		for i, share := range o.shares {
			if share > 0 && i < len(o.names) {
				f(scope, o.names[i], share)
			}
		}
	}
}

// keptSignature stands for the kept candidates, their places and their
// capacities, whatever the order of kept (the score order, which moves
// every pick).
func keptSignature(cands []Candidate, kept []int, caps []float64) uint64 {
	s := mix64(uint64(len(cands)))
	for k, i := range kept {
		s += mix64(mix64(uint64(i)<<32|uint64(cands[i].id())) ^ math.Float64bits(caps[k]))
	}
	return s
}

// sample smooths in the kept candidates' rates of requests, from their
// counts (relayedCounts) since the scrape they were read at before.
func (o *offered) sample(req *Request, cands []Candidate, kept []int, slots []slot) {
	if n := len(cands); len(o.own) != n {
		o.ids, o.names, o.own, o.others, o.known, o.last = make([]uint32, n), make([]string, n), make([]float64, n), make([]float64, n), make([]bool, n), make([]relayedCount, n)
	}
	// Counts read across a pause in this sidecar's picks are no rate of
	// the traffic it levels against: they hold whatever the pause held
	// (on the routing benchmark, other routings' runs). They only start
	// the next rate.
	paused := !o.sampled.IsZero() && req.Now.Sub(o.sampled) > sharesPause
	o.sampled = req.Now
	for _, i := range kept {
		if id := cands[i].id(); o.ids[i] != id {
			// Another cluster at this place (the table changed): what
			// was read of the one before is not its.
			o.ids[i], o.names[i], o.known[i], o.last[i] = id, cands[i].Name, false, relayedCount{}
		}
		now, ok := relayedCounts(&cands[i], slots[i].measured, req.Cluster)
		last := o.last[i]
		switch {
		case !ok:
			o.known[i], o.last[i] = false, relayedCount{}
			continue
		case !now.at.After(last.at):
			continue // the same scrape
		}
		o.last[i] = now
		dt := now.at.Sub(last.at)
		if paused || last.at.IsZero() || now.own < last.own || now.others < last.others {
			continue // a pause, a first reading, or the EPP restarted
		}
		own, others := (now.own-last.own)/dt.Seconds(), (now.others-last.others)/dt.Seconds()
		if !o.known[i] {
			o.own[i], o.others[i], o.known[i] = own, others, true
			continue
		}
		weight := 1 - math.Exp(-float64(dt)/float64(sharesSmoothing))
		o.own[i] += weight * (own - o.own[i])
		o.others[i] += weight * (others - o.others[i])
	}
}

// relayedCounts is what candidate c's EPP counts of the requests it
// routed: this cluster's (named cluster) and the others'; false when its
// pool metrics are not fresh (measured) or count none. Its own cluster's
// gateway's requests are this sidecar's at the local candidate, and
// another cluster's users' at a remote one.
func relayedCounts(c *Candidate, measured bool, cluster string) (relayedCount, bool) {
	if !measured || c.Pool.RelayedRequests == nil {
		return relayedCount{}, false
	}
	mine := cluster
	if c.Local {
		mine = ""
	}
	n := relayedCount{at: c.Pool.UpdatedAt}
	for from, count := range c.Pool.RelayedRequests {
		if from == mine {
			n.own += count
		} else {
			n.others += count
		}
	}
	return n, true
}

// adopt levels the shares (water-filling) and adopts them when the kept
// candidates changed or one moved by a step; capacity's shares while no
// candidate's counts are known.
func (o *offered) adopt(set uint64, changed bool, kept []int, caps []float64) {
	o.set = set
	load, others, known := 0.0, make([]float64, len(kept)), false
	for k, i := range kept {
		if o.known[i] {
			load, others[k], known = load+o.own[i], o.others[i], true
		}
	}
	// At least one request's worth, so that an idle sidecar's shares are
	// those its next request would level.
	shares := waterFill(caps, others, max(load, 1))
	for k, i := range kept {
		changed = changed || math.Abs(shares[k]-o.shares[i]) >= sharesStep
	}
	if !changed {
		return
	}
	o.shares = make([]float64, len(o.own))
	for k, i := range kept {
		if known {
			o.shares[i] = max(math.Round(shares[k]/sharesQuantum), 1) * sharesQuantum
		} else {
			o.shares[i] = shares[k] // capacity's share, as exact as before
		}
	}
}

// measureOver finds over from the smoothed rates, with caps the kept
// candidates' capacities: each one's part of the requests every kept
// candidate served (its own and the others') less its part of their
// capacity. Unknown (nil) while a kept candidate's counts are not known,
// or none served a request: a part of an unknown whole is no figure. Nil
// too while the traffic the sidecar does not place is at most
// splitUnseenAbove of all of it: then a home over its share is its
// groups' own traffic, which its bound already sheds, and nothing is
// split.
func (o *offered) measureOver(kept []int, caps []float64) {
	o.over = nil
	served, others, capacity := 0.0, 0.0, 0.0
	for k, i := range kept {
		if !o.known[i] {
			return
		}
		served, others, capacity = served+o.own[i]+o.others[i], others+o.others[i], capacity+caps[k]
	}
	if served <= 0 || capacity <= 0 || others <= splitUnseenAbove*served {
		return
	}
	o.over = make([]float64, len(o.own))
	for k, i := range kept {
		o.over[i] = (o.own[i]+o.others[i])/served - caps[k]/capacity
	}
}

// waterFill returns the shares of load that level each candidate's load
// per capacity: candidate k holds others[k] already and has capacity
// caps[k] (> 0); the shares sum to 1. A candidate already above the
// level gets none.
func waterFill(caps, others []float64, load float64) []float64 {
	byLoad := make([]int, len(caps))
	for k := range byLoad {
		byLoad[k] = k
	}
	perCap := func(k int) float64 { return others[k] / caps[k] }
	slices.SortStableFunc(byLoad, func(a, b int) int {
		switch pa, pb := perCap(a), perCap(b); {
		case pa < pb:
			return -1
		case pa > pb:
			return 1
		}
		return 0
	})
	// Filling the least loaded first: with the first m candidates taking
	// the load, the level is (load + what they hold) / their capacity,
	// valid once it is at most the next one's load per capacity.
	level, held, capacity := 0.0, 0.0, 0.0
	for m, k := range byLoad {
		held += others[k]
		capacity += caps[k]
		level = (load + held) / capacity
		if m+1 == len(byLoad) || level <= perCap(byLoad[m+1]) {
			break
		}
	}
	shares := make([]float64, len(caps))
	for k := range caps {
		shares[k] = max(level*caps[k]-others[k], 0) / load
	}
	return shares
}
