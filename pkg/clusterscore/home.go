package clusterscore

import (
	"math"
	"slices"
	"strconv"
	"time"
)

// Home placement: the requests of a prefix have a home cluster, derived
// from the prefix itself, that they go to unless it is loaded beyond a
// bound. Consistent hashing with bounded loads (Mirrokni, Thorup and
// Zadimoghaddam): the candidates are ranked by weighted rendezvous (HRW)
// hashing of the request's leading prompt blocks, and the first of that
// order whose load stays within HomeBound times its share of the total
// takes the request. Because the home is a function of the prompt and of
// the candidates' names and capacities, every sidecar replica computes the
// same one without sharing anything; because it does not depend on what
// served the prefix before, a request that leaves its home does not take
// its prefix's placement with it.

// homeKeyBlocks is how many leading prompt blocks the home is hashed from:
// 256 bytes of prompt text, about 64 tokens. Prompts that share them share
// a home, so a system prompt shared by many conversations places them all
// (and every turn of each) on one cluster; a prompt shorter than that is
// placed by its full blocks. Fewer blocks would make unrelated prompts that
// open with the same boilerplate share a home; more would give a
// conversation's first, short turn another home than the next ones.
const homeKeyBlocks = 4

// homeKey is the hash the home is derived from: the chained hash of the
// leading blocks, which stands for all of them; 0 when there is none.
func homeKey(blocks []uint64) uint64 {
	if len(blocks) == 0 {
		return 0
	}
	return blocks[min(len(blocks), homeKeyBlocks)-1]
}

// rendezvous is the weighted rendezvous score of a cluster for a key: the
// cluster of the highest score is the key's home, and the share of keys a
// cluster is home to is its weight's share (the logarithmic method), so
// that a change of one cluster's weight or presence moves only the keys
// it gains or loses.
func rendezvous(key uint64, cluster uint32, weight float64) float64 {
	u := (float64(rendezvousHash(key, cluster)>>11) + 0.5) / (1 << 53) // uniform in (0, 1)
	return -weight / math.Log(u)
}

// rendezvousHash is the hash a cluster's rendezvous score for a key is
// made from: with equal weights, the scores are in its order.
func rendezvousHash(key uint64, cluster uint32) uint64 {
	return mix64(key ^ uint64(cluster)*0x9e3779b97f4a7c15)
}

// mix64 is splitmix64's finalizer: every bit of the input moves every bit
// of the output.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// HomeOutcome is how home placement led a request: the one decision the
// explanation, the log and the metrics all say (its String is the result
// label of mci_sidecar_prefix_home_requests_total).
type HomeOutcome uint8

// The outcomes, as decideHome reaches them.
const (
	// HomeNone: no home placement (the configuration has no home bound).
	HomeNone HomeOutcome = iota
	// HomeNoKey: the request has no full prompt block, so no home; the
	// picker leads as it would without home placement.
	HomeNoKey
	// HomeDealt: the key is new to this sidecar, so no cluster is known to
	// cache it; the backend's rotation dealt it among the candidates
	// within the bound, its home or not.
	HomeDealt
	// HomeReported: the key is new to this sidecar, and a candidate's EPP
	// reports that its servers hold the prompt's leading blocks (its
	// prefix summary: traffic this sidecar did not route left them
	// there); that cluster, as the key's home, took the request.
	HomeReported
	// HomeAtHome: the home took the request.
	HomeAtHome
	// HomeFollowed: the request continues a conversation home placement
	// moved off its home (HomeSplit, Moved), and the cluster its last
	// turn went to, which holds more of its prompt than the home, took it
	// within its bound: the history is there, the home would compute it
	// cold.
	HomeFollowed
	// HomeSplit: the request opens a conversation (Request.Opens) of a
	// key whose home serves more than splitMargin above its capacity's
	// share of all the requests its EPP and the others count (Shares),
	// more than splitUnseenAbove of them traffic the sidecar does not
	// place; of the candidates of the first tier below their own share,
	// the one holding the most of the prompt, then the furthest below,
	// took it,
	// within its bound, and the conversation's later turns follow it
	// (HomeFollowed). A group's system prompt is then computed on one more
	// cluster, once, where whole groups could not hold equal shares.
	HomeSplit
	// HomeNoWait: the home is beyond its bound, but its servers' own
	// figures (the pool's waiting queue per server) show no more waiting
	// there than at the least queued candidate: leaving would add a cold
	// prefill elsewhere and save no wait, so the home took the request.
	HomeNoWait
	// HomeSecond: the home could not take it (beyond its bound, saturated
	// or stale) and its key's second home did.
	HomeSecond
	// HomeQueued: the home's scraped queue per server was beyond the queue
	// margin above the least queued candidate's; the request went to the
	// key's second home if that one took it, else as a spill would.
	HomeQueued
	// HomeOverdue: a request this sidecar sent the home has awaited its
	// first byte past what the home's first bytes lately took (overdue):
	// its batch is full of traffic the sidecar does not see, or it stalled,
	// before a scrape can show it; the request went to the key's second
	// home if that one took it, else as a spill would.
	HomeOverdue
	// HomeFilled: the home's pool metrics said every batch place of its
	// servers was taken and a request this sidecar sent it had awaited its
	// first byte past the home's average (homeBound.filled): it waits for
	// a place, not in a prefill; the request went to the key's second home
	// if that one took it, else as a spill would.
	HomeFilled
	// HomeSpill: neither the home nor its second home could take it; the
	// best scored candidate within the bound did.
	HomeSpill
	// HomeScoreOrder: no candidate of the first tier was within the bound:
	// the candidates keep the score order.
	HomeScoreOrder
	numHomeOutcomes
)

