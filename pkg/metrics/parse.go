// Package metrics reads load from Prometheus /metrics endpoints: Parse turns
// one vLLM model server's exposition into scheduling.Metrics, Scraper keeps
// the latest metrics of a changing set of model servers, and ParsePool reads
// the pool-level gauges an Endpoint Picker exposes, under the names of
// either upstream EPP (Gateway API Inference Extension or llm-d).
package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/mci-dev/mci/pkg/scheduling"
)

// The vLLM metric and label names Parse reads.
const (
	WaitingQueueMetric       = "vllm:num_requests_waiting"
	RunningRequestsMetric    = "vllm:num_requests_running"
	KVCacheUsageMetric       = "vllm:kv_cache_usage_perc"
	LegacyKVCacheUsageMetric = "vllm:gpu_cache_usage_perc" // vLLM before kv_cache_usage_perc
	LoRAInfoMetric           = "vllm:lora_requests_info"

	RunningAdaptersLabel = "running_lora_adapters"
	WaitingAdaptersLabel = "waiting_lora_adapters"
	MaxLoRALabel         = "max_lora"
)

// ErrMissingMetric means the exposition lacks a metric Parse needs. A server
// without them is not a (supported) vLLM server; its load is unknown, and
// reporting zero instead would make it look idle.
var ErrMissingMetric = errors.New("missing metric")

// maxQueue caps a reported queue length so that converting it to int cannot
// overflow; any queue this long is as bad as any other.
const maxQueue = 1 << 30

