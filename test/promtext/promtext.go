// Package promtext is the tests' one reader of the Prometheus text
// exposition (/metrics of mci's binaries, of kube-apiserver and of the test
// servers): a page parsed with expfmt, read by series as they are written
// ("name{label=\"value\"}"), by metric name, or summed over a label subset.
package promtext

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is a parsed exposition: its metric families by name.
type Metrics map[string]*dto.MetricFamily

// Sample is one series of a metric: its labels and value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Parse reads a text exposition.
func Parse(body []byte) (Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		return nil, fmt.Errorf("parsing the metrics: %w", err)
	}
	return Metrics(families), nil
}

// client talks to loopback servers directly, whatever the environment's
// proxy settings.
var client = func() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	return &http.Client{Transport: tr}
}()

// Get reads and parses the page at url (plain HTTP, no credentials); a
// status other than 200 is an error.
func Get(ctx context.Context, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return Parse(body)
}

// Lookup finds series, written as in the exposition (`name` or
// `name{a="x",b="y"}`, labels in any order), among the counters, gauges
// and untyped metrics; its labels must be exactly the series' labels. A
// series that cannot be parsed is an error, so that a typo in a test
// does not read as an absent series.
func (m Metrics) Lookup(series string) (float64, bool, error) {
	name, labels, err := parseSeries(series)
	if err != nil {
		return 0, false, err
	}
	for _, s := range m.Samples(name) {
		if maps.Equal(s.Labels, labels) {
			return s.Value, true, nil
		}
	}
	return 0, false, nil
}

// SumMatching adds the series of selector's metric whose labels include
// selector's (`name{code="503"}` sums every series of name with that
// code; `name` sums them all).
func (m Metrics) SumMatching(selector string) (float64, error) {
	name, labels, err := parseSeries(selector)
	if err != nil {
		return 0, err
	}
	return m.Sum(name, labels), nil
}

// parseSeries reads a series written as in the exposition, with the
// exposition's own parser.
func parseSeries(series string) (string, map[string]string, error) {
	parsed, err := Parse([]byte(series + " 0\n"))
	if err == nil && len(parsed) == 1 {
		for name, f := range parsed {
			return name, labelMap(f.GetMetric()[0]), nil
		}
	}
	return "", nil, fmt.Errorf("%q is not one series of the text exposition: %v", series, err)
}

// Value is Lookup's value, 0 when the series is absent; a series that
// cannot be parsed (a mistake in the test itself) fails the test.
func (m Metrics) Value(t testing.TB, series string) float64 {
	t.Helper()
	v, _, err := m.Lookup(series)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return v
}

// Samples are the series of the counter, gauge or untyped metric name,
// in the order of the exposition; none when it is absent.
func (m Metrics) Samples(name string) []Sample {
	var out []Sample
	for _, x := range m[name].GetMetric() {
		var v float64
		switch {
		case x.GetCounter() != nil:
			v = x.GetCounter().GetValue()
		case x.GetGauge() != nil:
			v = x.GetGauge().GetValue()
		case x.GetUntyped() != nil:
			v = x.GetUntyped().GetValue()
		default:
			continue
		}
		out = append(out, Sample{Labels: labelMap(x), Value: v})
	}
	return out
}

// HistogramMatching adds the observations of selector's histogram whose
// labels include selector's: their count and their sum.
func (m Metrics) HistogramMatching(selector string) (count uint64, sum float64, err error) {
	name, labels, err := parseSeries(selector)
	if err != nil {
		return 0, 0, err
	}
	for _, x := range m[name].GetMetric() {
		if h := x.GetHistogram(); h != nil && includes(labelMap(x), labels) {
			count += h.GetSampleCount()
			sum += h.GetSampleSum()
		}
	}
	return count, sum, nil
}

// Sum adds the series of name whose labels include every one of labels
// (all of them when labels is empty).
func (m Metrics) Sum(name string, labels map[string]string) float64 {
	var sum float64
	for _, s := range m.Samples(name) {
		if includes(s.Labels, labels) {
			sum += s.Value
		}
	}
	return sum
}

func includes(labels, subset map[string]string) bool {
	for k, v := range subset {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func labelMap(x *dto.Metric) map[string]string {
	out := make(map[string]string, len(x.GetLabel()))
	for _, l := range x.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
