package benchrouting

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// What any router that keeps each prompt group on one cluster for a run
// can reach of the equal-share target, on the workloads of traffic the
// sidecar does not see: computed from the workloads' requests alone, for
// the best placement of the groups over the clusters each importer
// reaches (one-shot prompts, which have no home, filling the clusters
// least loaded), over consecutive windows of a run's length.

// groupOf is a prompt group of one population.
type groupOf struct {
	entry string
	group int
}

// shareWindow is what one window of a workload sends: the exporters' own
// users' requests, each importer's group's and one-shot requests.
type shareWindow struct {
	direct   map[string]float64
	groups   map[groupOf]float64
	oneShots map[string]float64
	total    float64
}

func shareWindows(reqs []workload.Request, length time.Duration, n int) []shareWindow {
	out := make([]shareWindow, n)
	for i := range out {
		out[i] = shareWindow{direct: map[string]float64{}, groups: map[groupOf]float64{}, oneShots: map[string]float64{}}
	}
	for _, r := range reqs {
		i := int(r.At / length)
		if i >= n {
			continue
		}
		w := &out[i]
		w.total++
		switch {
		case isDirectEntry(r.Entry):
			w.direct[r.Entry]++
		case r.Group < 0:
			w.oneShots[r.Entry]++
		default:
			w.groups[groupOf{r.Entry, r.Group}]++
		}
	}
	return out
}

// reaches says whether an importer's users can be sent to cluster j (of
// clusterNames): the second importer routes over the exporters alone.
func reaches(entry string, j int) bool {
	return entry != secondImporterEntry || slices.Contains(exportingClusters, clusterNames[j])
}

// gap is the equal-share gap, in points, of placing w's groups as
// placed (a group not placed goes to the first cluster its importer
// reaches), its one-shot requests one by one to the least loaded
// cluster their importer reaches.
func (w shareWindow) gap(placed map[groupOf]int) float64 {
	load := make([]float64, len(clusterNames))
	for j, c := range clusterNames {
		load[j] = w.direct[c]
	}
	for g, n := range w.groups {
		load[placed[g]] += n
	}
	for entry, n := range w.oneShots {
		for range int(n) {
			least := -1
			for j := range load {
				if reaches(entry, j) && (least < 0 || load[j] < load[least]) {
					least = j
				}
			}
			load[least]++
		}
	}
	gap := 0.0
	for _, l := range load {
		gap = max(gap, math.Abs(l/w.total-1/float64(len(load))))
	}
	return 100 * gap
}

// bestPlacement is the placement of groups that brings w closest to
// equal shares, tried exhaustively, and its gap.
func (w shareWindow) bestPlacement(groups []groupOf) (map[groupOf]int, float64) {
	best, placed, current := math.Inf(1), map[groupOf]int{}, map[groupOf]int{}
	var try func(i int)
	try = func(i int) {
		if i == len(groups) {
			if g := w.gap(current); g < best {
				best = g
				for k, v := range current {
					placed[k] = v
				}
			}
			return
		}
		for j := range clusterNames {
			if reaches(groups[i].entry, j) {
				current[groups[i]] = j
				try(i + 1)
			}
		}
	}
	try(0)
	return placed, best
}

// TestWholeGroupsPlacedFromTheLastRunMissTheEqualShares: with hindsight,
// some placement of whole groups puts every cluster within a point of an
// equal share in nearly every window of a run's length, but the best
// placement for one window, kept for the next, misses 5 points in about
// half of them: a group's traffic is how many of its conversations are
// open, which turns over within a run. A placement of whole groups made
// from what was measured cannot hold the shares within 5 points on these
// workloads; only moving groups within a run (a cold prefill each) or
// splitting them over clusters can.
func TestWholeGroupsPlacedFromTheLastRunMissTheEqualShares(t *testing.T) {
	cfg := defaultConfig("full")
	const windows = 8
	var hindsight, kept []float64
	for _, v := range unseenVariants {
		w := unseenFamily[v.name]
		p, _, err := calibrated(cfg, w)
		require.NoError(t, err)
		p.Duration = windows * cfg.RunDuration
		reqs, err := workload.Generate(p)
		require.NoError(t, err)
		ws := shareWindows(reqs, cfg.RunDuration, windows)
		for i := 0; i+1 < windows; i++ {
			var groups []groupOf
			for _, x := range ws[i : i+2] {
				for g := range x.groups {
					if !slices.Contains(groups, g) {
						groups = append(groups, g)
					}
				}
			}
			placed, _ := ws[i].bestPlacement(groups)
			_, best := ws[i+1].bestPlacement(groups)
			hindsight, kept = append(hindsight, best), append(kept, ws[i+1].gap(placed))
		}
	}
	missed := func(gaps []float64) int {
		n := 0
		for _, g := range gaps {
			if g > 5 {
				n++
			}
		}
		return n
	}
	t.Logf("with hindsight: %.1f", hindsight)
	t.Logf("kept from the window before: %.1f", kept)
	// direct-60's own users alone are 60% of the requests, drawn as they
	// come: a few of its windows are beyond 5 points whatever is placed.
	assert.LessOrEqual(t, missed(hindsight), len(hindsight)/6, "with hindsight")
	assert.GreaterOrEqual(t, missed(kept), len(kept)*2/5, "kept from the window before")
}
