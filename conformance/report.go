package conformance

import (
	"bytes"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Report is what a run found, as report.yaml and report.html carry it.
type Report struct {
	// Suite names this suite; the API is what it checks.
	Suite          string           `json:"suite"`
	API            []string         `json:"api"`
	Implementation Implementation   `json:"implementation"`
	Clusters       []ReportCluster  `json:"clusters"`
	Started        time.Time        `json:"started"`
	Seconds        float64          `json:"seconds"`
	PollTimeout    string           `json:"pollTimeout"`
	Summary        map[Label]Counts `json:"summary"`
	Tests          []Result         `json:"tests"`
}

// Implementation is what the report says of the implementation under test.
type Implementation struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

// ReportCluster is one cluster under test.
type ReportCluster struct {
	Context           string `json:"context"`
	Name              string `json:"name"`
	KubernetesVersion string `json:"kubernetesVersion"`
	ServedBy          string `json:"servedBy"`
}

// Counts are the outcomes of one label's tests.
type Counts struct {
	Pass int `json:"pass"`
	Fail int `json:"fail"`
	Skip int `json:"skip"`
}

// Passed says whether no test failed.
func (r *Report) Passed() bool {
	for _, c := range r.Summary {
		if c.Fail > 0 {
			return false
		}
	}
	return true
}

// Report builds the report of results, gathered since started.
func (s *Suite) Report(started time.Time, results []Result) *Report {
	r := &Report{
		Suite:       "mci-conformance: InferencePoolImport and InferencePool export",
		API:         []string{importsGVR.GroupVersion().String() + " InferencePoolImport", poolsGVR.GroupVersion().String() + " InferencePool"},
		Started:     started.UTC().Round(time.Second),
		Seconds:     time.Since(started).Round(time.Second).Seconds(),
		PollTimeout: s.cfg.PollTimeout.String(),
		Summary:     map[Label]Counts{},
		Tests:       results,
	}
	r.Implementation = Implementation{Name: s.cfg.ImplementationName, Version: s.cfg.ImplementationVersion}
	if r.Implementation.Name == "" {
		s.mu.Lock()
		var names []string
		for n := range s.controllers {
			names = append(names, n)
		}
		s.mu.Unlock()
		sort.Strings(names)
		r.Implementation.Name = strings.Join(names, ", ")
		if r.Implementation.Name == "" {
			r.Implementation.Name = "unknown (no import was read)"
		}
	}
	for _, c := range s.clusters {
		r.Clusters = append(r.Clusters, ReportCluster{Context: c.Context, Name: c.Name, KubernetesVersion: c.KubernetesVersion, ServedBy: c.ServedBy})
	}
	for _, res := range results {
		c := r.Summary[res.Label]
		switch res.Outcome {
		case Pass:
			c.Pass++
		case Fail:
			c.Fail++
		case Skip:
			c.Skip++
		}
		r.Summary[res.Label] = c
	}
	return r
}

// Write writes report.yaml and report.html into dir.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	data, err := yaml.Marshal(r)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.yaml"), data, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	var html bytes.Buffer
	if err := reportTemplate.Execute(&html, r); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.html"), html.Bytes(), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// Labels are the labels in the order the report shows them.
func (r *Report) Labels() []Label {
	var out []Label
	for _, l := range []Label{Required, Optional, Extended} {
		if _, ok := r.Summary[l]; ok {
			out = append(out, l)
		}
	}
	return out
}

// TestsOf are the results of one label.
func (r *Report) TestsOf(l Label) []Result {
	return slices.DeleteFunc(slices.Clone(r.Tests), func(res Result) bool { return res.Label != l })
}

// The HTML report is one static page: no script, no external resource.
var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.Suite}}: {{.Implementation.Name}}</title>
<style>
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.pass { color: #176f2c; font-weight: bold; }
.fail { color: #b00020; font-weight: bold; }
.skip { color: #8a6d00; font-weight: bold; }
pre { white-space: pre-wrap; margin: 0; font-size: 0.85em; }
.req { font-size: 0.85em; color: #555; }
</style>
</head>
<body>
<h1>{{.Suite}}</h1>
<table>
<tr><th>implementation</th><td>{{.Implementation.Name}}{{with .Implementation.Version}} {{.}}{{end}}</td></tr>
<tr><th>API</th><td>{{range $i, $a := .API}}{{if $i}}; {{end}}{{$a}}{{end}}</td></tr>
<tr><th>started</th><td>{{.Started.Format "2006-01-02 15:04:05 MST"}}, {{.Seconds}} s, poll timeout {{.PollTimeout}}</td></tr>
</table>
<h2>Clusters</h2>
<table>
<tr><th>name</th><th>context</th><th>Kubernetes</th><th>InferencePoolImport served by</th></tr>
{{range .Clusters}}<tr><td>{{.Name}}</td><td>{{.Context}}</td><td>{{.KubernetesVersion}}</td><td>{{.ServedBy}}</td></tr>
{{end}}</table>
<h2>Summary</h2>
<table>
<tr><th>label</th><th>pass</th><th>fail</th><th>skip</th></tr>
{{range $l := .Labels}}{{with index $.Summary $l}}<tr><td>{{$l}}</td><td>{{.Pass}}</td><td>{{.Fail}}</td><td>{{.Skip}}</td></tr>{{end}}
{{end}}</table>
{{range $l := .Labels}}
<h2>{{$l}}</h2>
<table>
<tr><th>test</th><th>outcome</th><th>seconds</th></tr>
{{range $.TestsOf $l}}<tr><td>{{.Name}}<div class="req">{{.Requirement}}</div></td><td class="{{.Outcome}}">{{.Outcome}}{{with .Reason}}<pre>{{.}}</pre>{{end}}</td><td>{{.Seconds}}</td></tr>
{{end}}</table>
{{end}}
</body>
</html>
`))
