package benchrouting

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// The drawn workloads (workload.Draw), by the seeds of their two lists:
// the tuning seeds anyone changing a rule may run as often as they like
// (MCI_BENCH_ROUTING_WORKLOADS=tuning-1,...), the held-out ones that
// only check.
var (
	tuningSeeds  = workload.TuningSeeds
	heldOutSeeds = workload.HeldOutSeeds
)

const (
	tuningPrefix  = "tuning-"
	heldOutPrefix = "held-out-"
	// mciPolicy is the policy the held-out targets judge.
	mciPolicy = "PrefixAffinity"
	// maxDrawnRate is the highest request rate a drawn workload is
	// calibrated to: what a 2-core machine drives through the data path
	// (TestFamilySpansTheRanges holds the named ones to 30).
	maxDrawnRate = 28.0
)

func heldOutName(seed uint64) string { return heldOutPrefix + strconv.FormatUint(seed, 10) }

// heldOutOrder is the held-out workloads in the order they run: by their
// servers, so that the servers' Pods change once per shape.
func heldOutOrder() []string {
	seeds := slices.Clone(heldOutSeeds)
	slices.SortStableFunc(seeds, func(a, b uint64) int {
		wa, wb := drawn(a), drawn(b)
		return cmp.Or(cmp.Compare(wb.ServersPerCluster, wa.ServersPerCluster), cmp.Compare(wa.Batch, wb.Batch))
	})
	out := make([]string, len(seeds))
	for i, s := range seeds {
		out[i] = heldOutName(s)
	}
	return out
}

// smokeHeldOut is the held-out workload the smoke runs: the first on the
// servers of shared-prompts (2 per cluster, 2 batch places), so that the smoke
// does not change the servers' Pods for it.
func smokeHeldOut() string {
	for _, s := range heldOutSeeds {
		if w := drawn(s); w.ServersPerCluster == 2 && w.Batch == 2 {
			return heldOutName(s)
		}
	}
	return heldOutName(heldOutSeeds[0])
}

// specOf is the workload of that name: a named one of family, a
// held-out one or a tuning one.
func specOf(name string) (spec, bool) {
	if w, ok := family[name]; ok {
		return w, true
	}
	if w, ok := unseenSpecOf(name); ok {
		return w, true
	}
	for prefix, seeds := range map[string][]uint64{heldOutPrefix: heldOutSeeds, tuningPrefix: tuningSeeds} {
		if s, ok := strings.CutPrefix(name, prefix); ok {
			seed, err := strconv.ParseUint(s, 10, 64)
			if err == nil && slices.Contains(seeds, seed) {
				return drawn(seed), true
			}
		}
	}
	return spec{}, false
}

func isHeldOut(name string) bool { return strings.HasPrefix(name, heldOutPrefix) }

// drawn is the workload of seed (workload.Draw) on 2 servers per
// cluster. A workload whose rate would pass maxDrawnRate gets fewer batch
// places, then fewer servers, at the same load: the same pressure, at a
// rate the harness drives.
func drawn(seed uint64) spec {
	drawnMu.Lock()
	defer drawnMu.Unlock()
	w, ok := drawnSpecs[seed]
	if !ok {
		w = draw(seed)
		drawnSpecs[seed] = w
	}
	return w
}

// drawnSpecs are the workloads drawn so far, by seed: a draw generates
// the workload to calibrate it, which takes a while.
var (
	drawnMu    sync.Mutex
	drawnSpecs = map[uint64]spec{}
)

// draw is drawn, uncached.
func draw(seed uint64) spec {
	d := workload.Draw(seed)
	p := d.Profile
	w := spec{Profile: p, Load: d.Load, ServersPerCluster: 2, Batch: d.Batch}
	for w.Batch > 2 || w.ServersPerCluster > 1 {
		p, _, err := calibrated(config{Cost: serverCost, RunDuration: 18 * time.Second}, w)
		if err != nil || p.Rate <= maxDrawnRate {
			break
		}
		if w.Batch > 2 {
			w.Batch /= 2
		} else {
			w.ServersPerCluster--
		}
	}
	w.Summary = fmt.Sprintf("drawn from seed %d: %d groups, %d-token system prompts, %d conversations open, %d turns, %d-token user messages, %d-token answers, %.0f%% one-shot, %d servers per cluster with %d batch places, %.0f%%",
		seed, p.Groups, p.SystemTokens, p.ActiveConversations, p.Turns, p.UserTokens, p.OutputTokens, 100*p.OneShotShare, w.ServersPerCluster, w.Batch, 100*d.Load)
	return w
}

// heldOutRow is one held-out workload: mci's PrefixAffinity against the
// hub configuration and the oracle of the same run. Shortfall is the
// largest of the hub's hit ratio over PrefixAffinity's, PrefixAffinity's
// TTFT p50 over the hub's and its p99 over 1.1 times the hub's: at most 1
// when the held-out targets are met, and the larger the further missed.
type heldOutRow struct {
	Workload  string     `json:"workload"`
	Hit       [3]float64 `json:"prefix_hit_ratio"`
	TTFTP50   [3]float64 `json:"ttft_p50_ms"`
	TTFTP99   [3]float64 `json:"ttft_p99_ms"`
	Shortfall float64    `json:"shortfall"`
}

