package clusterscore

import (
	"strconv"
	"strings"
	"sync"
)

// Rotation is the smooth weighted round-robin state of one backend's
// candidates (as in nginx): every pick adds each eligible candidate's
// weight to its credit and takes the one with the most credit, which then
// pays the total. Over any run of sum(weights) picks every candidate is
// picked exactly weight times, interleaved. A weight of 0 is never picked.
//
// The caller owns it and keeps it across routing table rebuilds while Fits
// reports the candidates unchanged, so frequent rebuilds do not skew the
// split. It is safe for concurrent use.
type Rotation struct {
	key     string
	weights []int64

	mu     sync.Mutex
	credit []int64
}

// NewRotation returns the rotation of the candidates, by their weights.
func NewRotation(cands []Candidate) *Rotation {
	w := make([]int64, len(cands))
	for i, c := range cands {
		w[i] = c.Weight
	}
	return &Rotation{key: rotationKey(cands), weights: w, credit: make([]int64, len(cands))}
}

// Key identifies the candidates the rotation was made for, names and
// weights in order: it Fits the candidates of another rotation of the
// same key.
func (r *Rotation) Key() string { return r.key }

// Fits reports whether the rotation was made for candidates of these names
// and weights, in this order: then the caller keeps it.
func (r *Rotation) Fits(cands []Candidate) bool {
	return r != nil && len(cands) == len(r.weights) && r.key == rotationKey(cands)
}

func rotationKey(cands []Candidate) string {
	var b strings.Builder
	for _, c := range cands {
		// Length-prefixed, so that no name can pass for another's weight.
		b.WriteString(strconv.Itoa(len(c.Name)))
		b.WriteByte(':')
		b.WriteString(c.Name)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(c.Weight, 10))
		b.WriteByte('|')
	}
	return b.String()
}

// Next picks a candidate among all, by weight; -1 when none has a weight.
// The sidecar splits a rule's traffic among its backendRefs with it.
func (r *Rotation) Next() int { return r.next(func(int) bool { return true }) }

// next picks a candidate among those eligible reports true, skipping
// weight 0; -1 when no eligible candidate has a weight. Skipped candidates
// keep their credit, so among the eligible ones the weights still hold.
func (r *Rotation) next(eligible func(int) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	best, total := -1, int64(0)
	for i, wt := range r.weights {
		if wt <= 0 || !eligible(i) {
			continue
		}
		r.credit[i] += wt
		total += wt
		if best < 0 || r.credit[i] > r.credit[best] {
			best = i
		}
	}
	if best >= 0 {
		r.credit[best] -= total
	}
	return best
}
