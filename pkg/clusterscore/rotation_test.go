package clusterscore

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/routingpolicy"
)

func TestRotation(t *testing.T) {
	cands := []Candidate{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}
	rot := NewRotation(cands)
	tests := []struct {
		name  string
		cands []Candidate
		fits  bool
	}{
		{name: "the same names and weights fit", cands: []Candidate{{Name: "a", Weight: 3, Health: HealthServing}, {Name: "b", Weight: 1}}, fits: true},
		{name: "a changed weight does not", cands: []Candidate{{Name: "a", Weight: 2}, {Name: "b", Weight: 1}}},
		{name: "another order does not", cands: []Candidate{{Name: "b", Weight: 1}, {Name: "a", Weight: 3}}},
		{name: "another cluster does not", cands: []Candidate{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.fits, rot.Fits(tt.cands)) })
	}
	assert.False(t, NewRotation([]Candidate{{Name: "a=3|b", Weight: 1}, {Name: "c", Weight: 1}}).
		Fits([]Candidate{{Name: "a", Weight: 3}, {Name: "b=1|c", Weight: 1}}), "names cannot pass for weights")
	var nilRot *Rotation
	assert.False(t, nilRot.Fits(cands))

	t.Run("a rotation carried across rebuilds keeps the split exact", func(t *testing.T) {
		p := mustPipeline(t, routingpolicy.Weighted)
		rot := NewRotation(cands)
		got := map[string]int{}
		for i := range 8 {
			// Every pick sees a rebuilt candidate slice, as after a
			// routing table rebuild that changed nothing of them.
			rebuilt := []Candidate{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}
			if !rot.Fits(rebuilt) {
				rot = NewRotation(rebuilt)
			}
			order, err := p.Pick(&Request{}, rebuilt, rot, nil, nil)
			require.NoError(t, err)
			got[rebuilt[order[0]].Name]++
			if i == 3 {
				assert.Equal(t, map[string]int{"a": 3, "b": 1}, got, "exact over every cycle of sum(weights)")
			}
		}
		assert.Equal(t, map[string]int{"a": 6, "b": 2}, got)
	})
}

// TestRotationPicks holds the smooth weighted round-robin to its split
// (moved here from pkg/sidecar with it).
func TestRotationPicks(t *testing.T) {
	rotationOf := func(weights []int64) *Rotation {
		cands := make([]Candidate, len(weights))
		for i, w := range weights {
			cands[i] = Candidate{Name: string(rune('a' + i)), Weight: w}
		}
		return NewRotation(cands)
	}
	tests := []struct {
		name    string
		weights []int64
		picks   int
		want    []int
	}{
		{name: "equal weights alternate", weights: []int64{50, 50}, picks: 4, want: []int{2, 2}},
		{name: "weights hold exactly over a cycle", weights: []int64{3, 1}, picks: 8, want: []int{6, 2}},
		{name: "weight 0 is never picked", weights: []int64{0, 1, 0}, picks: 5, want: []int{0, 5, 0}},
		{name: "large weights hold", weights: []int64{1000000, 1}, picks: 1000001, want: []int{1000000, 1}},
		{name: "three ways", weights: []int64{5, 3, 2}, picks: 100, want: []int{50, 30, 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := rotationOf(tt.weights)
			got := make([]int, len(tt.weights))
			for range tt.picks {
				got[w.Next()]++
			}
			assert.Equal(t, tt.want, got)
		})
	}

	t.Run("picks interleave rather than burst", func(t *testing.T) {
		w := rotationOf([]int64{2, 1})
		var seq []int
		for range 6 {
			seq = append(seq, w.Next())
		}
		assert.Equal(t, []int{0, 1, 0, 0, 1, 0}, seq)
	})

	t.Run("only zero weights pick nothing", func(t *testing.T) {
		assert.Equal(t, -1, rotationOf([]int64{0, 0}).Next())
		assert.Equal(t, -1, rotationOf(nil).Next())
	})

	t.Run("ineligible candidates are skipped and the others keep their ratio", func(t *testing.T) {
		w := rotationOf([]int64{1, 2, 1})
		got := make([]int, 3)
		for range 300 {
			got[w.next(func(i int) bool { return i != 0 })]++
		}
		assert.Equal(t, []int{0, 200, 100}, got)
		assert.Equal(t, -1, w.next(func(int) bool { return false }))
	})

	t.Run("concurrent picks keep the split exact", func(t *testing.T) {
		w := rotationOf([]int64{1, 1})
		var mu sync.Mutex
		got := make([]int, 2)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 250 {
					i := w.Next()
					mu.Lock()
					got[i]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		assert.Equal(t, []int{1000, 1000}, got)
	})
}