var homeOutcomeNames = [numHomeOutcomes]string{"none", "no_key", "dealt", "reported", "home", "followed", "split", "home_no_wait", "second_home", "queued", "overdue", "filled", "spill", "score_order"}

func (o HomeOutcome) String() string {
	if o < numHomeOutcomes {
		return homeOutcomeNames[o]
	}
	return "HomeOutcome(" + strconv.Itoa(int(o)) + ")"
}

// HomeOutcomes lists the outcomes a request of a configuration with a home
// bound can have (all but HomeNone).
func HomeOutcomes() []HomeOutcome {
	out := make([]HomeOutcome, 0, numHomeOutcomes-1)
	for o := HomeNoKey; o < numHomeOutcomes; o++ {
		out = append(out, o)
	}
	return out
}

// HomeDecision is where a request's home was and whether it took the
// request.
type HomeDecision struct {
	// Outcome is the lead decision (decideHome); HomeNone without home
	// placement.
	Outcome HomeOutcome
	// Home is the name of the request's home cluster; "" when the request
	// has no home (no full prompt block, or no home bound configured).
	Home string
	// Load is the home's load when the request came: this sidecar's
	// requests in flight to it. Bound is the
	// most it may hold with the request: HomeBound times its capacity's
	// share of the total load, the request included, rounded up.
	Load, Bound float64
	// Queue is the home's waiting queue per server from its fresh pool
	// metrics (-1 when not measured), and Queued is true when it was
	// beyond the queue margin above the least queued candidate's of the
	// first tier: the home's servers are taken by traffic this sidecar
	// does not see (its own in-flight count cannot tell), so it counts as
	// loaded whatever its bound.
	Queue  float64
	Queued bool
	// Filled is true when the home's batch was full and a request of this
	// sidecar there waited past its average first byte (homeBound.filled).
	Filled bool
	// Awaited is how long the home's longest awaiting request of this
	// sidecar has waited for its first byte (0 when none waits), Due how
	// long it may before it is overdue (0 when the home has no first byte
	// measured), and Overdue says it waited longer (overdueAfter).
	Awaited, Due time.Duration
	Overdue      bool
	// Left is true when the request did not go to its home: every outcome
	// but HomeAtHome, and HomeDealt when the rotation dealt it elsewhere.
	Left bool
	// Second is the name of the cluster a request that left its home went
	// to as its key's second home (secondHome); "" when it went elsewhere.
	Second string
	// New is true when this sidecar has not served a prompt of this home
	// key yet (HomeDealt, or HomeScoreOrder when no candidate was within
	// the bound).
	New bool
	// Alike is true when the candidates counted alike for the hashing and
	// the bound because not every one reported its ready pods (fresh pool
	// metrics): capacities are then unknown, not equal.
	Alike bool
	// Wait is the wait term of the cost of leaving: the home's waiting
	// queue per server above the least queued candidate's of the first
	// tier, from the servers' own figures (-1 when the home's queue is
	// not measured). Won says which term of the cost decided a request
	// whose home was loaded by its bound or its queue.
	Wait float64
	Won  CostTerm
}

// CostTerm is the term of the cost of leaving a loaded home that decided
// where the request went (homeRule.noWait).
type CostTerm uint8

const (
	// CostNone: no cost was weighed (no key, a new key, or a home within
	// its bound and not queued).
	CostNone CostTerm = iota
	// CostPrefill: the home's servers have no more waiting than the least
	// queued candidate's, so a move would add a cold prefill elsewhere and
	// save no wait: the home kept the request (HomeNoWait).
	CostPrefill
	// CostWait: the home's servers have more waiting than the least
	// queued candidate's (beyond the queue margin, or beyond the bound by
	// the sidecar's own count), a request there is overdue, or the home is
	// saturated: the request left.
	CostWait
	// CostUnknown: the home's queue is not measured (no fresh pool
	// metrics, or a stale home), so the bound alone decided.
	CostUnknown
)

