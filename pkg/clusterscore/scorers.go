package clusterscore

import (
	"math"
	"slices"

	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// score fills the totals of the kept candidates, and the explanation's
// scores when asked.
// sc is the pick's scratch, which holds the observations and scores of
// more than a handful of candidates (nil for a handful).
func (p *Pipeline) score(req *Request, cands []Candidate, kept []int, slots []slot, sc *scratch, ex *Explanation) {
	var obsBuf [maxStack]Observation
	var valBuf [maxStack]float64
	obs, val := obsBuf[:0], valBuf[:0]
	if len(kept) > maxStack {
		// Grown to fit, so that what is appended stays in the scratch.
		sc.obs, sc.val = slices.Grow(sc.obs[:0], len(kept)), slices.Grow(sc.val[:0], len(kept))
		obs, val = sc.obs, sc.val
	}
	val = val[:len(kept)]
	if p.observed || p.yields || p.homes {
		obs = p.mem.Observed.observeKept(req.Scope, cands, kept, obs)
	}
	if p.yields {
		p.yieldAffinity(req, cands, kept, slots, obs)
	}
	if p.homes {
		p.homeLoad(req, cands, kept, slots, obs)
	}
	for _, ws := range p.cfg.Scorers {
		p.scoreOne(ws.Scorer, req, cands, kept, slots, sc, obs, val)
		for k, i := range kept {
			slots[i].total += ws.Weight * val[k]
			if ex != nil {
				ex.Clusters[i].Scores[ws.Scorer] = val[k]
			}
		}
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
// threshold later.
func (p *Pipeline) yieldAffinity(req *Request, cands []Candidate, kept []int, slots []slot, obs []Observation) {
	least := math.Inf(1)
	for k, i := range kept {
		queue, pods := 0.0, 1
		if c := &cands[i]; slots[i].measured {
			queue, pods = max(c.Pool.AverageQueue, 0), max(c.Pool.ReadyPods, 1)
		}
		slots[i].busy = queue + float64(obs[k].InFlight)/float64(pods)
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
	for _, i := range kept {
		slots[i].withheld = slots[i].busy > least+p.cfg.AffinityMargin
	}
}

// scoreOne writes one scorer's score of kept[k] to val[k].
func (p *Pipeline) scoreOne(s routingpolicy.Scorer, req *Request, cands []Candidate, kept []int, slots []slot, sc *scratch, obs []Observation, val []float64) {
	switch s {
	case routingpolicy.ScorePrefixCache:
		p.prefixCacheScores(req, cands, kept, slots, sc, val)
	case routingpolicy.ScoreSession:
		pinned := p.mem.Sessions.Cluster(req.Scope, req.Session, req.Now)
		for k, i := range kept {
			val[k] = 0
			if pinned != "" && cands[i].Name == pinned && !slots[i].withheld {
				val[k] = 1
			}
		}
	case routingpolicy.ScoreLatency:
		latencyScores(obs, val)
	case routingpolicy.ScoreErrors:
		for k, o := range obs {
			val[k] = 1 - min(max(o.ErrorRatio, 0), 1)
		}
	case routingpolicy.ScoreInFlight:
		inFlightScores(obs, val)
	case routingpolicy.ScoreQueue:
		q0 := float64(max(p.thresholds.SheddableQueueThreshold, 1))
		for k, i := range kept {
			val[k] = 0.5
			if slots[i].measured {
				val[k] = 1 / (1 + float64(slots[i].load.WaitingQueue)/q0)
			}
		}
	case routingpolicy.ScoreKVCache:
		for k, i := range kept {
			val[k] = 0.5
			if slots[i].measured {
				val[k] = 1 - slots[i].load.KVCacheUsage
			}
		}
	case routingpolicy.ScoreWeight:
		weightScores(cands, kept, val)
	}
}

// prefixCacheScores: the share of the request's prompt blocks that each
// candidate is remembered to hold, 0 where affinity is withheld.
func (p *Pipeline) prefixCacheScores(req *Request, cands []Candidate, kept []int, slots []slot, sc *scratch, val []float64) {
	var idBuf [maxStack]uint32
	var matchBuf [maxStack]int
	ids, matched := idBuf[:0], matchBuf[:0]
	if len(kept) > maxStack {
		sc.ids, sc.matched = slices.Grow(sc.ids[:0], len(kept)), slices.Grow(sc.matched[:0], len(kept))
		ids, matched = sc.ids, sc.matched
	}
	for _, i := range kept {
		ids = append(ids, cands[i].id())
	}
	matched = matched[:len(kept)]
	p.mem.Prefixes.Match(req.Blocks, ids, matched)
	for k, i := range kept {
		val[k] = 0
		if len(req.Blocks) > 0 && !slots[i].withheld {
			val[k] = float64(matched[k]) / float64(len(req.Blocks))
		}
	}
}

// latencyScores are relative to the fastest; a cluster not measured yet
// scores as the fastest, so that it gets measured.
func latencyScores(obs []Observation, val []float64) {
	best := 0.0
	for _, o := range obs {
		if t := o.TTFB.Seconds(); t > 0 && (best == 0 || t < best) {
			best = t
		}
	}
	for k, o := range obs {
		val[k] = 1
		if t := o.TTFB.Seconds(); t > 0 {
			val[k] = best / t
		}
	}
}

// inFlightScores favour the candidates with the fewest requests in flight
// from this sidecar: (least+1)/(own+1).
func inFlightScores(obs []Observation, val []float64) {
	least := int64(-1)
	for _, o := range obs {
		if least < 0 || o.InFlight < least {
			least = o.InFlight
		}
	}
	for k, o := range obs {
		val[k] = float64(least+1) / float64(o.InFlight+1)
	}
}

// weightScores are the candidates' weights relative to the largest.
func weightScores(cands []Candidate, kept []int, val []float64) {
	most := int64(0)
	for _, i := range kept {
		most = max(most, cands[i].Weight)
	}
	for k, i := range kept {
		val[k] = 0
		if most > 0 {
			val[k] = float64(max(cands[i].Weight, 0)) / float64(most)
		}
	}
}
