package sidecar

import (
	"strconv"
	"strings"
	"sync"
)

// smoothWRR is smooth weighted round-robin (as in nginx): every pick adds
// each candidate's weight to its credit and takes the candidate with the most
// credit, which then pays the total. Over any run of sum(weights) picks every
// candidate is picked exactly weight times, interleaved rather than in
// bursts, so weights hold exactly in the long run, not just statistically. A
// weight of 0 is never picked.
//
// The state survives routing table rebuilds that keep the same weights (see
// Router.Publish), so frequent rebuilds do not skew the split. It is safe for
// concurrent use; a pick costs a short critical section over at most 16
// backendRefs (Gateway API's limit) or a handful of clusters.
type smoothWRR struct {
	// key identifies the state: what it picks among and the weights.
	key     string
	weights []int64

	mu     sync.Mutex
	credit []int64
}

func newSmoothWRR(key string, weights []int64) *smoothWRR {
	return &smoothWRR{key: key, weights: weights, credit: make([]int64, len(weights))}
}

// wrrKey makes the state key of a picker: its owner, then each candidate's
// name and weight, so that a rebuild changing any of them starts afresh.
func wrrKey(owner string, names []string, weights []int64) string {
	var b strings.Builder
	b.WriteString(owner)
	for i, n := range names {
		b.WriteByte('|')
		b.WriteString(n)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(weights[i], 10))
	}
	return b.String()
}

// next picks a candidate among those eligible reports true (nil: all),
// skipping weight 0. It returns -1 when no eligible candidate has a weight.
// Skipped candidates keep their credit, so among the eligible ones the
// weights still hold.
func (w *smoothWRR) next(eligible func(int) bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	best, total := -1, int64(0)
	for i, wt := range w.weights {
		if wt <= 0 || (eligible != nil && !eligible(i)) {
			continue
		}
		w.credit[i] += wt
		total += wt
		if best < 0 || w.credit[i] > w.credit[best] {
			best = i
		}
	}
	if best >= 0 {
		w.credit[best] -= total
	}
	return best
}
