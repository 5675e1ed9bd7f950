package clusterscore

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Pipeline is a compiled configuration. It is immutable and safe for
// concurrent use; the state it reads and writes lives in the Memory and
// the Rotation its callers pass.
type Pipeline struct {
	cfg        routingpolicy.Config
	thresholds scheduling.Config
	mem        *Memory
	has        [routingpolicy.NumFilters]bool
	// observed is true when a scorer reads the Observer.
	observed bool
	// inFlightQueue: the chain picker adds the in-flight counts to the
	// scraped queue (rankMeasured).
	inFlightQueue bool
	// yields: an affinity scorer is configured with a margin, so affinity
	// counts only for the candidates near the least load (yieldAffinity).
	yields bool
	// homes: requests are placed on their home cluster within the load
	// bound (leadHome).
	homes bool
	// needs is what Pick reads besides the candidates' names, weights and
	// health.
	needs      Needs
	schedulers sync.Pool
	// scratches are the scratch spaces of large picks (scratch).
	scratches sync.Pool
	// intN breaks ties and draws two choices: rand.IntN, or a seeded
	// source where a test replays a workload.
	intN func(n int) int
}

// New compiles a configuration. thresholds are the filter chain's:
// saturation is its "has capacity" for sheddable requests, freshness its
// staleness bound. mem holds the affinity and observations; it may be nil
// only when no scorer needs it.
func New(cfg routingpolicy.Config, thresholds scheduling.Config, mem *Memory) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cluster scoring %s: %w", cfg.Name, err)
	}
	if err := thresholds.Validate(); err != nil {
		return nil, fmt.Errorf("cluster scoring %s: %w", cfg.Name, err)
	}
	p := &Pipeline{cfg: cfg, thresholds: thresholds, mem: mem, needs: needsOf(cfg), intN: rand.IntN}
	for _, f := range cfg.Filters {
		p.has[f] = true
	}
	for _, s := range cfg.Scorers {
		switch s.Scorer {
		case routingpolicy.ScorePrefixCache, routingpolicy.ScoreSession, routingpolicy.ScoreLatency, routingpolicy.ScoreErrors, routingpolicy.ScoreInFlight:
			if mem == nil {
				return nil, fmt.Errorf("cluster scoring %s: scorer %v needs the affinity memory", cfg.Name, s.Scorer)
			}
			p.observed = p.observed || s.Scorer >= routingpolicy.ScoreLatency
			p.yields = p.yields || (s.Scorer <= routingpolicy.ScoreSession && cfg.AffinityMargin >= 0)
			p.inFlightQueue = p.inFlightQueue || (s.Scorer == routingpolicy.ScoreInFlight && cfg.Picker == routingpolicy.PickChain)
		}
	}
	if p.homes = cfg.HomeBound > 0; p.homes {
		if mem == nil || (cfg.Picker != routingpolicy.PickMaxScore && cfg.Picker != routingpolicy.PickTwoChoices) || len(cfg.Scorers) == 0 {
			return nil, fmt.Errorf("cluster scoring %s: a home bound needs the affinity memory, a scorer and the max-score or two-choices picker", cfg.Name)
		}
	}
	p.schedulers.New = func() any { return scheduling.New(thresholds, nil) }
	p.scratches.New = func() any { return &scratch{} }
	return p, nil
}

// scratch is the space of a pick over more candidates than fit on the
// stack (maxStack), reused across picks so that one over a thousand
// candidates does not allocate and clear it anew each time.
type scratch struct {
	slots []slot
	// byRank, keys and runs are sortRanked's, which its sorts by total
	// reuse.
	byRank []int32
	keys   []uint64
	runs   []int
	// which is sortByFewTotals': each candidate's value.
	which []uint8
	// obs, ids, matched, caps and far are the scorers' and home
	// placement's, one per kept candidate.
	obs     []Observation
	ids     []uint32
	matched []int
	caps    []float64
	far     []uint8
	// shares are a sampled pick's capacities by candidate index
	// (capacityShares).
	shares []float64
}

// scratch returns a scratch for n candidates, its slots as the last pick
// left them: the filters start each candidate's slot anew (classify). The
// caller puts it back in p.scratches once the pick is done.
func (p *Pipeline) scratch(n int) *scratch {
	sc := p.scratches.Get().(*scratch)
	if cap(sc.slots) < n {
		sc.slots = make([]slot, 0, n)
	}
	return sc
}