// heldOutPolicies are the columns of a heldOutRow's figures.
var heldOutPolicies = [3]string{mciPolicy, hubPolicy, oraclePolicy}

// heldOutSummary is the held-out workloads that ran with the three
// policies, and the worst of them (largest shortfall).
type heldOutSummary struct {
	Rows  []heldOutRow `json:"rows"`
	Worst string       `json:"worst"`
}

func summarizeHeldOut(r *results) *heldOutSummary {
	s := &heldOutSummary{}
	worst := -1.0
	for _, name := range r.Config.Workloads {
		w := r.Workloads[name]
		if !isHeldOut(name) || w == nil {
			continue
		}
		row := heldOutRow{Workload: name}
		complete := true
		for i, p := range heldOutPolicies {
			pr := w.Policies[p]
			if pr == nil {
				complete = false
				break
			}
			row.Hit[i], row.TTFTP50[i], row.TTFTP99[i] = pr.PrefixHit, pr.TTFTP50, pr.TTFTP99
		}
		if !complete {
			continue
		}
		row.Shortfall = round(max(quotient(row.Hit[1], row.Hit[0]), quotient(row.TTFTP50[0], row.TTFTP50[1]), quotient(row.TTFTP99[0], 1.1*row.TTFTP99[1])), 3)
		s.Rows = append(s.Rows, row)
		if row.Shortfall > worst {
			worst, s.Worst = row.Shortfall, name
		}
	}
	if len(s.Rows) == 0 {
		return nil
	}
	return s
}

// quotient is a/b; +Inf when b is 0 and a is not (a zero hit ratio
// against some), 1 when both are.
func quotient(a, b float64) float64 {
	switch {
	case b > 0:
		return a / b
	case a > 0:
		return math.Inf(1)
	default:
		return 1
	}
}

// markdown is the held-out table: each workload's figures, then the worst
// again with the targets.
func (s *heldOutSummary) markdown() string {
	if s == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("Held-out workloads (drawn from seeds nobody tunes on): `PrefixAffinity` / `HubReference` / `Oracle` of the same run;" +
		" targets on the worst: hit ratio >= the hub's, TTFT p50 <= the hub's, p99 <= 1.1 x the hub's" +
		" (shortfall: the largest of hub hit / mci hit, mci p50 / hub p50, mci p99 / (1.1 x hub p99); at most 1 meets them all).\n\n" +
		"| workload | prefix-cache hit ratio | TTFT p50 (ms) | TTFT p99 (ms) | shortfall |\n|---|---|---|---|---|\n")
	for _, row := range s.Rows {
		name := row.Workload
		if name == s.Worst {
			name = "**" + name + " (worst)**"
		}
		fmt.Fprintf(&b, "| %s | %.3f / %.3f / %.3f | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f | %.2f |\n", name,
			row.Hit[0], row.Hit[1], row.Hit[2], row.TTFTP50[0], row.TTFTP50[1], row.TTFTP50[2], row.TTFTP99[0], row.TTFTP99[1], row.TTFTP99[2], row.Shortfall)
	}
	for _, row := range s.Rows {
		if row.Workload != s.Worst {
			continue
		}
		verdict := func(ok bool) string {
			if ok {
				return "met"
			}
			return "missed"
		}
		fmt.Fprintf(&b, "\nWorst, %s: hit ratio %.3f against the hub's %.3f (%s), TTFT p50 %.0f ms against %.0f ms (%s), p99 %.0f ms against 1.1 x %.0f ms (%s); the oracle %.3f, %.0f ms, %.0f ms.\n\n",
			row.Workload, row.Hit[0], row.Hit[1], verdict(row.Hit[0] >= row.Hit[1]), row.TTFTP50[0], row.TTFTP50[1], verdict(row.TTFTP50[0] <= row.TTFTP50[1]),
			row.TTFTP99[0], row.TTFTP99[1], verdict(row.TTFTP99[0] <= 1.1*row.TTFTP99[1]), row.Hit[2], row.TTFTP50[2], row.TTFTP99[2])
	}
	return b.String()
}

// heldOutErrors: every held-out workload that ran with the three policies
// has its row, and the worst is one of them.
func heldOutErrors(r *results) []error {
	var want []string
	for _, name := range r.Config.Workloads {
		if w := r.Workloads[name]; isHeldOut(name) && w != nil && w.Policies[mciPolicy] != nil && w.Policies[hubPolicy] != nil && w.Policies[oraclePolicy] != nil {
			want = append(want, name)
		}
	}
	if len(want) == 0 {
		return nil
	}
	var got []string
	if r.HeldOut != nil {
		for _, row := range r.HeldOut.Rows {
			got = append(got, row.Workload)
		}
	}
	if !slices.Equal(got, want) || !slices.Contains(got, r.HeldOut.Worst) {
		return []error{fmt.Errorf("the held-out table has %v, worst %q; want a row for each of %v", got, worstOf(r.HeldOut), want)}
	}
	return nil
}

func worstOf(s *heldOutSummary) string {
	if s == nil {
		return ""
	}
	return s.Worst
}
