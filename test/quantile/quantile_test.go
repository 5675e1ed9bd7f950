package quantile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestNearest(t *testing.T) {
	ten := []time.Duration{10, 1, 9, 2, 8, 3, 7, 4, 6, 5}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(100 - i)
	}
	tests := []struct {
		name string
		d    []time.Duration
		p    float64
		want time.Duration
	}{
		{name: "nothing is 0", d: nil, p: 50, want: 0},
		{name: "one value is every percentile", d: []time.Duration{7}, p: 99, want: 7},
		{name: "the median of ten is the fifth", d: ten, p: 50, want: 5},
		{name: "the 99th of ten is the largest", d: ten, p: 99, want: 10},
		{name: "the 90th of ten is the ninth", d: ten, p: 90, want: 9},
		{name: "the 0th is the smallest", d: ten, p: 0, want: 1},
		{name: "the 100th is the largest", d: ten, p: 100, want: 10},
		{name: "the median of four is the second", d: []time.Duration{4, 1, 3, 2}, p: 50, want: 2},
		{name: "the 99th of a hundred is the 99th", d: hundred, p: 99, want: 99},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Nearest(tt.d, tt.p))
		})
	}
	assert.Equal(t, []time.Duration{10, 1, 9, 2, 8, 3, 7, 4, 6, 5}, ten, "the values are not reordered")
}