// Needs are what a pipeline reads besides the candidates' names, weights
// and health, so that its caller gathers only what some pipeline in use
// reads.
type Needs struct {
	// Criticality: the request's criticality (Request.Criticality), which
	// costs the caller a parse of the body.
	Criticality bool
	// PoolMetrics: the pool gauges of the candidates' EPPs
	// (Candidate.Pool), which cost a scrape per cluster.
	PoolMetrics bool
	// Prompt: the prompt blocks of the body (the prefix-cache scorer),
	// which cost a parse of the body.
	Prompt bool
	// Session: the request's session key (the session scorer).
	Session bool
	// Opens: whether the request opens a conversation (Request.Opens,
	// home placement), which costs a walk of its messages.
	Opens bool
	// Observed: the caller's own observations of each attempt (requests
	// in flight, time to first byte, errors) in the Memory.
	Observed bool
}

// needsOf is what a pipeline of cfg reads.
func needsOf(cfg routingpolicy.Config) Needs {
	var n Needs
	n.Criticality = cfg.Has(routingpolicy.FilterSaturation) || cfg.Picker == routingpolicy.PickChain
	n.PoolMetrics = cfg.Has(routingpolicy.FilterSaturation) || cfg.Has(routingpolicy.FilterReady) || cfg.Picker == routingpolicy.PickChain
	n.Opens = cfg.HomeBound > 0
	for _, sc := range cfg.Scorers {
		switch sc.Scorer {
		case routingpolicy.ScorePrefixCache:
			n.Prompt = true
		case routingpolicy.ScoreSession:
			n.Session = true
		case routingpolicy.ScoreLatency, routingpolicy.ScoreErrors, routingpolicy.ScoreInFlight:
			n.Observed = true
		case routingpolicy.ScoreQueue, routingpolicy.ScoreKVCache:
			n.PoolMetrics = true
		}
	}
	return n
}

// Needs says what Pick reads besides the candidates' names, weights and
// health.
func (p *Pipeline) Needs() Needs { return p.needs }

// ReadsPool says whether Pick reads the candidates' pool metrics
// (Candidate.Pool) at all: what Needs.PoolMetrics asks to be scraped, and
// also the affinity margin's and the home bound's loads, which read the
// metrics when some other policy has them scraped. A caller leaves Pool
// nil, and spares itself the lookup, only when this is false.
func (p *Pipeline) ReadsPool() bool { return p.needs.PoolMetrics || p.yields || p.homes }

// Config returns the configuration the pipeline was compiled from.
func (p *Pipeline) Config() routingpolicy.Config { return p.cfg }

// Memory returns the memory the pipeline reads; nil when it needs none.
func (p *Pipeline) Memory() *Memory { return p.mem }

// maxStack is how many candidates a pick handles without allocating its
// scratch space.
const maxStack = 16

// slot is the scratch of one candidate during a pick. Over a thousand
// candidates the passes of a pick were bound by loading slots rather than
// by what they computed, so a slot is two cache lines, the first holding
// what the filters, the scorers and the sort read.
type slot struct {
	verdict Verdict
	tier    int8
	// measured: the candidate's pool metrics are fresh (classify), so
	// that the scorers need not ask again.
	measured bool
	// withheld means the candidate's load (busy) is beyond the affinity
	// margin, so its affinity does not count.
	withheld bool
	// full: its pool metrics say every batch place of its servers is
	// taken (homeBound.filled).
	full  bool
	total float64
	// waiting and kvCache are its measured pool's waiting queue (rounded,
	// and with the chain picker the requests in flight per pod added) and
	// KV cache usage, as the filter chain ranks them (rankRun).
	waiting int
	kvCache float64
	// poolQueue and pods are the measured pool's average queue (0 when
	// negative) and ready pods; zero when not measured. Kept by classify
	// so that the affinity margin and the home bound read them here
	// rather than through the pool's pointer.
	poolQueue float64
	pods      int
	// busy is the candidate's load for the affinity margin (queue plus
	// in flight per ready pod).
	busy float64
	// homeLoad and capacity are the candidate's load (requests) and
	// capacity (ready pods) for the home bound (leadHome); queue its
	// scraped waiting queue per server, -1 when not measured (homeBound.queued);
	// awaiting this sidecar's requests to it still waiting for their
	// first byte (homeBound.noWait); awaited and due how long the
	// longest of those has waited and may wait (homeBound.overdue).
	homeLoad, capacity, queue float64
	awaiting                  int64
	awaited, due              time.Duration
	// ttfb is its first bytes' moving average (homeBound.filled), floor
	// their settled floor (Observation.TTFBFloor; its distance class,
	// keptIDs).
	ttfb, floor time.Duration
	// reported is how many leading blocks of the request its EPP reports
	// its servers hold (its prefix summary), when its pool metrics are
	// fresh; -1 when it reports none (prefixMatches).
	reported int32
	// matched is how many leading blocks of the request it holds, as the
	// prefix-cache scorer found (the sidecar's memory, or its EPP's
	// report); 0 without that scorer. A slot is 128 bytes, so that no
	// slot of a pick's array straddles a third cache line.
	matched int32
}

