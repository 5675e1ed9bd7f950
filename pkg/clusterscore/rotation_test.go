package clusterscore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		p := mustPipeline(t, Weighted)
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