var costTermNames = [...]string{"none", "prefill", "wait", "unknown"}

func (c CostTerm) String() string {
	if int(c) < len(costTermNames) {
		return costTermNames[c]
	}
	return "CostTerm(" + strconv.Itoa(int(c)) + ")"
}

// homeRule is what the lead decision reads about a request with a home
// key. deal, second and spill say where the request may go instead, as an
// index into the first tier (-1 for nowhere); decideHome asks each only
// when the rule reaches it, because dealing advances the rotation.
type homeRule struct {
	// key: the request has a home key (a full prompt block); established:
	// this sidecar has served a prompt of the key; reported: it has not,
	// and home is the candidate whose EPP reports holding the most of the
	// prompt (reportedHome).
	key, established, reported bool
	// inFirstTier: the home is among the candidates of the first tier
	// (not saturated or stale while another is not); queued: its queue is
	// beyond the queue margin (homeBound.queued); withinBound: its load,
	// the request included, is within the bound; noWait: its servers'
	// queue, measured, is no longer than the least queued candidate's
	// (homeBound.noWait); overdue: one of the sidecar's requests there
	// has awaited its first byte past its due (homeBound.overdue);
	// filled: its batch is full and a request there waits past its
	// average first byte (homeBound.filled).
	inFirstTier, queued, overdue, filled, withinBound, noWait bool
	// overShare: the request opens a conversation and its home, in the
	// first tier, serves more than splitMargin above its share of all the
	// requests (homeBound.overShare).
	overShare bool
	// home is the home's index in the first tier when inFirstTier.
	home int
	// follow is where the request's conversation was moved before, when
	// that candidate holds more of its prompt than the home and takes it
	// (Pipeline.follow); split where a conversation opened at a home
	// over its share goes (homeBound.split); -1 for nowhere.
	follow, split func() int
	// deal is where the backend's rotation deals a new key among the
	// candidates within the bound (homeBound.spread); second the key's
	// second home when it is in the first tier and within the bound
	// (secondHome); spill the best scored candidate within the bound
	// other than the home (homeBound.spillTo); order where the score
	// order leads when nothing within the bound takes the request: -1 for
	// its first, or the best scored of the first tier that is not overdue
	// when its first is (homeBound.notOverdue).
	deal, second, spill, order func() int
}

// decideHome is home placement's lead decision, as a table read from the
// top, and the index in the first tier of the candidate to lead (-1: the
// score order stands):
//
//	no key                             no key (the picker leads)
//	new key, its prefix reported
//	  held by a candidate's EPP        as an established key's home, that
//	                                   candidate (the rows below; says
//	                                   reported where it takes the request)
//	new key                            dealt by the rotation      else score order
//	a conversation moved off its home
//	  before (split)                   where it went, if it holds more of the
//	                                   prompt and takes it; says followed
//	a conversation opens, its home
//	  over its share of all requests,
//	  over a tenth not placed here     of those below their share, the one
//	                                   holding the most of the prompt, then
//	                                   the furthest below, if it takes it;
//	                                   says split
//	home in the first tier, within
//	  the bound and not queued         home
//	home beyond the bound, no more
//	  waiting than the least queued    home (no wait to save)
//	home queued                        second home, else spill    else score order; says queued
//	home with a request overdue        second home, else spill    else score order; says overdue
//	home's batch full, a request there
//	  past its average first byte      second home, else spill    else score order; says filled
//
// The score order never leads with a cluster that has a request overdue
// while another of the first tier has none.
//
//	home beyond the bound and waiting,
//	  saturated or stale               second home, else spill    else score order
func decideHome(r homeRule) (HomeOutcome, int) {
	if !r.key {
		return HomeNoKey, -1
	}
	if !r.established && !r.reported {
		if i := r.deal(); i >= 0 {
			return HomeDealt, i
		}
		return HomeScoreOrder, r.order()
	}
	if i := r.follow(); i >= 0 {
		return HomeFollowed, i
	}
	if r.overShare {
		if i := r.split(); i >= 0 {
			return HomeSplit, i
		}
	}
	if r.inFirstTier && !r.queued && !r.overdue && !r.filled {
		if r.withinBound && r.reported {
			return HomeReported, r.home
		}
		if r.withinBound {
			return HomeAtHome, r.home
		}
		if r.noWait {
			return HomeNoWait, r.home
		}
	}
	outcome, lead := HomeSecond, r.second()
	if lead < 0 {
		outcome, lead = HomeSpill, r.spill()
	}
	if lead < 0 {
		outcome, lead = HomeScoreOrder, r.order()
	}
	switch {
	case r.inFirstTier && r.queued:
		outcome = HomeQueued
	case r.inFirstTier && r.overdue:
		outcome = HomeOverdue
	case r.inFirstTier && r.filled:
		outcome = HomeFilled
	}
	return outcome, lead
}

