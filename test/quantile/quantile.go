// Package quantile is the one percentile the benchmarks report.
package quantile

import (
	"math"
	"slices"
	"time"
)

// Nearest is the nearest-rank p-th percentile of d (p from 0 to 100): the
// smallest value that at least p% of d are at or below; 0 of nothing. d
// is not reordered.
func Nearest(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
