package benchrouting

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTheRegionFilterCheckFailsEveryBrokenInvariant(t *testing.T) {
	good := func() *regionResult {
		return &regionResult{Regions: inRegion, ByCluster: map[string]int{inRegionCluster: regionRequests},
			DownStatuses: map[int]int{503: regionRequests}, DownMetric: regionRequests, DownLogged: true}
	}
	tests := []struct {
		name  string
		spoil func(r *regionResult)
		want  string
	}{
		{"a run that kept the invariant passes", func(*regionResult) {}, ""},
		{"a request answered outside the region fails", func(r *regionResult) { r.Outside, r.ByCluster["cluster-c"] = 1, 1 }, "answered outside the region"},
		{"no request answered in the region fails", func(r *regionResult) { r.ByCluster = map[string]int{} }, "no request answered by cluster-a"},
		{"a request let through with no cluster of the region left fails", func(r *regionResult) { r.DownStatuses = map[int]int{503: regionRequests - 1, 200: 1} }, "want 30 × 503"},
		{"503s not counted as outside_regions fail", func(r *regionResult) { r.DownMetric = 0 }, "rose by 0"},
		{"a 503 whose reason is not logged fails", func(r *regionResult) { r.DownLogged = false }, "does not say NoClustersInRegions"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := good()
			tc.spoil(r)
			errs := regionErrors(r)
			if tc.want == "" {
				assert.Empty(t, errs)
				return
			}
			if assert.Len(t, errs, 1) {
				assert.Contains(t, errs[0].Error(), tc.want)
			}
		})
	}
	assert.Empty(t, regionErrors(nil), "a run that stopped before the check has nothing to judge")
}