// homeLoad fills a kept candidate's load and capacity for the bound
// (Pipeline.loads calls it for each): the requests this sidecar has in
// flight to it (exact for its own traffic, and with requests dealt to
// replicas in turn, each replica's share of the whole), and its ready
// pods and waiting queue when its pool metrics are fresh. The scraped
// queues, which every replica sees alike, are not added to the load: they
// are up to a scrape old, and counting them made new prompts queue longer
// with 3 replicas
// (docs/design/cluster-scoring.md); they make a home loaded by their own
// rule instead (homeBound.queued).
func homeLoad(now time.Time, s *slot, ob *Observation) {
	s.homeLoad, s.capacity, s.queue, s.awaiting = float64(ob.InFlight), 0, -1, ob.Awaiting
	s.awaited, s.due = ob.overdueAfter(now)
	s.ttfb, s.floor = ob.TTFB, ob.TTFBFloor
	if s.measured { // fresh pool metrics, as classify read them
		s.queue = s.poolQueue
		if s.pods > 0 {
			s.capacity = float64(s.pods)
		}
	}
}

// leadHome moves the candidate home placement decides (decideHome) to the
// front of kept, the others keeping their order, and returns the
// decision; its Home is empty when the request has no prompt block
// (HomeNoKey): the picker then leads as it would without a home.
func (p *Pipeline) leadHome(req *Request, cands []Candidate, kept []int, slots []slot, sc *scratch, rot *Rotation) HomeDecision {
	key := homeKey(req.Blocks)
	if key == 0 || len(kept) == 0 {
		outcome, _ := decideHome(homeRule{})
		return HomeDecision{Outcome: outcome}
	}
	var idBuf [maxStack]uint32
	var capBuf [maxStack]float64
	var farBuf [maxStack]uint8
	set := homeSet{ids: idBuf[:0], caps: capBuf[:0], far: farBuf[:0]}
	if len(kept) > maxStack {
		sc.ids, sc.caps, sc.far = slices.Grow(sc.ids[:0], len(kept)), slices.Grow(sc.caps[:0], len(kept)), slices.Grow(sc.far[:0], len(kept))
		set = homeSet{ids: sc.ids, caps: sc.caps, far: sc.far}
	}
	set, alike := keptIDs(cands, kept, slots, set)
	shares, over := p.sharesOf(req, cands, kept, slots, set.caps, sc)
	first := firstTier(kept, slots)
	n := len(first)
	home, served, reported := p.placeKey(req, key, set, first, slots)
	within := p.homeWithin(first, slots, shares)
	h, second := kept[home], -1
	r := homeRule{
		key: true, established: served > 0, reported: reported, inFirstTier: home < n, home: home,
		overShare: home < n && req.Opens && within.overShare(h, over),
		follow:    func() int { return p.follow(req, cands, h, first, within) },
		split:     func() int { return within.split(home, first, over, set.far) },
		queued:    home < n && within.queued(h), overdue: home < n && within.overdue(h), filled: home < n && within.filled(h),
		withinBound: within.withinBound(h), noWait: home < n && within.noWait(h),
		deal: func() int { return within.spread(first, rot) },
		second: func() int {
			if s := p.secondHome(req, key, set, home); s >= 0 && s < n && within.takes(kept[s]) {
				second = s
			}
			return second
		},
		spill: func() int { return within.spillTo(home, first) },
		order: func() int { return within.notOverdue(first) },
	}
	outcome, lead := decideHome(r)
	d := HomeDecision{Outcome: outcome, Home: cands[h].Name, Load: slots[h].homeLoad, Bound: within.bound(h), Queue: slots[h].queue,
		Queued: r.queued, Filled: r.filled, Left: lead != home, New: !r.established, Alike: alike, Wait: -1,
		Awaited: slots[h].awaited, Due: slots[h].due, Overdue: r.overdue}
	if home < n {
		d.Wait = within.wait(h)
	} else {
		d.Bound = 0 // saturated or stale: no bound to compare with
	}
	d.Won = costWon(outcome, r, d.Wait)
	if lead >= 0 && lead == second {
		d.Second = cands[kept[lead]].Name
	}
	if lead > 0 {
		c := kept[lead]
		copy(kept[1:lead+1], kept[:lead])
		kept[0] = c
	}
	return d
}

// sharesOf are the shares the kept candidates are dealt and bound by, by
// candidate index, and how far each is over its share of all the
// requests (nil: not known): those Shares offers rather than capacity's;
// of a sample, capacity's, since the shares leveled against the other
// traffic are of every candidate. caps are the kept candidates'
// capacities, which Shares rewrites as the shares it offers.
func (p *Pipeline) sharesOf(req *Request, cands []Candidate, kept []int, slots []slot, caps []float64, sc *scratch) (shares, over []float64) {
	if req.Sampled {
		return capacityShares(cands, kept, caps, sc), nil
	}
	return p.mem.Shares.offer(req, cands, kept, slots, caps)
}

