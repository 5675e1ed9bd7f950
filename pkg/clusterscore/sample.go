package clusterscore

import (
	"slices"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// A pick over many candidates reads a sample of them. Every step of a
// pick is a pass over its candidates (the filters, the observations, the
// scorers, the home bound, the sort), so its cost grew with them: 140 µs
// at 1,000 candidates, where the request's own parse takes 15. Above
// SampleAbove candidates a scoring pipeline (the max-score and
// two-choices pickers) orders a sample instead, of the candidates it can
// choose for the request:
//
//   - the local candidate;
//   - the first sampleHomes of the request's home key by rendezvous
//     hashing over every candidate, unweighted: its home and the homes it
//     goes to when that one cannot take it, the same for every replica;
//   - the clusters the prefix index remembers serving the prompt's
//     deepest block it holds, and its home key's block;
//   - the cluster the request's session is pinned to;
//   - sampleRandom drawn at random: the power of d choices, which keeps
//     the spread of the load within a few requests of the best of all
//     (Mitzenmacher), so that the load scores and the bound compare the
//     request's candidates with a fair view of the others.
//
// Over the sample, home placement is rendezvous hashing with bounded
// loads, unweighted, as it was before keys were dealt: the deal of the
// established keys and the shares it is dealt in are of the whole set of
// candidates, which a sample does not hold (Request.Sampled).
//
// What the sample leaves out, the pick does not order: the request's
// clusters are the sample's, in its order. When the filters keep none of
// the sample, or its best is saturated or stale, the pick orders none,
// and the caller picks over every candidate: only all of them tell
// whether a request must be shed or go to a saturated cluster.
const (
	// SampleAbove is how many candidates a pick orders all of.
	SampleAbove = 64
	// sampleHomes is how many of a key's rendezvous order are sampled:
	// its home, its second, and two more for when they are filtered out.
	sampleHomes = 4
	// sampleRandom is how many are drawn at random.
	sampleRandom = 16
)

// Sampler is what a pick samples many candidates with: their prompt index
// ids in order and each id's index, and the local candidate's index (-1
// when none). Made once for a backend's candidates, by the first pick
// after its table is published; nil for SampleAbove candidates or fewer.
type Sampler struct {
	ids   []uint32
	index map[uint32]int
	local int
}

// NewSampler returns the sampler of cands; nil for SampleAbove or fewer.
func NewSampler(cands []Candidate) *Sampler {
	if len(cands) <= SampleAbove {
		return nil
	}
	s := &Sampler{ids: make([]uint32, len(cands)), index: make(map[uint32]int, len(cands)), local: -1}
	for i := range cands {
		s.ids[i] = cands[i].id()
		s.index[s.ids[i]] = i
		if cands[i].Local {
			s.local = i
		}
	}
	return s
}

// placeOf is the index of the candidate of cluster id; -1 for none.
func (s *Sampler) placeOf(id uint32) int {
	if i, ok := s.index[id]; ok {
		return i
	}
	return -1
}

// Samples reports whether the pipeline orders a sample of a Sampler's
// candidates: one of scorers and the max-score or two-choices picker.
// The round-robin and chain pickers rotate over every candidate.
func (p *Pipeline) Samples() bool {
	return len(p.cfg.Scorers) > 0 && (p.cfg.Picker == routingpolicy.PickMaxScore || p.cfg.Picker == routingpolicy.PickTwoChoices)
}

// Sample appends to out the indices of the candidates of s that a pick of
// req orders (above), in no order and each once, and marks req sampled
// (Request.Sampled). req's blocks and session are read; nothing else.
func (p *Pipeline) Sample(req *Request, s *Sampler, out []int) []int {
	req.Sampled = true
	start := len(out)
	out = addOnce(out, start, s.local)
	if key := homeKey(req.Blocks); key != 0 && p.homes {
		top, n := firstByHash(key, s.ids)
		for _, i := range top[:n] {
			out = addOnce(out, start, i)
		}
	}
	if p.mem != nil && p.needs.Prompt && len(req.Blocks) > 0 {
		var held [2 * promptprefix.HolderClusters]uint32
		for _, id := range p.mem.Prefixes.Holders(req.Blocks, min(len(req.Blocks), homeKeyBlocks), held[:0]) {
			out = addOnce(out, start, s.placeOf(id))
		}
	}
	if p.mem != nil && p.needs.Session && req.Session != "" {
		if c := p.mem.Sessions.Cluster(req.Scope, req.Session, req.Now); c != "" {
			out = addOnce(out, start, s.placeOf(promptprefix.ClusterID(c)))
		}
	}
	for range sampleRandom {
		out = addOnce(out, start, p.intN(len(s.ids)))
	}
	return out
}

// addOnce appends i to out unless it is below 0 or out[start:] has it.
func addOnce(out []int, start, i int) []int {
	if i < 0 || slices.Contains(out[start:], i) {
		return out
	}
	return append(out, i)
}

// firstByHash returns the indices of the sampleHomes first of ids in
// key's rendezvous order with equal weights, best first, and how many
// there are (fewer ids than that): the order of the rendezvous scores
// with equal weights is the order of their hashes, so no logarithm is
// taken.
func firstByHash(key uint64, ids []uint32) (top [sampleHomes]int, n int) {
	var score [sampleHomes]uint64
	for i, id := range ids {
		h := rendezvousHash(key, id)
		if n < sampleHomes {
			n++
		} else if h <= score[n-1] {
			continue
		}
		j := n - 1
		for ; j > 0 && score[j-1] < h; j-- {
			top[j], score[j] = top[j-1], score[j-1]
		}
		top[j], score[j] = i, h
	}
	return top, n
}