// Pick orders the candidates for one request: the request goes to the
// first, and to the next ones in turn when an EPP fails before answering.
// The indices into cands are appended to order (pass a reused slice to
// avoid allocating). Candidates left out are not tried. An empty order
// means none can take the request; ErrShed that a sheddable request is
// shed.
//
// rot is the backend's rotation, made for these candidates (NewRotation);
// it is needed by the round-robin and chain pickers only. ex, when not nil,
// is filled with the reasons (Explanation); nil costs nothing.
func (p *Pipeline) Pick(req *Request, cands []Candidate, rot *Rotation, order []int, ex *Explanation) ([]int, error) {
	var buf [maxStack]slot
	slots := buf[:0]
	var sc *scratch
	if len(cands) > maxStack {
		sc = p.scratch(len(cands))
		defer p.scratches.Put(sc)
		slots = sc.slots
	}
	slots = slots[:len(cands)]
	if ex != nil {
		ex.reset(p, cands)
	}
	req.Home, req.LastResort = HomeDecision{}, false
	start := len(order)
	shedding := req.Criticality == scheduling.Sheddable && p.has[routingpolicy.FilterSaturation]
	order, anySaturated := p.filter(req, cands, slots, shedding, order)
	kept := order[start:]
	if len(kept) == 0 && anySaturated && !p.localLeads(cands) {
		if ex != nil {
			ex.fill(slots)
		}
		return order, ErrShed
	}
	if len(kept) > 0 && len(p.cfg.Scorers) > 0 {
		p.score(req, cands, kept, slots, sc, ex)
	}
	o := orderer{p: p, cands: cands, slots: slots, sc: sc}
	o.sort(kept)
	if req.Sampled && len(kept) > 0 && slots[kept[0]].tier != 0 {
		// The sample's best is saturated or stale: whether another
		// candidate is not, only every candidate tells (Sample).
		if ex != nil {
			ex.fill(slots)
		}
		return order[:start], nil
	}
	var home HomeDecision
	if p.homes && len(kept) > 0 {
		home = p.leadHome(req, cands, kept, slots, sc, rot)
	}
	if len(kept) > 0 {
		if home.Home == "" {
			o.lead(kept, rot)
		}
		if p.cfg.Picker == routingpolicy.PickChain {
			p.rankMeasured(req, cands, kept, slots)
		}
	}
	if p.has[routingpolicy.FilterLocalFirst] {
		order = p.localFirst(cands, order, start, req.LastResort)
	}
	req.Home = home
	if ex != nil {
		ex.fill(slots)
		ex.Home, ex.LastResort = home, req.LastResort
	}
	return order, nil
}

// filter classifies every candidate and appends the kept ones to order,
// the ejected ones too when no other is kept (keepEjected); anySaturated
// says whether a sheddable request found a saturated candidate.
func (p *Pipeline) filter(req *Request, cands []Candidate, slots []slot, shedding bool, order []int) (_ []int, anySaturated bool) {
	start, anyEjected, anyDraining := len(order), false, false
	since := p.freshSince(req.Now)
	for i := range cands {
		s := &slots[i]
		p.classify(&cands[i], since, false, s)
		if s.verdict == DroppedSaturated && !shedding {
			s.verdict = Kept
		}
		if s.verdict == Kept && cands[i].Draining && !p.holds(req, &cands[i]) {
			s.verdict = DroppedDraining
		}
		anySaturated = anySaturated || s.verdict == DroppedSaturated
		anyEjected = anyEjected || s.verdict == DroppedEjected
		anyDraining = anyDraining || s.verdict == DroppedDraining
		if s.verdict == Kept {
			order = append(order, i)
		}
	}
	// A sample that keeps none is no answer (Sample): the draining and
	// ejected candidates are kept only when every candidate was read.
	if len(order) == start && anyDraining && !req.Sampled {
		order = keepDraining(slots, order)
	}
	if len(order) == start && anyEjected && !req.Sampled {
		order = p.keepEjected(req, cands, slots, shedding, order)
	}
	return order, anySaturated
}

