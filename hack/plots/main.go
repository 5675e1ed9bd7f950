// Command plots draws the figures of docs/performance.md as SVG from the
// results files of `make bench` (the shape test/bench writes to
// _output/bench/results.json) and `make bench-routing` (test/benchrouting's
// _output/bench-routing/results.json).
//
// Each SVG names the results file it was drawn from in a comment, so that
// a test can draw it again from that file and find a plot whose data no
// longer matches. Drawing is deterministic: gonum's SVG canvas measures
// text with the fonts it carries and writes no dates.
//
// Results under _output (a run of make bench on this machine) are first
// kept: copied into docs/performance-data under the time the run started,
// and the plots name the copy, which is what gets checked in beside them.
//
//	go run ./hack/plots    # the latest make bench and make bench-routing
//	go run ./hack/plots -results docs/performance-data/bench-2026-11-28T0442Z.json
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
	"k8s.io/klog/v2"
)

// result is the part of test/bench's result that the plots read.
type result struct {
	Section       string   `json:"section"`
	Name          string   `json:"name"`
	Unit          string   `json:"unit"`
	Value         float64  `json:"value"`
	Baseline      string   `json:"baseline,omitempty"`
	BaselineValue *float64 `json:"baselineValue,omitempty"`
}

// routingPolicy is the part of one routing's figures on one workload of
// test/benchrouting that the plots read; a figure a workload does not
// have (no hit ratio without shared prefixes) is absent.
type routingPolicy struct {
	PrefixHit *float64 `json:"prefix_hit_ratio"`
}

// report is either results file: test/bench's (Results) or
// test/benchrouting's (Workloads).
type report struct {
	Started   time.Time `json:"started"`
	Results   []result  `json:"results"`
	Workloads map[string]struct {
		Policies map[string]*routingPolicy `json:"policies"`
	} `json:"workloads"`
	Failed bool `json:"failed"`
}

// kind names the make target a results file comes from.
func (r report) kind() string {
	if len(r.Workloads) > 0 {
		return "bench-routing"
	}
	return "bench"
}

// figures looks rows up by section and name: a row a plot needs and the
// results do not hold is an error naming it, never a zero drawn as data.
type figures struct {
	rows map[string]result
	errs []error
}

func (f *figures) row(section, name, unit string) result {
	r, ok := f.rows[section+"\x00"+name]
	switch {
	case !ok:
		f.errs = append(f.errs, fmt.Errorf("no result %q in section %q", name, section))
	case r.Unit != unit:
		f.errs = append(f.errs, fmt.Errorf("result %q is in %s, the plot expects %s", name, r.Unit, unit))
	}
	return r
}

func (f *figures) value(section, name, unit string) float64 {
	return f.row(section, name, unit).Value
}

func (f *figures) baseline(section, name, unit string) float64 {
	r := f.row(section, name, unit)
	if r.BaselineValue == nil {
		if _, ok := f.rows[section+"\x00"+name]; ok {
			f.errs = append(f.errs, fmt.Errorf("result %q has no baseline value", name))
		}
		return 0
	}
	return *r.BaselineValue
}

// source is the comment that names the results a plot was drawn from.
var source = regexp.MustCompile(`<!-- Drawn by hack/plots from (\S+); regenerate with make plots -->`)

// SourceOf returns the results file an SVG of this program names.
func SourceOf(svg []byte) (string, error) {
	m := source.FindSubmatch(svg)
	if m == nil {
		return "", errors.New("the SVG names no results file: it was not drawn by hack/plots")
	}
	return string(m[1]), nil
}

func parse(data []byte, name string) (report, error) {
	var rep report
	if err := json.Unmarshal(data, &rep); err != nil {
		return rep, fmt.Errorf("reading the results %s: %w", name, err)
	}
	if len(rep.Results) == 0 && len(rep.Workloads) == 0 {
		return rep, fmt.Errorf("the results %s hold neither bench results nor routing workloads", name)
	}
	if rep.Failed {
		return rep, fmt.Errorf("the results %s are of a run that missed a target or failed: its figures are not the page's", name)
	}
	return rep, nil
}

// Render draws every plot from the results in data, which name as the
// results file (a path relative to the repository root). It returns the
// SVGs by file name.
func Render(data []byte, name string) (map[string][]byte, error) {
	rep, err := parse(data, name)
	if err != nil {
		return nil, err
	}
	f := &figures{rows: map[string]result{}}
	for _, r := range rep.Results {
		f.rows[r.Section+"\x00"+r.Name] = r
	}
	var plots map[string]*plot.Plot
	if rep.kind() == "bench-routing" {
		plots = map[string]*plot.Plot{"routing-hit-ratio.svg": hitRatio(f, rep)}
	} else {
		plots = map[string]*plot.Plot{
			"convergence.svg": convergence(f),
			"memory.svg":      memory(f),
			"datapath.svg":    dataPath(f),
		}
	}
	if err := errors.Join(f.errs...); err != nil {
		return nil, fmt.Errorf("the results %s lack what the plots need: %w", name, err)
	}
	out := map[string][]byte{}
	for file, p := range plots {
		svg, err := encode(p, name)
		if err != nil {
			return nil, fmt.Errorf("drawing %s: %w", file, err)
		}
		out[file] = svg
	}
	return out, nil
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // mci, summary mode
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // mci, full mode
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, // the physical floor
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // the CRD fan-out
}