// Parse reads a Prometheus text exposition of a vLLM server to the end (bound
// r; the Scraper does). UpdatedAt is left zero: when the metrics were
// observed is the caller's knowledge.
//
// A server may expose several series of a metric (one per model_name, or per
// engine when data parallel): the waiting queues are summed, since they all
// wait on this server, and the highest KV cache usage is taken, since a
// request may land on the fullest engine. Of several lora_requests_info
// series, the newest (its value is a timestamp) wins.
func Parse(r io.Reader) (*scheduling.Metrics, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	families, err := parseText(bytes.NewReader(relevantLines(body, readNames[:])))
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}

	m := &scheduling.Metrics{}

	waiting, ok := families[WaitingQueueMetric]
	if !ok {
		return nil, fmt.Errorf("%w %s", ErrMissingMetric, WaitingQueueMetric)
	}
	queue := 0.0
	if err := eachValue(waiting, func(v float64) error {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("value %v is not a queue length", v)
		}
		queue += v
		return nil
	}); err != nil {
		return nil, err
	}
	m.WaitingQueue = int(math.Round(min(queue, maxQueue)))

	kv, ok := families[KVCacheUsageMetric]
	if !ok {
		if kv, ok = families[LegacyKVCacheUsageMetric]; !ok {
			return nil, fmt.Errorf("%w %s (or %s)", ErrMissingMetric, KVCacheUsageMetric, LegacyKVCacheUsageMetric)
		}
	}
	if err := eachValue(kv, func(v float64) error {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("value %v is not a KV cache usage", v)
		}
		// vLLM reports a fraction despite the name. A value above 1 is a
		// rounding artifact or a server reporting percent; either way
		// "full" is the safe reading.
		m.KVCacheUsage = max(m.KVCacheUsage, min(v, 1))
		return nil
	}); err != nil {
		return nil, err
	}

	// The running requests are optional: a server without them has its
	// batch occupancy unknown (RunningKnown false), as the EPP says.
	if running, ok := families[RunningRequestsMetric]; ok {
		total := 0.0
		if err := eachValue(running, func(v float64) error {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("value %v is not a count of requests", v)
			}
			total += v
			return nil
		}); err != nil {
			return nil, err
		}
		m.RunningRequests, m.RunningKnown = int(math.Round(min(total, maxQueue))), true
	}

	// lora_requests_info is absent when the server does not serve adapters:
	// no adapters and no room for any, which is what the zero values say.
	m.ActiveAdapters, m.WaitingAdapters = sets.New[string](), sets.New[string]()
	if info, ok := families[LoRAInfoMetric]; ok {
		if err := parseLoRAInfo(info, m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// relevantLines keeps the lines of body that belong to the families names
// (those Parse or ParsePool reads) (their samples and their HELP and TYPE comments), compacting them in
// place. A vLLM /metrics page is mostly latency histograms, and parsing them
// all costs about ten times more than the rest of a scrape, at ten scrapes a
// second per model server. It also means a malformed line of a family Parse
// does not read cannot hide the load of a server.
//
// Dropped: blank lines, comments other than HELP and TYPE, and lines of any
// other metric (a HELP or TYPE naming it, or a sample starting with its
// plain or quoted name). Everything else is kept for the parser to judge, so
// that input which is not an exposition at all (an HTML error page, binary
// data) fails as a parse error rather than vanishing.
func relevantLines(body []byte, names []string) []byte {
	out := body[:0]
	for len(body) > 0 {
		end := bytes.IndexByte(body, '\n')
		if end < 0 {
			end = len(body) - 1
		}
		line := body[:end+1]
		body = body[end+1:]
		if keepLine(line, names) {
			// out never overtakes the line being read: append's copy is safe.
			out = append(out, line...)
		}
	}
	return out
}

func keepLine(line []byte, names []string) bool {
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 || line[0] == '\n' || line[0] == '\r' {
		return false
	}
	switch c := line[0]; {
	case c == '#':
		// "# HELP name ..." or "# TYPE name ..."; any other comment is
		// dropped, as the parser would ignore it.
		rest := bytes.TrimLeft(line[1:], " \t")
		if !bytes.HasPrefix(rest, []byte("HELP")) && !bytes.HasPrefix(rest, []byte("TYPE")) {
			return false
		}
		rest = rest[len("HELP"):]
		if len(rest) == 0 || (rest[0] != ' ' && rest[0] != '\t') {
			return false
		}
		return startsWithName(bytes.TrimLeft(rest, " \t"), names)
	case c == '{':
		// A name quoted inside the braces: {"vllm:...", label="..."} 1.
		// Without one the line is malformed: the parser says so.
		rest := bytes.TrimLeft(line[1:], " \t")
		return len(rest) == 0 || rest[0] != '"' || startsWithName(rest, names)
	case c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'):
		return startsWithName(line, names)
	default:
		return true
	}
}

// readNames are the metric families Parse reads.
var readNames = [...]string{WaitingQueueMetric, RunningRequestsMetric, KVCacheUsageMetric, LegacyKVCacheUsageMetric, LoRAInfoMetric}

// startsWithName reports whether b starts with one of names, plain or
// quoted. A quoted name with escapes counts as one: telling is the parser's
// job.
func startsWithName(b []byte, names []string) bool {
	if len(b) > 0 && b[0] == '"' {
		end := bytes.IndexAny(b[1:], "\"\\")
		if end < 0 || b[1+end] != '"' {
			return true
		}
		name := b[1 : 1+end]
		for _, n := range names {
			if string(name) == n {
				return true
			}
		}
		return false
	}
	for _, n := range names {
		if len(b) > len(n) && string(b[:len(n)]) == n {
			switch b[len(n)] {
			case '{', ' ', '\t', '\n', '\r':
				return true
			}
		}
	}
	return false
}

// parseText runs the Prometheus text parser. The parser of
// prometheus/common v0.70 panics on some malformed input (a line "{}" after a
// HELP line; prometheus/common#922 fixed it for later versions, which this
// module cannot use yet), and /metrics bodies come from the network, so a
// panic is turned into an error rather than trusted not to happen.
func parseText(r io.Reader) (families map[string]*dto.MetricFamily, err error) {
	defer func() {
		if p := recover(); p != nil {
			families, err = nil, fmt.Errorf("malformed exposition (parser panicked: %v)", p)
		}
	}()
	// vLLM names carry colons, which the legacy scheme allows in metric
	// names; UTF-8 validation also accepts servers that quote names.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(r)
}

// eachValue calls f with the value of every series of a gauge-like family.
func eachValue(mf *dto.MetricFamily, f func(float64) error) error {
	for _, s := range mf.GetMetric() {
		v, err := value(mf, s)
		if err == nil {
			err = f(v)
		}
		if err != nil {
			return fmt.Errorf("metric %s: %w", mf.GetName(), err)
		}
	}
	return nil
}

// value returns the sample of a gauge, untyped or counter series. Servers
// differ in how they type these metrics, and a missing TYPE line makes a
// family untyped.
func value(mf *dto.MetricFamily, s *dto.Metric) (float64, error) {
	switch mf.GetType() {
	case dto.MetricType_GAUGE:
		return s.GetGauge().GetValue(), nil
	case dto.MetricType_UNTYPED:
		return s.GetUntyped().GetValue(), nil
	case dto.MetricType_COUNTER:
		return s.GetCounter().GetValue(), nil
	default:
		return 0, fmt.Errorf("type %s has no single value", mf.GetType())
	}
}

func parseLoRAInfo(mf *dto.MetricFamily, m *scheduling.Metrics) error {
	var newest *dto.Metric
	newestAt := math.Inf(-1)
	for _, s := range mf.GetMetric() {
		at, err := value(mf, s)
		if err != nil {
			return fmt.Errorf("metric %s: %w", mf.GetName(), err)
		}
		if newest == nil || at > newestAt {
			newest, newestAt = s, at
		}
	}
	if newest == nil {
		return nil
	}
	for _, l := range newest.GetLabel() {
		switch l.GetName() {
		case RunningAdaptersLabel:
			m.ActiveAdapters = adapterSet(l.GetValue())
		case WaitingAdaptersLabel:
			m.WaitingAdapters = adapterSet(l.GetValue())
		case MaxLoRALabel:
			if l.GetValue() == "" {
				continue
			}
			n, err := strconv.Atoi(l.GetValue())
			if err != nil || n < 0 {
				return fmt.Errorf("metric %s: label %s=%q is not a count of adapters", mf.GetName(), MaxLoRALabel, l.GetValue())
			}
			m.MaxLoRA = n
		}
	}
	return nil
}

// adapterSet splits a comma-separated list of adapter names.
func adapterSet(list string) sets.Set[string] {
	s := sets.New[string]()
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.TrimSpace(name); name != "" {
			s.Insert(name)
		}
	}
	return s
}

// ErrTooLarge is returned by LimitReader past its limit.
var ErrTooLarge = errors.New("response body too large")

// LimitReader bounds the exposition that Parse or ParsePool reads from a
// network peer: the guard every scrape of a /metrics page goes through.
// Unlike io.LimitReader, which ends with io.EOF, it fails past n bytes
// (ErrTooLarge), so that an oversized page is refused rather than parsed
// truncated.
func LimitReader(r io.Reader, n int64) io.Reader { return &limitedReader{r: r, left: n} }

type limitedReader struct {
	r    io.Reader
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// Tell a body of exactly the limit from a longer one.
		var one [1]byte
		if n, err := l.r.Read(one[:]); n > 0 {
			return 0, ErrTooLarge
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}