// capacityShares is the kept candidates' capacities (caps, kept[k]'s at
// k) by candidate index, as the bound reads shares: in sc's space beyond
// a handful of candidates.
func capacityShares(cands []Candidate, kept []int, caps []float64, sc *scratch) []float64 {
	var shares []float64
	if sc != nil {
		sc.shares = slices.Grow(sc.shares[:0], len(cands))[:len(cands)]
		clear(sc.shares)
		shares = sc.shares
	} else {
		shares = make([]float64, len(cands))
	}
	for k, i := range kept {
		shares[i] = caps[k]
	}
	return shares
}

// firstTier is the candidates of kept's first tier, which the bound
// compares: those a request may go to before any saturated or stale one.
func firstTier(kept []int, slots []slot) []int {
	n := 1
	for n < len(kept) && slots[kept[n]].tier == slots[kept[0]].tier {
		n++
	}
	return kept[:n]
}

// placeKey returns the index, in the candidates' ids, of the key's home
// (findHome) and how many of its requests this sidecar served; for a key
// it never served that an EPP of the first tier reports held, that
// candidate (reportedHome) and reported.
func (p *Pipeline) placeKey(req *Request, key uint64, set homeSet, first []int, slots []slot) (home, served int, reported bool) {
	home, served = p.findHome(req, key, set)
	if served == 0 {
		if k := reportedHome(req, first, slots); k >= 0 {
			return k, 0, true
		}
	}
	return home, served, false
}

// reportedHome is the index in first (the candidates of the first tier,
// in score order) of the one whose EPP reports holding the most of the
// request's prompt, at least its home key's blocks (slot.reported); -1
// when none does. Of equal ones, the better scored.
func reportedHome(req *Request, first []int, slots []slot) int {
	best, most := -1, int32(min(len(req.Blocks), homeKeyBlocks))-1
	for k, i := range first {
		if r := slots[i].reported; r > most {
			best, most = k, r
		}
	}
	return best
}

// costWon is the term of the cost of leaving that decided an established
// key's request whose home was loaded: the cold prefill elsewhere when
// the home kept it for want of a wait to save; the wait at home when it
// left a home queued by its servers' figures or a saturated one; unknown
// when it left by the bound with no figure of the home's queue.
func costWon(outcome HomeOutcome, r homeRule, wait float64) CostTerm {
	switch {
	case outcome == HomeNoWait:
		return CostPrefill
	case !r.established || outcome == HomeNoKey || outcome == HomeAtHome:
		return CostNone
	case r.queued || r.overdue || r.filled || !r.inFirstTier || wait > 0:
		return CostWait
	}
	return CostUnknown
}

// homeBound is the load bound of one request's candidates of the first
// tier: HomeBound times a candidate's share (Shares) of their total
// load, the request included, rounded up.
type homeBound struct {
	// c is the bound's factor; total and shares the first tier's
	// load and shares; leastQueue its least scraped queue per server
	// (-1 when none is measured) and margin the queue margin (below
	// 0: none).
	c, total, shares, leastQueue, margin float64
	slots                                []slot
	// share is each candidate's share, by candidate index.
	share []float64
}

// homeWithin is the bound of a request over first. With n candidates, a
// factor of n or more times the average never binds while the others
// are idle: at most n - 1/2, so that a home that stops answering is left
// after a few requests (2 clusters at 2: 1.5, 3 requests).
func (p *Pipeline) homeWithin(first []int, slots []slot, share []float64) homeBound {
	b := homeBound{c: min(p.cfg.HomeBound, float64(len(first))-0.5), leastQueue: -1, margin: p.cfg.QueueMargin, slots: slots, share: share}
	for _, i := range first {
		b.total += slots[i].homeLoad
		b.shares += share[i]
		if q := slots[i].queue; q >= 0 && (b.leastQueue < 0 || q < b.leastQueue) {
			b.leastQueue = q
		}
	}
	return b
}

// queued is the rule by which the pool metrics make a candidate loaded
// (the queue rule): its servers' waiting queue (per server, as scraped)
// is more than the queue margin above the least queued candidate's of the first tier.
// The bound counts only this sidecar's requests, so a home filled by
// traffic it does not see (the cluster's own, other gateways') keeps its
// bound until the requests sent there pile up; the queue shows it from
// the first scrape after they wait. Every replica reads the same queue,
// so replicas agree on it, and a queue within the margin (a burst of the
// home's own groups) does not spill them. No margin (queue-margin=off)
// or an unmeasured candidate: no such rule.
func (b homeBound) queued(i int) bool {
	q := b.slots[i].queue
	return b.margin >= 0 && q >= 0 && q > b.leastQueue+b.margin
}