// convergence plots the export change's p99 against the ClusterSet's size:
// both modes of mci, the single-hop floor and the CRD fan-out.
func convergence(f *figures) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Export change seen in another cluster, p99"
	p.X.Label.Text = "clusters"
	p.Y.Label.Text = "ms"
	p.Legend.Top = true
	p.Legend.Left = true
	sizes := []int{3, 10, 20}
	series := []struct {
		label string
		at    func(clusters int) float64
	}{
		{"mci, summary mode", func(c int) float64 {
			return f.value("convergence", fmt.Sprintf("%d clusters, summary mode, export change: p99 vs single-hop floor", c), "ms")
		}},
		{"mci, full mode", func(c int) float64 {
			return f.value("convergence", fmt.Sprintf("%d clusters, full mode, export change: p99 vs single-hop floor", c), "ms")
		}},
		{"single-hop floor", func(c int) float64 {
			return f.baseline("convergence", fmt.Sprintf("%d clusters, summary mode, export change: p99 vs single-hop floor", c), "ms")
		}},
		{"CRD fan-out", func(c int) float64 {
			return f.baseline("convergence", fmt.Sprintf("%d clusters, summary mode, export change: p99 vs CRD fan-out", c), "ms")
		}},
	}
	for i, s := range series {
		xys := make(plotter.XYs, len(sizes))
		for j, c := range sizes {
			xys[j] = plotter.XY{X: float64(c), Y: s.at(c)}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s: %w", s.label, err))
			continue
		}
		line.Color = palette[i]
		line.Width = vg.Points(1.5)
		points.Color = palette[i]
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(s.label, line, points)
	}
	p.X.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 3, Label: "3"}, {Value: 10, Label: "10"}, {Value: 20, Label: "20"}})
	p.Y.Min = 0
	return p
}

// memory plots what the whole ClusterSet holds for 10 x 1,000 exported
// pools: the heap of every mci replica in each mode, the CRD fan-out's etcd.
func memory(f *figures) *plot.Plot {
	const name = "%s mode: state of 10000 exported pools, whole ClusterSet: mci heap (all 10 replicas) vs baseline etcd (all members)"
	summary := f.row("memory", fmt.Sprintf(name, "summary"), "MiB")
	full := f.row("memory", fmt.Sprintf(name, "full"), "MiB")
	fanOut := f.baseline("memory", fmt.Sprintf(name, "summary"), "MiB")
	return bars(f, "State of 10 x 1,000 exported pools, whole ClusterSet", "MiB",
		[]string{"mci, summary mode\n(heap)", "mci, full mode\n(heap)", "CRD fan-out\n(etcd)"},
		[]float64{summary.Value, full.Value, fanOut},
		[]color.Color{palette[0], palette[1], palette[3]})
}

// dataPath plots a completion's latency through the sidecar against the
// gateway talking to the EPP itself, at p50 and p99.
func dataPath(f *figures) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Completion latency, open loop at 200 req/s per path"
	p.Y.Label.Text = "ms"
	p.Legend.Top = true
	p.Legend.Left = true
	const (
		viaSidecar    = "p%s latency, gateway -> sidecar -> EPP -> simulator"
		relayedVsSkip = "p%s latency, response phase relayed to the EPP"
	)
	paths := []struct {
		label string
		at    func(q string) float64
	}{
		{"gateway -> EPP (no mci)", func(q string) float64 { return f.baseline("data path", fmt.Sprintf(viaSidecar, q), "ms") }},
		{"through mci-sidecar", func(q string) float64 { return f.value("data path", fmt.Sprintf(viaSidecar, q), "ms") }},
		{"through mci-sidecar, response phase not relayed", func(q string) float64 {
			return f.baseline("data path", fmt.Sprintf(relayedVsSkip, q), "ms")
		}},
	}
	width := vg.Points(22)
	colors := []color.Color{palette[2], palette[0], palette[1]}
	for i, path := range paths {
		b, err := plotter.NewBarChart(plotter.Values{path.at("50"), path.at("99")}, width)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s: %w", path.label, err))
			continue
		}
		b.Color = colors[i]
		b.LineStyle.Width = 0
		b.Offset = vg.Length(i-1) * width
		p.Add(b)
		p.Legend.Add(path.label, b)
	}
	p.NominalX("p50", "p99")
	return p
}