// keepEjected classifies the ejected candidates again as if they were
// not ejected, when the filters kept no other: the request goes to those
// the other filters keep (req.LastResort) rather than to none.
func (p *Pipeline) keepEjected(req *Request, cands []Candidate, slots []slot, shedding bool, order []int) []int {
	since := p.freshSince(req.Now)
	for i := range cands {
		s := &slots[i]
		if s.verdict != DroppedEjected {
			continue
		}
		p.classify(&cands[i], since, true, s)
		if s.verdict == DroppedSaturated && !shedding {
			s.verdict = Kept
		}
		if s.verdict == Kept {
			order = append(order, i)
			req.LastResort = true
		}
	}
	return order
}

// classify runs the filters on one candidate and finds its tier; an
// ejected candidate is dropped unless lastResort, when it is classified
// as a serving one. since is the staleness bound of the pick's time
// (freshSince).
func (p *Pipeline) classify(c *Candidate, since freshBound, lastResort bool, s *slot) {
	measured := since.fresh(c.Pool)
	// The slot starts anew here, in the pass that first touches it,
	// rather than in a pass of its own that cleared every slot before.
	*s = slot{measured: measured}
	if measured {
		s.waiting = int(math.Round(min(max(c.Pool.AverageQueue, 0), 1<<30)))
		s.kvCache = min(max(c.Pool.AverageKVCache, 0), 1)
		s.poolQueue, s.pods, s.full = max(c.Pool.AverageQueue, 0), c.Pool.ReadyPods, c.Pool.BatchFull()
	}
	saturated := measured && (s.waiting > p.thresholds.SheddableQueueThreshold ||
		s.kvCache > p.thresholds.SheddableKVCacheThreshold)
	switch {
	case c.Health == HealthEjected && !lastResort:
		s.verdict = DroppedEjected
	case p.has[routingpolicy.FilterHealth] && c.Health == HealthNotServing:
		s.verdict = DroppedNotServing
	case p.has[routingpolicy.FilterReady] && c.NotReady:
		s.verdict = DroppedNotReady
	case p.has[routingpolicy.FilterReady] && measured && c.Pool.ReadyPods == 0:
		s.verdict = DroppedNoReadyPods
	case p.has[routingpolicy.FilterWeight] && c.Weight <= 0:
		s.verdict = DroppedWeight
	case p.has[routingpolicy.FilterModel] && c.ModelUnavailable:
		s.verdict = DroppedModel
	case p.has[routingpolicy.FilterSaturation] && saturated:
		s.verdict = DroppedSaturated
	default:
		s.verdict = Kept
	}
	unknown := int8(0)
	if p.has[routingpolicy.FilterHealth] && c.Health == HealthUnknown {
		unknown = 1
	}
	sat := int8(0)
	if p.has[routingpolicy.FilterSaturation] && saturated {
		sat = 1
	}
	switch p.cfg.Picker {
	case routingpolicy.PickRoundRobin:
		s.tier = 2*sat + unknown
	case routingpolicy.PickChain:
		// Measured with capacity, unmeasured serving, unmeasured of
		// unknown health, measured saturated (MetricsBased).
		switch {
		case !measured:
			s.tier = 1 + unknown
		case sat == 1:
			s.tier = 3
		default:
			s.tier = 0
		}
	default:
		s.tier = sat
	}
	if c.Stale {
		s.tier += staleTiers
	}
}

// staleTiers puts stale candidates after every other tier (the pickers'
// tiers are 0 to 3), in the same order among themselves.
const staleTiers = 4

// freshBound is the staleness bound of pool metrics at one time: the
// oldest update that is still fresh, when there is a bound at all. A pick
// computes it once rather than once a candidate.
type freshBound struct {
	bounded bool
	oldest  time.Time
}

// freshSince is the staleness bound at now.
func (p *Pipeline) freshSince(now time.Time) freshBound {
	if p.thresholds.MetricsStaleness <= 0 {
		return freshBound{}
	}
	return freshBound{bounded: true, oldest: now.Add(-p.thresholds.MetricsStaleness)}
}

// fresh reports whether pool metrics are known: present, comparable and
// younger than the staleness bound.
func (b freshBound) fresh(m *PoolMetrics) bool {
	return m != nil && !math.IsNaN(m.AverageKVCache) && !math.IsNaN(m.AverageQueue) &&
		(!b.bounded || !m.UpdatedAt.Before(b.oldest))
}

