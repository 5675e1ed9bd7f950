package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mci-dev/mci/test/quantile"
)

// result is one figure of the table: what mci measured and, where there is
// one, its baseline measured in the same run, interleaved with it.
type result struct {
	Section  string  `json:"section"`
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Value    float64 `json:"value"`
	Baseline string  `json:"baseline,omitempty"`
	// BaselineValue and Ratio (Value / BaselineValue) are set when the
	// figure has a baseline.
	BaselineValue *float64 `json:"baselineValue,omitempty"`
	Ratio         *float64 `json:"ratio,omitempty"`
	Target        string   `json:"target,omitempty"`
	// Met says whether Target was met; absent without a target.
	Met  *bool  `json:"met,omitempty"`
	Note string `json:"note,omitempty"`
}

// report collects the results of a run.
type report struct {
	mu       sync.Mutex
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Sizes    sizes     `json:"sizes"`
	Host     host      `json:"host"`
	Results  []result  `json:"results"`
	// Facts are the per-unit costs the scale model is built from, by key
	// (see scaleModel).
	Facts  map[string]float64 `json:"facts"`
	Failed bool               `json:"failed"`
}

// host describes the machine, including how busy it was: the figures of a
// loaded machine are noisy, and the reader should know.
type host struct {
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	NumCPU      int    `json:"numCPU"`
	LoadStart   string `json:"loadAverageAtStart"`
	LoadEnd     string `json:"loadAverageAtEnd"`
	GoVersion   string `json:"goVersion"`
	MemoryTotal string `json:"memoryTotal"`
}

var results = &report{}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func memTotal() string {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func (r *report) start(s sizes) {
	r.Started = time.Now()
	r.Sizes = s
	r.Host = host{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), LoadStart: loadAverage(),
		GoVersion: runtime.Version(), MemoryTotal: memTotal()}
}

// fact records a per-unit cost for the scale model.
func (r *report) fact(key string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Facts == nil {
		r.Facts = map[string]float64{}
	}
	r.Facts[key] = v
}

// add records a figure without a baseline.
func (r *report) add(section, name, unit string, value float64, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Results = append(r.Results, result{Section: section, Name: name, Unit: unit, Value: value, Note: note})
	logf("RESULT %s / %s: %s %s", section, name, formatValue(value), unit)
}

// check records a figure without a baseline but with a target.
func (r *report) check(section, name, unit string, value float64, target string, met bool, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Results = append(r.Results, result{Section: section, Name: name, Unit: unit, Value: value, Target: target, Met: &met, Note: note})
	logf("RESULT %s / %s: %s %s (target %s: met=%v)", section, name, formatValue(value), unit, target, met)
}

// compare records a figure against its baseline. target describes the goal
// (empty for none) and met whether it holds.
func (r *report) compare(section, name, unit string, value float64, baseline string, baselineValue float64, target string, met bool, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := result{Section: section, Name: name, Unit: unit, Value: value, Baseline: baseline, BaselineValue: &baselineValue, Note: note}
	if baselineValue != 0 {
		ratio := value / baselineValue
		res.Ratio = &ratio
	}
	if target != "" {
		res.Target = target
		res.Met = &met
	}
	r.Results = append(r.Results, res)
	ratio := "n/a"
	if res.Ratio != nil {
		ratio = fmt.Sprintf("%.2fx", *res.Ratio)
	}
	logf("RESULT %s / %s: %s %s vs %s %s (%s)", section, name, formatValue(value), unit, baseline, formatValue(baselineValue), ratio)
}

func formatValue(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	case math.Abs(v) >= 0.1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// sectionOrder is the order of the measurements; other sections
// follow in the order they first appear.
var sectionOrder = []string{"convergence", "write amplification", "list and watch", "memory", "data path", "scheduling", "import parents", "recovery"}

// sorted groups the results by section, so that a section measured in
// several steps (at each ClusterSet size) is one table.
func (r *report) sorted() []result {
	out := slices.Clone(r.Results)
	order := slices.Clone(sectionOrder)
	for _, res := range out {
		if !slices.Contains(order, res.Section) {
			order = append(order, res.Section)
		}
	}
	idx := func(s string) int { return slices.Index(order, s) }
	slices.SortStableFunc(out, func(a, b result) int { return idx(a.Section) - idx(b.Section) })
	return out
}

// markdown renders the report: a header saying how and where it ran, then
// one table per section.
func (r *report) markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# mci benchmark results\n\n")
	fmt.Fprintf(&sb, "Run %s, profile **%s**, %s in all; %d CPUs, %s memory, %s, load average %s at the start and %s at the end.\n",
		r.Started.UTC().Format(time.RFC3339), r.Sizes.Profile, r.Finished.Sub(r.Started).Round(time.Second),
		r.Host.NumCPU, r.Host.MemoryTotal, r.Host.GoVersion, r.Host.LoadStart, r.Host.LoadEnd)
	if r.Failed {
		sb.WriteString("\n**Some benchmarks failed: the table is incomplete.**\n")
	}
	s := r.Sizes
	fmt.Fprintf(&sb, "\nSizes: convergence at %v clusters (%d samples per variant); scale at %d clusters x %d pools; %d LIST rounds; %d watchers; %d unrelated Services+EndpointSlices; data path %d req/s per path for %s, %d concurrent for throughput; streams of %d tokens at %v a token, %v at once, %d rounds; %d summary readers in the reconnect storm, %d in the exporter's fan-out.\n",
		s.ConvergenceClusters, s.ConvergenceSamples, s.ScaleClusters, s.PoolsPerCluster, s.ListRounds, s.Watchers, s.Unrelated,
		s.DataPathRate, s.DataPathDuration, s.DataPathConcurrency, s.StreamTokens, s.StreamTokenPaces, s.StreamConcurrency, s.StreamRounds,
		s.Importers, s.FanoutReaders)
	sb.WriteString("\nEach comparison ran interleaved (A, B, A, B) in this run; ratio = mci / baseline (below 1 is better for mci on times, bytes and writes; above 1 on rates).\n")
	section := ""
	for _, res := range r.sorted() {
		if res.Section != section {
			section = res.Section
			fmt.Fprintf(&sb, "\n## %s\n\n| measurement | mci | baseline | baseline value | ratio | target | note |\n|---|---:|---|---:|---:|---|---|\n", section)
		}
		base, baseVal, ratio, target := "", "", "", ""
		if res.Baseline != "" {
			base = res.Baseline
			baseVal = formatValue(*res.BaselineValue) + " " + res.Unit
		}
		if res.Ratio != nil {
			ratio = fmt.Sprintf("%.2f", *res.Ratio)
		}
		if res.Met != nil {
			mark := "met"
			if !*res.Met {
				mark = "NOT met"
			}
			target = res.Target + " (" + mark + ")"
		}
		fmt.Fprintf(&sb, "| %s | %s %s | %s | %s | %s | %s | %s |\n", res.Name, formatValue(res.Value), res.Unit, base, baseVal, ratio, target, res.Note)
	}
	sb.WriteString(scaleModel(r.Facts))
	return sb.String()
}

// write puts results.md and results.json in dir.
func (r *report) write(dir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Finished = time.Now()
	r.Host.LoadEnd = loadAverage()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	md := r.markdown()
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Println()
	fmt.Println(md)
	abs, _ := filepath.Abs(dir)
	fmt.Printf("Written to %s/results.md and results.json\n", abs)
	return nil
}

func median(d []time.Duration) time.Duration { return quantile.Nearest(d, 50) }

func medianFloat(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