// hitRatio plots the prefix-cache hit ratio of PrefixAffinity, the hub
// configuration and the oracle on every workload with shared prefixes
// (those where the oracle has one), in the order of their names.
func hitRatio(f *figures, rep report) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Prefix-cache hit ratio per workload"
	p.Legend.Top = true
	p.Legend.Left = true
	var workloads []string
	for name, w := range rep.Workloads {
		if o := w.Policies["Oracle"]; o != nil && o.PrefixHit != nil {
			workloads = append(workloads, name)
		}
	}
	slices.Sort(workloads)
	if len(workloads) == 0 {
		f.errs = append(f.errs, errors.New("no workload has the oracle's hit ratio"))
		return p
	}
	policies := []struct{ name, label string }{
		{"PrefixAffinity", "mci PrefixAffinity"},
		{"HubReference", "hub configuration"},
		{"Oracle", "oracle (a group pinned to a cluster)"},
	}
	width := vg.Points(14)
	colors := []color.Color{palette[0], palette[2], palette[1]}
	for i, pol := range policies {
		vs := make(plotter.Values, len(workloads))
		for j, w := range workloads {
			r := rep.Workloads[w].Policies[pol.name]
			if r == nil || r.PrefixHit == nil {
				f.errs = append(f.errs, fmt.Errorf("workload %q has no hit ratio of %s", w, pol.name))
				continue
			}
			vs[j] = *r.PrefixHit
		}
		b, err := plotter.NewBarChart(vs, width)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s: %w", pol.label, err))
			continue
		}
		b.Color = colors[i]
		b.LineStyle.Width = 0
		b.Offset = vg.Length(i-1) * width
		p.Add(b)
		p.Legend.Add(pol.label, b)
	}
	labels := make([]string, len(workloads))
	for i, w := range workloads {
		labels[i] = strings.ReplaceAll(w, "-", "-\n")
	}
	p.NominalX(labels...)
	p.Y.Min, p.Y.Max = 0, 1.25
	return p
}

// bars is a bar chart of one value per label.
func bars(f *figures, title, unit string, labels []string, values []float64, colors []color.Color) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = unit
	width := vg.Points(40)
	for i, v := range values {
		vs := make(plotter.Values, len(values))
		vs[i] = v
		b, err := plotter.NewBarChart(vs, width)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s: %w", labels[i], err))
			continue
		}
		b.Color = colors[i]
		b.LineStyle.Width = 0
		p.Add(b)
	}
	p.NominalX(labels...)
	return p
}

// encode writes a plot as SVG with the comment naming its results.
func encode(p *plot.Plot, name string) ([]byte, error) {
	c := vgsvg.NewWith(vgsvg.UseWH(6*vg.Inch, 3.5*vg.Inch))
	p.Draw(draw.New(c))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	header, body, ok := bytes.Cut(buf.Bytes(), []byte("\n"))
	if !ok {
		return nil, errors.New("the SVG has no header line")
	}
	var out bytes.Buffer
	out.Write(header)
	fmt.Fprintf(&out, "\n<!-- Drawn by hack/plots from %s; regenerate with make plots -->\n", name)
	out.Write(body)
	return out.Bytes(), nil
}

func main() {
	results := flag.String("results", "_output/bench/results.json,_output/bench-routing/results.json", "the results files of make bench and make bench-routing to draw, comma-separated, relative to the repository root")
	keep := flag.String("keep", "docs/performance-data", "where results from outside it are copied, named by their start time, before they are drawn")
	out := flag.String("out", "docs/images/performance", "the directory the SVGs are written to")
	flag.Parse()
	for _, r := range strings.Split(*results, ",") {
		if err := run(r, *keep, *out); err != nil {
			klog.ErrorS(err, "Drawing the performance plots failed", "results", r)
			os.Exit(1)
		}
	}
}

func run(results, keep, out string) error {
	data, err := os.ReadFile(results)
	if err != nil {
		return fmt.Errorf("reading the results (run make bench and make bench-routing first, or name kept results with -results): %w", err)
	}
	results = filepath.ToSlash(filepath.Clean(results))
	if keep = filepath.ToSlash(filepath.Clean(keep)); !strings.HasPrefix(results, keep+"/") {
		rep, err := parse(data, results)
		if err != nil {
			return err
		}
		kept := keep + "/" + rep.kind() + "-" + rep.Started.UTC().Format("2006-01-02T1504Z") + ".json"
		if err := os.MkdirAll(keep, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", keep, err)
		}
		if err := os.WriteFile(kept, data, 0o644); err != nil {
			return fmt.Errorf("keeping the results: %w", err)
		}
		klog.InfoS("Kept the results to draw from", "from", results, "to", kept)
		results = kept
	}
	svgs, err := Render(data, results)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	for file, svg := range svgs {
		if err := os.WriteFile(filepath.Join(out, file), svg, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
		klog.InfoS("Wrote a plot", "file", filepath.Join(out, file), "results", results)
	}
	return nil
}