// wait is candidate i's waiting queue per server above the least queued
// candidate's of the first tier: the wait a request saves by leaving it,
// in requests per server, by the servers' own figures; -1 when its queue
// is not measured.
func (b homeBound) wait(i int) float64 {
	if q := b.slots[i].queue; q >= 0 {
		return q - b.leastQueue
	}
	return -1
}

// noWait is the rule by which a home beyond its bound keeps the request:
// its servers' waiting queue is measured and no longer than the least
// queued candidate's, and every request this sidecar sent it has had its
// first byte. Leaving costs the prompt's cold prefill elsewhere (the part
// the home holds and the other does not) and saves the wait at home
// beyond the wait there; with no such wait, the move only adds prefill,
// to the cluster it goes to and to the requests queued behind it there,
// which is how leaving a home under load feeds the load that made it
// leave. The bound counts this sidecar's requests in flight, a proxy for
// the wait; the queue is the servers' own figure of it, but a scrape old:
// a request of this sidecar still waiting for its first byte may be
// waiting behind traffic the figure does not show yet (a home that fills
// up or stops answering), and then the bound decides, as it does for a
// home whose queue is not measured.
func (b homeBound) noWait(i int) bool {
	q := b.slots[i].queue
	return q >= 0 && q <= b.leastQueue && b.slots[i].awaiting == 0
}

// bound is the most candidate i may hold with the request.
func (b homeBound) bound(i int) float64 {
	return math.Ceil(b.c * (b.total + 1) * b.share[i] / b.shares)
}

// withinBound reports whether candidate i's load, the request included,
// is within the bound.
func (b homeBound) withinBound(i int) bool { return b.slots[i].homeLoad+1 <= b.bound(i) }

// takes reports whether candidate i is within the bound with the
// request, not queued, not overdue and not filled.
func (b homeBound) takes(i int) bool {
	return b.withinBound(i) && !b.queued(i) && !b.overdue(i) && !b.filled(i)
}

// filled is the rule by which the servers' batch occupancy tells a home
// full of traffic the sidecar does not see from one busy with a cold
// prefill: its pool metrics say every batch place is taken
// (metrics.PoolMetrics.BatchFull) and one of the sidecar's requests there
// has awaited its first byte longer than the home's first bytes take on
// average. A prefill runs in a batch place, so with none free the wait is
// for a place, which lasts as long as the others' requests run; the
// overdue rule, which cannot tell the two, waits four spreads longer. The
// figures are a scrape old and a batch under load turns over, so the
// sidecar's own late request is what says the home is not turning over
// for it. A request that pays a cold prefill wherever it goes (a new key,
// a spill, a second home's) goes to no filled cluster (takes), but to one
// whose batch only reads full: keeping new keys off every batch a scrape
// caught full sent them all to the clusters it caught with a place, ten
// in a row, until the next scrape. Pools that
// publish no batch places (upstream EPPs, servers without
// vllm:num_requests_running) are never full: the queue and overdue rules
// tell, later.
func (b homeBound) filled(i int) bool {
	s := b.slots[i]
	return s.full && s.ttfb > 0 && s.awaited > s.ttfb
}

// overdue is the rule by which the sidecar's own observations make a
// candidate full between two scrapes: one of its requests there has
// awaited its first byte longer than the candidate's first bytes lately
// took (overdueAfter). A full batch and a cold prefill both delay a first
// byte, but a prefill takes what the candidate's prefills have taken, and
// that is in its history; a wait beyond it is a wait for a batch place,
// or a stall, that the pool metrics show a scrape later. Until that
// request has its first byte the candidate takes no new request: every
// request sent there meanwhile would wait behind it.
func (b homeBound) overdue(i int) bool {
	return b.slots[i].due > 0 && b.slots[i].awaited > b.slots[i].due
}

// notOverdue is -1 when the first of first (the score order) has no
// request overdue, else the index of the first that has none (-1 when
// every one has).
func (b homeBound) notOverdue(first []int) int {
	if !b.overdue(first[0]) {
		return -1
	}
	return slices.IndexFunc(first, func(i int) bool { return !b.overdue(i) })
}

// overdueAfter returns how long the longest awaiting of the sidecar's
// requests to the cluster has waited at now, and how long it may wait
// before it is overdue: the moving average of the cluster's times to
// first byte plus four times their spread (as TCP bounds a round trip
// before it retransmits), at least twice that average, so that a
// history of alike first bytes (no spread) does not make the next
// slightly slower one overdue. Both are derived from the cluster's own
// first bytes, which include its prefills, cold or warm, and its
// queueing under the load it has had; due is 0 while none is measured.
func (ob Observation) overdueAfter(now time.Time) (awaited, due time.Duration) {
	if !ob.AwaitingSince.IsZero() {
		awaited = max(now.Sub(ob.AwaitingSince), 0)
	}
	if ob.TTFB > 0 {
		due = max(ob.TTFB+4*ob.TTFBSpread, 2*ob.TTFB)
	}
	return awaited, due
}

