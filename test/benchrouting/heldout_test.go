package benchrouting

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mci-dev/mci/test/benchrouting/workload"
)

// The drawn workloads: the generator (drawn) makes a workload of the
// family from a seed alone, its parameters drawn wide, so that a rule is
// measured on shapes nobody picked. Their seeds are kept in two lists.
//
// tuningSeeds are the drawn workloads anyone changing a rule may look at
// and run as often as they like (MCI_BENCH_ROUTING_WORKLOADS=tuning-1,...),
// beside the named workloads of family, on which the rules were tuned.
//
// heldOutSeeds are the held-out workloads: make bench-routing runs them
// and reports their worst against the hub configuration and the oracle,
// and nobody tunes on them. A rule tuned until these pass has been fitted
// to them and they stop telling how it does on a workload nobody saw, so a
// change to a rule needs a reason that holds for every workload
// (docs/design/cluster-scoring.md), and these seeds only check it. They
// were chosen before any of them had run; replacing one because it fails
// defeats them.
var (
	tuningSeeds  = []uint64{1, 2, 3, 4, 5}
	heldOutSeeds = []uint64{9101, 9102, 9103, 9104, 9105, 9106, 9107, 9108, 9109, 9110}
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
// servers, so that the data path restarts once per shape.
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
// servers of issue-23 (2 per cluster, 2 batch places), so that the smoke
// does not restart the data path for it.
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

// drawn is the workload of seed, every parameter drawn from it: 4 to 64
// groups, 1 to 6 open conversations per group, shared system prompts of
// 200 to 4,000 tokens, 1 to 16 turns, 20 to 160 tokens per user message,
// 16 to 64 tokens per answer, no one-shot requests to 60% of them, a load
// of 60 to 120% of the capacity without cache hits (up to and past the
// servers' saturation), 2 servers per cluster with 2 or 4 batch places.
// Groups, system prompts and user messages are drawn log-uniform, so that
// few and many, short and long, are as likely. A workload whose rate would pass maxDrawnRate gets fewer
// batch places, then fewer servers, at the same load: the same pressure,
// at a rate the harness drives.
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
	rng := rand.New(rand.NewPCG(seed, seed^0xda942042e4dd58b5))
	logUniform := func(lo, hi float64) int { return int(math.Round(lo * math.Pow(hi/lo, rng.Float64()))) }
	groups := logUniform(4, 64)
	perGroup := 1 + rng.IntN(6)
	system := 50 * (logUniform(200, 4000) / 50)
	turns := 1 + rng.IntN(16)
	user := logUniform(20, 160)
	output := []int{16, 32, 64}[rng.IntN(3)]
	oneShot := round(0.6*rng.Float64(), 2)
	load := round(0.6+0.6*rng.Float64(), 2)
	batch := []int{2, 4}[rng.IntN(2)]
	w := spec{
		Profile: workload.Profile{Seed: seed, Groups: groups, SystemTokens: system, ActiveConversations: groups * perGroup, Turns: turns,
			UserTokens: user, OutputTokens: output, OneShotShare: oneShot, OneShotTokens: 300},
		Load: load, ServersPerCluster: 2, Batch: batch,
	}
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
		seed, groups, system, groups*perGroup, turns, user, output, 100*oneShot, w.ServersPerCluster, w.Batch, 100*load)
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
