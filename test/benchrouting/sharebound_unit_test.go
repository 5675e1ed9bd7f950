package benchrouting

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
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

// windowsOf is the requests of w over n windows of a run's length, and
// those windows.
func windowsOf(t *testing.T, cfg config, w spec, n int) ([]workload.Request, []shareWindow) {
	t.Helper()
	p, _, err := calibrated(cfg, w)
	require.NoError(t, err)
	p.Duration = time.Duration(n) * cfg.RunDuration
	reqs, err := workload.Generate(p)
	require.NoError(t, err)
	return reqs, shareWindows(reqs, cfg.RunDuration, n)
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
	// In the entries' order, so that the figures do not move with the
	// map's.
	for _, entry := range slices.Sorted(maps.Keys(w.oneShots)) {
		for range int(w.oneShots[entry]) {
			load[leastLoaded(load, entry)]++
		}
	}
	return loadGap(load, w.total)
}

// leastLoaded is the cluster of least load that entry's users reach.
func leastLoaded(load []float64, entry string) int {
	least := -1
	for j := range load {
		if reaches(entry, j) && (least < 0 || load[j] < load[least]) {
			least = j
		}
	}
	return least
}

// loadGap is, in points, how far the cluster furthest from an
// equal share of total is from it, with load the requests each served.
func loadGap(load []float64, total float64) float64 {
	gap := 0.0
	for _, l := range load {
		gap = max(gap, math.Abs(l/total-1/float64(len(load))))
	}
	return 100 * gap
}