// splitMargin is how far above its capacity's share of all the requests
// a home may serve before the conversations its groups open go elsewhere:
// the least of the margins (1 to 3 points) that kept every window of the
// routing benchmark's few-group workloads within 5 points of an equal
// share when simulated, which moves the fewest conversations.
const splitMargin = 0.03

// splitUnseenAbove is the part of all the requests the clusters count
// that the sidecar does not place (their own users', other importers')
// above which a home over its share splits its groups. Where the sidecar
// places nearly all of them, splitting only spread groups over more
// caches: on the routing benchmark's workloads of no such traffic it
// took one-shot-mix's hit ratio from 0.72 to 0.55 and sent conversations
// to the cluster that filled with its own batch (TTFT p99 8.8 s against
// 1.0), while the workloads that need it have 30% or more.
const splitUnseenAbove = 0.1

// overShare reports whether candidate i serves more than splitMargin
// above its share of all the requests (over, from Shares; nil: not known,
// and then never).
func (b homeBound) overShare(i int, over []float64) bool {
	return over != nil && over[i] > splitMargin
}

// follow is the index in first of where the request's conversation was
// moved (Moved): the candidate, other than the home (candidate index h),
// that holds the most of the prompt, more than the home and than the home
// key's blocks, when the conversation's last request went there and it
// takes this one; -1 otherwise.
func (p *Pipeline) follow(req *Request, cands []Candidate, h int, first []int, within homeBound) int {
	best, most := -1, max(within.slots[h].matched, homeKeyBlocks)
	for k, i := range first {
		if i != h && within.slots[i].matched > most {
			best, most = k, within.slots[i].matched
		}
	}
	if best < 0 || int(most) > len(req.Blocks) {
		return -1
	}
	if i := first[best]; p.mem.Moved.To(req.Blocks[most-1]) != cands[i].id() || !within.takes(i) {
		return -1
	}
	return best
}

// split is the index in first of where a conversation opened at a home
// over its share goes: of the candidates below their own share (over)
// that take the request, no further than the home (far, by kept index,
// which first begins), the one holding the most of the prompt (where the
// group's conversations split before went, its prefix is cached: on the
// five few-group workloads of traffic the sidecar does not see, the
// routed hit ratio rose by about a point against the furthest below
// alone, the shares within the spread), then the furthest below; -1 when
// none is below its share.
func (b homeBound) split(home int, first []int, over []float64, far []uint8) int {
	best := -1
	for k, i := range first {
		if k == home || over[i] >= 0 || distance(far, k) > distance(far, home) || !b.takes(i) {
			continue
		}
		if best < 0 {
			best = k
			continue
		}
		j := first[best]
		if m, n := b.slots[i].matched, b.slots[j].matched; m > n || m == n && over[i] < over[j] {
			best = k
		}
	}
	return best
}

// spillTo is the index in first of the best scored candidate within the
// bound other than the home (first is sorted by total), -1 for none.
func (b homeBound) spillTo(home int, first []int) int {
	for k, i := range first {
		if k != home && b.takes(i) {
			return k
		}
	}
	return -1
}

// spread is the index in first of where a request of a key new to this
// sidecar goes: the next of the backend's rotation (the smooth weighted
// round-robin of Weighted) among the candidates within the bound and not
// queued whose waiting is within one request of the least (waitingNow),
// else among all within the bound and not queued. A new key is cached
// nowhere, so its prefill costs the same on every cluster and only the
// wait differs: it goes where the fewest wait. The rotation still deals
// it among those, so that prompts that share nothing are spread as
// round-robin spreads them: placing them at their hashed homes, at the
// least loaded by this sidecar's in-flight count, or at the strictly
// least waiting, sent bursts to one cluster between two scrapes
// (docs/design/cluster-scoring.md). Without a rotation, the best scored
// within the bound.
func (b homeBound) spread(first []int, rot *Rotation) int {
	if rot == nil {
		return b.spillTo(-1, first)
	}
	// first is every kept candidate of the first tier: membership is
	// read from the slots, not searched for in first, which made dealing
	// quadratic in the candidates.
	tier := b.slots[first[0]].tier
	least := math.Inf(1)
	for _, i := range first {
		least = min(least, b.waitingNow(i))
	}
	deal := func(fewestWaiting bool) int {
		return slices.Index(first, rot.next(func(i int) bool {
			return i < len(b.slots) && b.slots[i].verdict == Kept && b.slots[i].tier == tier && b.takes(i) &&
				(!fewestWaiting || b.waitingNow(i) <= least+1/b.slots[i].capacity)
		}))
	}
	if k := deal(true); k >= 0 {
		return k
	}
	return deal(false)
}

