package clusterscore

import (
	"math"
	"slices"

	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// score fills the totals of the kept candidates, and the explanation's
// scores when asked.
// sc is the pick's scratch, which holds the observations and prompt
// matches of more than a handful of candidates (nil for a handful).
func (p *Pipeline) score(req *Request, cands []Candidate, kept []int, slots []slot, sc *scratch, ex *Explanation) {
	if ex != nil {
		ex.Reports = len(req.ModelBlocks) > 0 && p.needs.Prompt && !p.cfg.IgnorePrefixReports
	}
	var obsBuf [maxStack]Observation
	var matchBuf [maxStack]int
	obs, matched := obsBuf[:0], matchBuf[:0]
	if len(kept) > maxStack {
		// Grown to fit, so that what is appended stays in the scratch.
		sc.obs, sc.matched = slices.Grow(sc.obs[:0], len(kept)), slices.Grow(sc.matched[:0], len(kept))
		obs, matched = sc.obs, sc.matched
	}
	if p.observed || p.yields || p.homes {
		obs = p.mem.Observed.observeKept(req.Scope, cands, kept, obs)
	}
	rel := scoredAgainst{matched: matched[:len(kept)], blocks: len(req.Blocks), q0: float64(max(p.thresholds.SheddableQueueThreshold, 1))}
	if p.yields || p.homes {
		rel.yieldAbove = p.loads(req, cands, kept, slots, obs)
	}
	for _, ws := range p.cfg.Scorers {
		switch ws.Scorer {
		case routingpolicy.ScorePrefixCache:
			p.prefixMatches(req, cands, kept, slots, sc, rel.matched)
		case routingpolicy.ScoreSession:
			rel.pinned = p.mem.Sessions.Cluster(req.Scope, req.Session, req.Now)
		case routingpolicy.ScoreLatency:
			rel.fastest = fastestTTFB(obs)
		case routingpolicy.ScoreInFlight:
			rel.leastInFlight = leastInFlight(obs)
		case routingpolicy.ScoreWeight:
			rel.mostWeight = mostWeight(cands, kept)
		}
	}
	p.addScores(&rel, cands, kept, slots, obs, ex)
}

// scoredAgainst is what the scores of one pick are relative to, found
// once a pick: the prompt blocks each candidate holds (matched, by kept
// index) of blocks, the session's cluster, the fastest first byte, the
// fewest requests in flight, the largest weight, the queue that halves
// the queue score (q0), and the load above which affinity is withheld
// (yieldAbove, with an affinity margin).
type scoredAgainst struct {
	yieldAbove    float64
	matched       []int
	blocks        int
	pinned        string
	fastest       float64
	leastInFlight int64
	mostWeight    int64
	q0            float64
}

// addScores adds each configured scorer's weighted score to the totals of
// the kept candidates, candidate by candidate and in the configuration's
// order, which makes the same sums a pass per scorer made while reading
// each candidate's slot once rather than once a scorer.
func (p *Pipeline) addScores(rel *scoredAgainst, cands []Candidate, kept []int, slots []slot, obs []Observation, ex *Explanation) {
	for k, i := range kept {
		s := &slots[i]
		s.withheld = p.yields && s.busy > rel.yieldAbove
		// Summed in a register and stored once: through the slot, each
		// addition waited for the store of the one before.
		total := s.total
		for _, ws := range p.cfg.Scorers {
			var v float64
			switch ws.Scorer {
			case routingpolicy.ScorePrefixCache:
				s.matched = int32(rel.matched[k])
				if rel.blocks > 0 && !s.withheld {
					v = float64(rel.matched[k]) / float64(rel.blocks)
				}
			case routingpolicy.ScoreSession:
				if rel.pinned != "" && cands[i].Name == rel.pinned && !s.withheld {
					v = 1
				}
			case routingpolicy.ScoreLatency:
				// A cluster not measured yet scores as the fastest, so
				// that it gets measured.
				v = 1
				if t := obs[k].TTFB.Seconds(); t > 0 {
					v = rel.fastest / t
				}
			case routingpolicy.ScoreErrors:
				v = 1 - min(max(obs[k].ErrorRatio, 0), 1)
			case routingpolicy.ScoreInFlight:
				// (least+1)/(own+1): the fewest in flight score 1.
				v = float64(rel.leastInFlight+1) / float64(obs[k].InFlight+1)
			case routingpolicy.ScoreQueue:
				v = 0.5
				if s.measured {
					v = 1 / (1 + float64(s.waiting)/rel.q0)
				}
			case routingpolicy.ScoreKVCache:
				v = 0.5
				if s.measured {
					v = 1 - s.kvCache
				}
			case routingpolicy.ScoreWeight:
				if rel.mostWeight > 0 {
					v = float64(max(cands[i].Weight, 0)) / float64(rel.mostWeight)
				}
			}
			total += ws.Weight * v
			if ex != nil {
				ex.Clusters[i].Scores[ws.Scorer] = v
			}
		}
		s.total = total
	}
}

// yieldAffinity is the rule by which affinity yields to load: the
// prefix-cache and session scores count only for the candidates whose
// load is within the configuration's AffinityMargin of the least loaded
// candidate's; the others score 0 on them and compete on load alone. A
// candidate's load is what the chain picker ranks MetricsBased by: its
// scraped average queue (0 when not measured) plus this sidecar's
// requests in flight to it per ready pod (per pod when the pool metrics
// count them, else for the whole cluster). The in-flight part moves with
// every request, so a cluster that stops answering loses its affinity
// after a few requests queue there, not a scrape or a saturation
// threshold later. It returns the load above which affinity is withheld,
// from the candidates' loads (busy, which loads fills).
func (p *Pipeline) yieldAffinity(cands []Candidate, kept []int, slots []slot) (above float64) {
	least := math.Inf(1)
	for _, i := range kept {
		// A stale candidate comes after the others whatever its load:
		// its load is no yardstick for theirs.
		if !cands[i].Stale {
			least = min(least, slots[i].busy)
		}
	}
	if math.IsInf(least, 1) { // every candidate is stale
		for _, i := range kept {
			least = min(least, slots[i].busy)
		}
	}
	return least + p.cfg.AffinityMargin
}

// loads fills, in one pass over the kept candidates, what the affinity
// margin (busy) and the home bound (homeLoad) read of each, and returns
// the load above which a candidate's affinity is withheld
// (yieldAffinity), which addScores applies.
func (p *Pipeline) loads(req *Request, cands []Candidate, kept []int, slots []slot, obs []Observation) (yieldAbove float64) {
	for k, i := range kept {
		s := &slots[i]
		if p.homes {
			homeLoad(req.Now, s, &obs[k])
		}
		if p.yields {
			queue, pods := 0.0, 1
			if s.measured {
				queue, pods = s.poolQueue, max(s.pods, 1)
			}
			s.busy = queue + float64(obs[k].InFlight)/float64(pods)
		}
	}
	if !p.yields {
		return 0
	}
	return p.yieldAffinity(cands, kept, slots)
}

// prefixMatches writes to matched[k] how many of the request's prompt
// blocks kept[k] is remembered to hold: the longer of what this sidecar
// sent it (its memory) and what its EPP reports its servers hold (its
// prefix summary, read while its pool metrics are fresh), which counts
// the traffic this sidecar does not see. A candidate whose EPP publishes
// no summary is scored on the memory alone.
func (p *Pipeline) prefixMatches(req *Request, cands []Candidate, kept []int, slots []slot, sc *scratch, matched []int) {
	var idBuf [maxStack]uint32
	ids := idBuf[:0]
	if len(kept) > maxStack {
		sc.ids = slices.Grow(sc.ids[:0], len(kept))
		ids = sc.ids
	}
	for _, i := range kept {
		ids = append(ids, cands[i].id())
	}
	p.mem.Prefixes.Match(req.Blocks, ids, matched)
	if len(req.ModelBlocks) == 0 || p.cfg.IgnorePrefixReports {
		return
	}
	for k, i := range kept {
		pm := cands[i].Pool
		if pm == nil || pm.Prefixes == nil || !slots[i].measured {
			slots[i].reported = -1
			continue
		}
		held := min(pm.Prefixes.Held(req.ModelBlocks), len(req.Blocks))
		slots[i].reported = int32(held)
		matched[k] = max(matched[k], held)
	}
}

// fastestTTFB is the least time to first byte measured, in seconds; 0
// when none is. Latency scores are relative to it.
func fastestTTFB(obs []Observation) float64 {
	best := 0.0
	for _, o := range obs {
		if t := o.TTFB.Seconds(); t > 0 && (best == 0 || t < best) {
			best = t
		}
	}
	return best
}

// leastInFlight is the fewest requests in flight from this sidecar to a
// candidate; in-flight scores are relative to it.
func leastInFlight(obs []Observation) int64 {
	least := int64(-1)
	for _, o := range obs {
		if least < 0 || o.InFlight < least {
			least = o.InFlight
		}
	}
	return least
}

// mostWeight is the largest weight of the kept candidates; weight scores
// are relative to it.
func mostWeight(cands []Candidate, kept []int) int64 {
	most := int64(0)
	for _, i := range kept {
		most = max(most, cands[i].Weight)
	}
	return most
}
