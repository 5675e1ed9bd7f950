package scheduling

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

var (
	// ErrNoCandidates means there was nothing to schedule on. The EPP answers
	// 503.
	ErrNoCandidates = errors.New("no candidates to schedule on")
	// ErrDropped means a sheddable request was shed because no candidate has
	// capacity (or none has known metrics). The EPP answers 429.
	ErrDropped = errors.New("sheddable request dropped: no candidate has capacity")
)

// Scheduler runs the filter chain. It keeps scratch space between decisions so
// that a decision does not allocate; for that reason a Scheduler is not safe
// for concurrent use: give each goroutine its own (they are small) or guard
// one with a mutex.
type Scheduler struct {
	cfg  Config
	rand *rand.Rand
	// cur and spare hold candidate indices; each filter reads cur and writes
	// spare, then they swap.
	cur, spare []int
}

// New returns a scheduler with the given thresholds. src breaks final ties; nil
// means a randomly seeded source. Tests pass a seeded one.
func New(cfg Config, src rand.Source) *Scheduler {
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	return &Scheduler{cfg: cfg, rand: rand.New(src)}
}

// Schedule picks one of cands for req and returns its index. cands[i] are the
// metrics of the caller's candidate i; nil means none are known. now is the
// reference time for staleness.
//
// The chain depends on the criticality (Standard behaves as Critical):
//
//	Critical, Standard: low queue -> LoRA -> prefix -> least queue -> least KV cache,
//	    or, when no candidate has a low queue,
//	    least queue -> LoRA -> prefix -> least KV cache
//	Sheddable:          has capacity -> least queue -> LoRA -> prefix -> least KV cache,
//	    or ErrDropped when no candidate has capacity
//
// and a tie left at the end is broken at random. The prefix filter (an
// addition to seed 001, a no-op without Request.PrefixMatch) comes after
// the filters that guard load and adapters, so that it only ever chooses
// among candidates they accept, and before the least-load narrowing, which
// would otherwise leave it nothing to choose from.
//
// A candidate whose metrics are nil or older than Config.MetricsStaleness is
// unknown: it is not idle, it is unmeasured, so it never wins against a
// candidate with fresh metrics. Metrics with a NaN KV cache usage are unknown
// too: they cannot be compared. When every candidate is unknown there is
// nothing to rank by: a sheddable request is dropped (it is only ever served
// by known spare capacity) and any other request goes to a random candidate,
// which is better than failing a request that may well succeed.
//
// Errors: ErrNoCandidates for an empty cands, ErrDropped for a shed request.
func (s *Scheduler) Schedule(req Request, cands []*Metrics, now time.Time) (int, error) {
	if len(cands) == 0 {
		return -1, ErrNoCandidates
	}
	s.reset(len(cands))
	// Comparing against a precomputed cutoff is several times cheaper per
	// candidate than now.Sub(m.UpdatedAt).
	cutoff := now.Add(-s.cfg.MetricsStaleness)
	for i, m := range cands {
		if s.fresh(m, cutoff) {
			s.spare = append(s.spare, i)
		}
	}
	if !s.keep() {
		if req.Criticality == Sheddable {
			return -1, ErrDropped
		}
		return s.rand.IntN(len(cands)), nil
	}

	if req.Criticality == Sheddable {
		if !s.hasCapacity(cands) {
			return -1, ErrDropped
		}
		s.leastQueue(cands)
		s.lora(cands, req.Adapter)
		s.prefix(cands, req.PrefixMatch)
		s.leastKVCache(cands)
	} else if s.lowQueue(cands) {
		s.lora(cands, req.Adapter)
		s.prefix(cands, req.PrefixMatch)
		s.leastQueue(cands)
		s.leastKVCache(cands)
	} else {
		// Everyone is queuing: the queue matters more than adapter affinity,
		// so narrow by queue first and only then look for a cheap adapter.
		s.leastQueue(cands)
		s.lora(cands, req.Adapter)
		s.prefix(cands, req.PrefixMatch)
		s.leastKVCache(cands)
	}

	if len(s.cur) == 1 {
		return s.cur[0], nil
	}
	return s.cur[s.rand.IntN(len(s.cur))], nil
}

// fresh reports whether m is known: present, comparable and observed no
// earlier than cutoff (now minus the staleness bound).
func (s *Scheduler) fresh(m *Metrics, cutoff time.Time) bool {
	if m == nil || math.IsNaN(m.KVCacheUsage) {
		return false
	}
	return s.cfg.MetricsStaleness <= 0 || !m.UpdatedAt.Before(cutoff)
}

// reset empties the scratch slices, growing them to hold n indices.
func (s *Scheduler) reset(n int) {
	if cap(s.cur) < n {
		s.cur = make([]int, 0, n)
		s.spare = make([]int, 0, n)
	}
	s.cur, s.spare = s.cur[:0], s.spare[:0]
}

// keep makes the indices a filter wrote to spare the current set and reports
// true, or, when the filter let nothing through, leaves the current set as it
// was and reports false. Whether an empty result is a fallback or a failure
// is the caller's decision.
func (s *Scheduler) keep() bool {
	if len(s.spare) == 0 {
		return false
	}
	s.cur, s.spare = s.spare, s.cur[:0]
	return true
}