// rotates reports whether a tier is ordered by weight, its lead picked by
// the rotation.
func (p *Pipeline) rotates(tier int8) bool {
	tier %= staleTiers
	return p.cfg.Picker == routingpolicy.PickRoundRobin || (p.cfg.Picker == routingpolicy.PickChain && (tier == 1 || tier == 2))
}

// localLeads reports whether FilterLocalFirst will put a local candidate
// first, so that the request is not shed.
func (p *Pipeline) localLeads(cands []Candidate) bool {
	if !p.has[routingpolicy.FilterLocalFirst] {
		return false
	}
	for i := range cands {
		if cands[i].Local && cands[i].Health != HealthNotServing && cands[i].Health != HealthEjected {
			return true
		}
	}
	return false
}

// localFirst moves the local candidate to the front of order[start:]
// while its EPP is not known to be failing and it is not ejected (unless
// ejected ones are the last resort), and leaves it out otherwise.
func (p *Pipeline) localFirst(cands []Candidate, order []int, start int, lastResort bool) []int {
	local := slices.IndexFunc(cands, func(c Candidate) bool { return c.Local })
	if local < 0 {
		return order
	}
	if i := slices.Index(order[start:], local); i >= 0 {
		order = slices.Delete(order, start+i, start+i+1)
	}
	if cands[local].Health == HealthNotServing || (cands[local].Health == HealthEjected && !lastResort) || cands[local].ModelUnavailable {
		return order
	}
	return slices.Insert(order, start, local)
}

// rankMeasured reorders each run of measured candidates (tiers 0 and 3 of
// the chain picker) in the order the filter chain picks them, each pick
// among those left.
//
// With the in-flight scorer configured, the queue the chain sees is the
// scraped one plus this sidecar's requests in flight to the candidate per
// ready pod: the scraped queue changes once a scrape, the in-flight count
// with every request, so that requests between two scrapes do not all go
// to the candidate that was least loaded at the last one (herding). The
// tiers (saturation) stay the scraped metrics' alone.
func (p *Pipeline) rankMeasured(req *Request, cands []Candidate, kept []int, slots []slot) {
	s := p.schedulers.Get().(*scheduling.Scheduler)
	defer p.schedulers.Put(s)
	r := scheduling.Request{Criticality: req.Criticality}
	if p.inFlightQueue {
		for _, i := range kept {
			if slots[i].tier == 1 || slots[i].tier == 2 || cands[i].Pool == nil {
				continue
			}
			n := p.mem.Observed.Observe(req.Scope, cands[i].Name).InFlight
			slots[i].waiting += int((n + int64(max(cands[i].Pool.ReadyPods, 1)) - 1) / int64(max(cands[i].Pool.ReadyPods, 1)))
		}
	}
	for lo := 0; lo < len(kept); {
		tier := slots[kept[lo]].tier
		hi := lo + 1
		for hi < len(kept) && slots[kept[hi]].tier == tier {
			hi++
		}
		if !p.rotates(tier) {
			rankRun(s, r, kept[lo:hi], cands, slots, req.Now)
		}
		lo = hi
	}
}

// load is the candidate's load as the filter chain ranks it, updated
// when its pool metrics were (never when not measured).
func (s *slot) load(c *Candidate) scheduling.Metrics {
	m := scheduling.Metrics{WaitingQueue: s.waiting, KVCacheUsage: s.kvCache}
	if s.measured {
		m.UpdatedAt = c.Pool.UpdatedAt
	}
	return m
}

func rankRun(s *scheduling.Scheduler, r scheduling.Request, run []int, cands []Candidate, slots []slot, now time.Time) {
	// The scheduler keeps what it is given out of sight of escape
	// analysis: copies of the loads go to it, so that the pick's scratch
	// stays on the stack for the other pickers.
	values := make([]scheduling.Metrics, len(run))
	load, rest := make([]*scheduling.Metrics, 0, len(run)), make([]int, 0, len(run))
	for k, i := range run {
		values[k] = slots[i].load(&cands[i])
		load, rest = append(load, &values[k]), append(rest, i)
	}
	for k := range run {
		j, err := s.Schedule(r, load, now)
		if err != nil {
			// Not expected: a sheddable request only reaches measured
			// candidates with capacity. The rest keep their order.
			copy(run[k:], rest)
			return
		}
		run[k] = rest[j]
		rest, load = slices.Delete(rest, j, j+1), slices.Delete(load, j, j+1)
	}
}