// waitingNow is how many requests wait at candidate i per ready pod, as
// well as the sidecar can tell now: its servers' scraped queue (0 when
// not measured) and this sidecar's requests there still waiting for
// their first byte, which move with every request where the scrape moves
// once a second. A difference below one request per cluster is within
// the grain of both.
func (b homeBound) waitingNow(i int) float64 {
	return max(b.slots[i].queue, 0) + float64(b.slots[i].awaiting)/b.slots[i].capacity
}

// findHome returns the index, in the candidates' ids, of the request's
// home, and how many requests of its key this sidecar has served.
func (p *Pipeline) findHome(req *Request, key uint64, set homeSet) (home, served int) {
	if req.Sampled {
		// The deal is of every candidate, which a sample does not hold:
		// the first of the key's rendezvous order, unweighted, which is
		// the first of those Sample took that the filters kept.
		return firstByRendezvous(key, set.ids, nil, -1), p.mem.Homes.Count(req.Scope, key, req.Now)
	}
	// An established key has the home Homes deals it; another, the
	// first of its rendezvous order.
	assigned, served := p.mem.Homes.Home(req.Scope, key, set.ids, set.caps, set.far, req.Now)
	if assigned != 0 {
		if home = slices.Index(set.ids, assigned); home >= 0 {
			return home, served
		}
	}
	return firstByRendezvous(key, set.ids, set.caps, -1), served
}

// secondHome returns the index, in the candidates' ids, of where a request
// whose home (at index home) cannot take it goes first: for an established
// key, its home in the dealing of the keys without that cluster
// (Homes.Second), so that the groups of a full or failed cluster spread
// over the others in equal shares and every replica sends them to the same
// place; for a key served once, the next of its rendezvous order.
func (p *Pipeline) secondHome(req *Request, key uint64, set homeSet, home int) int {
	if req.Sampled {
		return firstByRendezvous(key, set.ids, nil, home)
	}
	if id := p.mem.Homes.Second(req.Scope, key, set.ids[home], set.ids, set.caps, set.far); id != 0 {
		return slices.Index(set.ids, id)
	}
	return firstByRendezvous(key, set.ids, set.caps, home)
}

// homeSet is what home placement deals keys over: the kept candidates'
// cluster ids, capacities and distance classes (parallel; far nil when
// every candidate is as near as the nearest).
type homeSet struct {
	ids  []uint32
	caps []float64
	far  []uint8
}

// keptIDs appends the cluster ids, capacities and distance classes of the
// candidates kept to set's. The capacities are the candidates' ready pods
// when every one reports them; else every candidate counts alike, rather
// than comparing pods with guesses, and it reports alike: their
// capacities are made 1, in their slots too.
func keptIDs(cands []Candidate, kept []int, slots []slot, set homeSet) (_ homeSet, alike bool) {
	start := len(set.caps)
	var least time.Duration
	for _, i := range kept {
		alike = alike || slots[i].capacity <= 0
		set.ids, set.caps = append(set.ids, cands[i].id()), append(set.caps, slots[i].capacity)
		if f := slots[i].floor; f > 0 && (least == 0 || f < least) {
			least = f
		}
	}
	if alike {
		for k, i := range kept {
			slots[i].capacity, set.caps[start+k] = 1, 1
		}
	}
	set.far = distances(kept, slots, least, set.far)
	return set, alike
}

// farStep is the least difference of first-byte floors (the round trip
// and the fastest answer) that makes a cluster further than another:
// apart from distance, floors differ by a few milliseconds of prefill.
const farStep = 25 * time.Millisecond

// distances appends the distance class of each kept candidate to far:
// how many steps its first-byte floor is above the least (least), a step
// being farStep or the least floor if longer, so that clusters under a
// load that slows every answer alike stay alike; 0 when its floor is not
// measured. nil when every class is 0, as when all are near.
func distances(kept []int, slots []slot, least time.Duration, far []uint8) []uint8 {
	step := max(farStep, least)
	start, further := len(far), false
	for _, i := range kept {
		d := uint8(0)
		if f := slots[i].floor; f > 0 {
			d = uint8(min((f-least)/step, 255))
		}
		far, further = append(far, d), further || d > 0
	}
	if !further {
		return nil
	}
	return far[start:]
}

// firstByRendezvous is the index of the cluster of the highest rendezvous
// score for key, skipping index skip; -1 when there is none. Weighted by
// caps, or alike when caps is nil.
func firstByRendezvous(key uint64, ids []uint32, caps []float64, skip int) int {
	first, best := -1, math.Inf(-1)
	for k := range ids {
		w := 1.0
		if caps != nil {
			w = caps[k]
		}
		if r := rendezvous(key, ids[k], w); k != skip && r > best {
			first, best = k, r
		}
	}
	return first
}