// groupsOf is the groups that send in any of ws, in order (a placement
// tried exhaustively keeps the first of equal ones).
func groupsOf(ws []shareWindow) []groupOf {
	var groups []groupOf
	for _, w := range ws {
		for g := range w.groups {
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
	}
	slices.SortFunc(groups, func(a, b groupOf) int {
		return cmp.Or(strings.Compare(a.entry, b.entry), cmp.Compare(a.group, b.group))
	})
	return groups
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
// placement for one window, kept for the next, misses 5 points in most
// of them: a group's traffic is how many of its conversations are
// open, which turns over within a run. A placement of whole groups made
// from what was measured cannot hold the shares within 5 points on these
// workloads; only moving groups within a run (a cold prefill each) or
// splitting them over clusters can.
func TestWholeGroupsPlacedFromTheLastRunMissTheEqualShares(t *testing.T) {
	cfg := defaultConfig("full")
	const windows = 8
	var hindsight, kept []float64
	for _, v := range unseenVariants {
		_, ws := windowsOf(t, cfg, unseenFamily[v.name], windows)
		for i := 0; i+1 < windows; i++ {
			groups := groupsOf(ws[i : i+2])
			placed, _ := ws[i].bestPlacement(groups)
			_, best := ws[i+1].bestPlacement(groups)
			hindsight, kept = append(hindsight, best), append(kept, ws[i+1].gap(placed))
		}
	}
	t.Logf("with hindsight: %.1f", hindsight)
	t.Logf("kept from the window before: %.1f", kept)
	// direct-60's own users alone are 60% of the requests, drawn as they
	// come: a few of its windows are beyond 5 points whatever is placed.
	assert.LessOrEqual(t, missedWindows(hindsight), len(hindsight)/6, "with hindsight")
	assert.GreaterOrEqual(t, missedWindows(kept), len(kept)*2/5, "kept from the window before")
}

// missedWindows counts the windows whose equal-share gap is beyond the
// target's 5 points.
func missedWindows(gaps []float64) int {
	n := 0
	for _, g := range gaps {
		if g > 5 {
			n++
		}
	}
	return n
}

// splitFigures are what splitNewConversations found over a workload's
// windows: each window's equal-share gap; the conversations it started,
// and how many of those left their group's home; and how many times a
// group was first served by a cluster other than the first that served
// it in the window (a cold prefill of the group's prefix there).
type splitFigures struct {
	gaps                 []float64
	conversations, moved int
	coldGroups           int
}

// splitNewConversations routes each window after the first with the
// groups homed where the best placement of the window before put them,
// as TestWholeGroupsPlacedFromTheLastRunMissTheEqualShares keeps them,
// but a conversation that starts while its group's home has served more
// than an equal share of the window's requests so far by margin points
// goes to the least loaded cluster its users reach, and its later turns
// follow it there. The exporters' own users' requests count where they
// enter, as they come; one-shot prompts fill the least loaded.
func splitNewConversations(reqs []workload.Request, ws []shareWindow, length time.Duration, margin float64) splitFigures {
	var f splitFigures
	for i := 0; i+1 < len(ws); i++ {
		placed, _ := ws[i].bestPlacement(groupsOf(ws[i : i+2]))
		load := make([]float64, len(clusterNames))
		total := 0.0
		type conversationOf struct {
			entry string
			id    int
		}
		at := map[conversationOf]int{}
		servedBy := map[groupOf]map[int]bool{}
		for _, r := range reqs {
			if int(r.At/length) != i+1 {
				continue
			}
			total++
			if isDirectEntry(r.Entry) {
				load[slices.Index(clusterNames, r.Entry)]++
				continue
			}
			if r.Group < 0 {
				load[leastLoaded(load, r.Entry)]++
				continue
			}
			g, c := groupOf{r.Entry, r.Group}, conversationOf{r.Entry, r.Conversation}
			to, open := at[c]
			if !open {
				f.conversations++
				home, ok := placed[g]
				if !ok {
					home = leastLoaded(load, r.Entry)
				}
				to = home
				if 100*(load[home]+1)/total > 100/float64(len(load))+margin {
					to = leastLoaded(load, r.Entry)
				}
				if to != home {
					f.moved++
				}
				at[c] = to
			}
			load[to]++
			if servedBy[g] == nil {
				servedBy[g] = map[int]bool{}
			}
			if !servedBy[g][to] && len(servedBy[g]) > 0 {
				f.coldGroups++
			}
			servedBy[g][to] = true
		}
		f.gaps = append(f.gaps, loadGap(load, total))
	}
	return f
}

// splitMargin is how far above an equal share a home may have served
// before its group's new conversations go elsewhere: of 1, 2 and 3
// points, which all kept every window of the tuning seeds' workloads
// within 5 points in a scratch run (their groups placed largest first:
// too many to try every placement), the one that moves the fewest
// conversations.
const splitMargin = 3

// TestNewConversationsLeavingAHomeAboveItsShareHoldTheEqualShares: where
// whole groups kept from the window before miss the equal shares by more
// than 5 points in most windows, groups whose new conversations leave a
// home that has served more than its share miss them in few, on the
// named workloads and on the held-out ones (seeds not used to choose the
// margin), at the cost of a group's prefix computed cold once on each
// further cluster that serves it (2 to 3% of the requests). The
// simulation knows, as the sidecar would only through its EPPs' counts a
// scrape and a smoothing later, the requests each cluster served so far.
func TestNewConversationsLeavingAHomeAboveItsShareHoldTheEqualShares(t *testing.T) {
	cfg := defaultConfig("full")
	const windows = 8
	for _, set := range []struct {
		name   string
		nameOf func(v unseenVariant) string
	}{
		{"named", func(v unseenVariant) string { return v.name }},
		{"held-out", func(v unseenVariant) string {
			return unseenName(heldOutPrefix, v.name, unseenHeldOutSeeds[v.name][0])
		}},
	} {
		var split, whole splitFigures
		requests := 0
		for _, v := range unseenVariants {
			w, ok := unseenSpecOf(set.nameOf(v))
			require.True(t, ok, set.nameOf(v))
			reqs, ws := windowsOf(t, cfg, w, windows)
			for _, w := range ws[1:] {
				requests += int(w.total)
			}
			s, k := splitNewConversations(reqs, ws, cfg.RunDuration, splitMargin), splitNewConversations(reqs, ws, cfg.RunDuration, math.Inf(1))
			split.gaps, split.conversations, split.moved, split.coldGroups = append(split.gaps, s.gaps...), split.conversations+s.conversations, split.moved+s.moved, split.coldGroups+s.coldGroups
			whole.gaps = append(whole.gaps, k.gaps...)
			assert.Zero(t, k.moved+k.coldGroups, "%s: no conversation leaves its home without a margin", set.nameOf(v))
		}
		t.Logf("%s: whole groups miss 5 points in %d of %d windows (worst %.1f); new conversations leaving a home %d points above its share, in %d (worst %.1f), %d of %d conversations moved, a group's prefix cold on a further cluster %d times in %d requests",
			set.name, missedWindows(whole.gaps), len(whole.gaps), slices.Max(whole.gaps), splitMargin, missedWindows(split.gaps), slices.Max(split.gaps), split.moved, split.conversations, split.coldGroups, requests)
		// A quarter of whole groups' misses at most: 4 of 20 on the named
		// workloads (direct-60's own users are 60% of the requests, drawn as
		// they come, so some of its windows are beyond any placement), 0 of
		// 11 on the held-out ones.
		assert.LessOrEqual(t, 4*missedWindows(split.gaps), missedWindows(whole.gaps), "%s: windows beyond 5 points with new conversations leaving a home above its share, against whole groups", set.name)
	}
}
