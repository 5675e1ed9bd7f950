package scheduling

// The filters of seed 001. Each reads the current set (s.cur, indices into
// cands, all with fresh metrics), appends the survivors to s.spare and calls
// s.keep. Filters are plain loops rather than predicates passed as funcs so a
// decision stays free of allocations and indirect calls.

// lowQueue keeps candidates whose queue is below LowQueueThreshold. No
// fallback of its own: when it lets nothing through, Schedule takes the
// "everyone is queuing" branch of the decision tree with the set unchanged.
func (s *Scheduler) lowQueue(cands []*Metrics) bool {
	for _, i := range s.cur {
		if cands[i].WaitingQueue < s.cfg.LowQueueThreshold {
			s.spare = append(s.spare, i)
		}
	}
	return s.keep()
}

// hasCapacity keeps candidates that can take a sheddable request without
// hurting critical ones. No fallback: an empty result drops the request, which
// is the point of shedding.
func (s *Scheduler) hasCapacity(cands []*Metrics) bool {
	for _, i := range s.cur {
		m := cands[i]
		if m.WaitingQueue <= s.cfg.SheddableQueueThreshold && m.KVCacheUsage <= s.cfg.SheddableKVCacheThreshold {
			s.spare = append(s.spare, i)
		}
	}
	return s.keep()
}

// lora prefers candidates that already have the adapter (loaded or being
// loaded), else candidates with a free adapter slot. If neither exists every
// candidate would have to evict an adapter, which costs the same everywhere,
// so the set is kept whole rather than failing a request that any candidate
// can serve. A request for the base model has no preference.
func (s *Scheduler) lora(cands []*Metrics, adapter string) {
	if adapter == "" {
		return
	}
	for _, i := range s.cur {
		if cands[i].hasAdapter(adapter) {
			s.spare = append(s.spare, i)
		}
	}
	if s.keep() {
		return
	}
	for _, i := range s.cur {
		if cands[i].canLoadAdapter() {
			s.spare = append(s.spare, i)
		}
	}
	s.keep()
}

// leastQueue keeps candidates in the first segment of the queue range: with
// n candidates, min and max their queues, those with
//
//	queue <= min + (max-min)/n
//
// The bound is inclusive, which is what makes seed 001's Example 3 come out
// as written (queues 70, 80, 65: bound 65 + 15/3 = 70, so A (70) and C (65)
// pass, B (80) does not). (max-min)/n is integer division; since queues are
// integers this keeps exactly the candidates the real-valued bound keeps.
// Spreading over the low segment rather than taking the single minimum leaves
// the next filters a choice. It never empties the set: the minimum passes.
func (s *Scheduler) leastQueue(cands []*Metrics) {
	if len(s.cur) < 2 {
		return
	}
	lo, hi := cands[s.cur[0]].WaitingQueue, cands[s.cur[0]].WaitingQueue
	for _, i := range s.cur[1:] {
		q := cands[i].WaitingQueue
		lo, hi = min(lo, q), max(hi, q)
	}
	bound := lo + (hi-lo)/len(s.cur)
	for _, i := range s.cur {
		if cands[i].WaitingQueue <= bound {
			s.spare = append(s.spare, i)
		}
	}
	s.keep()
}

// leastKVCache is leastQueue over KV cache usage, with a real-valued bound
// min + (max-min)/n, inclusive. It never empties the set.
func (s *Scheduler) leastKVCache(cands []*Metrics) {
	if len(s.cur) < 2 {
		return
	}
	lo, hi := cands[s.cur[0]].KVCacheUsage, cands[s.cur[0]].KVCacheUsage
	for _, i := range s.cur[1:] {
		u := cands[i].KVCacheUsage
		lo, hi = min(lo, u), max(hi, u)
	}
	bound := lo + (hi-lo)/float64(len(s.cur))
	for _, i := range s.cur {
		if cands[i].KVCacheUsage <= bound {
			s.spare = append(s.spare, i)
		}
	}
	s.keep()
}

// prefix keeps the candidates that hold the longest prefix of the request's
// prompt (match, parallel to cands), among those it may prefer: at most
// PrefixQueueMargin more waiting requests than the least queued current
// candidate, and a KV cache at most SheddableKVCacheThreshold (a full cache
// evicts what it holds). When no such candidate holds any of the prefix
// the set is kept whole: there is nothing to be near.
func (s *Scheduler) prefix(cands []*Metrics, match []int) {
	if s.cfg.PrefixQueueMargin < 0 || len(match) != len(cands) || len(s.cur) < 2 {
		return
	}
	least := cands[s.cur[0]].WaitingQueue
	for _, i := range s.cur[1:] {
		least = min(least, cands[i].WaitingQueue)
	}
	eligible := func(i int) bool {
		m := cands[i]
		return m.WaitingQueue <= least+s.cfg.PrefixQueueMargin && m.KVCacheUsage <= s.cfg.SheddableKVCacheThreshold
	}
	best := 0
	for _, i := range s.cur {
		if match[i] > best && eligible(i) {
			best = match[i]
		}
	}
	if best == 0 {
		return
	}
	for _, i := range s.cur {
		if match[i] == best && eligible(i) {
			s.spare = append(s.spare, i)
		}
	}
	s.keep()
}