// orderer sorts kept candidates: by tier, then by total (scored tiers) or
// weight (rotating tiers), then by name.
type orderer struct {
	p     *Pipeline
	cands []Candidate
	slots []slot
	// sc is the pick's scratch, nil for a handful of candidates.
	sc *scratch
}

func (o *orderer) less(a, b int) bool {
	sa, sb := &o.slots[a], &o.slots[b]
	if sa.tier != sb.tier {
		return sa.tier < sb.tier
	}
	if !o.p.rotates(sa.tier) && sa.total != sb.total {
		return sa.total > sb.total
	}
	if wa, wb := o.cands[a].Weight, o.cands[b].Weight; wa != wb {
		return wa > wb
	}
	return strings.Compare(o.cands[a].Name, o.cands[b].Name) < 0
}

// sort sorts idx stably: an insertion sort for a handful of candidates
// (no closure to allocate); beyond, in linear time where the candidates
// are ranked (sortRanked), else pdqsort with the index as the last key,
// or a merge sort where that would not be the same order (weakOrder).
// The insertion sort's quadratic cost took most of a pick over 1,000
// candidates, and pdqsort's comparisons of names and totals through the
// slots a quarter of it.
func (o *orderer) sort(idx []int) {
	if len(idx) > maxStack {
		if o.sc != nil && o.sortRanked(idx, o.sc) {
			return
		}
		if o.weakOrder(idx) {
			// Equal candidates keep their order by the index tie-break,
			// as the stable sort keeps it, at the cost of pdqsort.
			slices.SortFunc(idx, func(a, b int) int { return cmp.Or(o.compare(a, b), cmp.Compare(a, b)) })
			return
		}
		slices.SortStableFunc(idx, o.compare)
		return
	}
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && o.less(idx[j], idx[j-1]); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}

// weakOrder reports whether idx is ascending and compare orders its
// candidates consistently (no total is NaN, which compare finds equal to
// every other): then sorting with the index as the last key orders them
// as the stable sort does.
func (o *orderer) weakOrder(idx []int) bool {
	for k, i := range idx {
		if math.IsNaN(o.slots[i].total) || (k > 0 && idx[k-1] >= i) {
			return false
		}
	}
	return true
}

// compare is less as a three-way comparison, in one pass over the keys:
// -1 where less(a, b), 1 where less(b, a), else 0.
func (o *orderer) compare(a, b int) int {
	sa, sb := &o.slots[a], &o.slots[b]
	switch {
	case sa.tier != sb.tier:
		return cmp.Compare(sa.tier, sb.tier)
	case !o.p.rotates(sa.tier) && sa.total != sb.total:
		// Totals that are not comparable (NaN) are equal here, as they
		// are to less.
		switch {
		case sa.total > sb.total:
			return -1
		case sb.total > sa.total:
			return 1
		}
		return 0
	}
	if wa, wb := o.cands[a].Weight, o.cands[b].Weight; wa != wb {
		return -cmp.Compare(wa, wb)
	}
	return strings.Compare(o.cands[a].Name, o.cands[b].Name)
}

// lead chooses the first candidate among those of the first tier and moves
// it to the front, the others keeping their order.
func (o *orderer) lead(kept []int, rot *Rotation) {
	tier := o.slots[kept[0]].tier
	n := 1
	for n < len(kept) && o.slots[kept[n]].tier == tier {
		n++
	}
	first := 0
	switch {
	case o.p.rotates(tier):
		if rot == nil {
			return
		}
		i := rot.next(func(i int) bool { return i < len(o.slots) && o.slots[i].verdict == Kept && o.slots[i].tier == tier })
		if first = slices.Index(kept[:n], i); first < 0 {
			return
		}
	case o.p.cfg.Picker == routingpolicy.PickMaxScore:
		// Ties at the top are broken at random, so that requests between
		// two metric scrapes do not all go to the same candidate.
		top := 1
		for top < n && o.slots[kept[top]].total == o.slots[kept[0]].total {
			top++
		}
		first = o.p.intN(top)
	case o.p.cfg.Picker == routingpolicy.PickTwoChoices:
		if n > 1 {
			a := o.p.intN(n)
			b := o.p.intN(n - 1)
			if b >= a {
				b++
			}
			// On equal totals the first draw stays: either is fair.
			first = a
			if o.slots[kept[b]].total > o.slots[kept[a]].total {
				first = b
			}
		}
	}
	if first > 0 {
		c := kept[first]
		copy(kept[1:first+1], kept[:first])
		kept[0] = c
	}
}
