package soak

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
)

// sample is one reading of an mci process's runtime from its /metrics.
type sample struct {
	At        time.Time `json:"at"`
	PID       int       `json:"pid"`
	HeapBytes float64   `json:"heap_alloc_bytes"`
	// NextGC is the heap size at which the next collection starts, set at
	// the end of each one to the live heap it marked times 1+GOGC/100
	// (no mci process sets GOGC: 2).
	NextGC     float64 `json:"next_gc_bytes"`
	Goroutines float64 `json:"goroutines"`
	FDs        float64 `json:"open_fds"`
	// Watches are the watch requests an mci-apiserver replica serves
	// (apiserver_longrunning_requests, verb WATCH): the aggregator sends a
	// cluster's watches through one connection, to one replica, and moves
	// them all when that connection breaks (a replica restarted).
	Watches float64 `json:"watches,omitempty"`
}

// scraped is one mci process: where its /metrics is and how to read it.
type scraped struct {
	Name string
	// Cluster is the cluster of an mci-apiserver replica ("" for the
	// others), whose replicas share the cluster's watches.
	Cluster string
	pid     func() int
	get     func(ctx context.Context) ([]byte, error)
	// heapProfile reads its heap profile after a collection (pprof's
	// /debug/pprof/heap?gc=1); nil for processes that serve no pprof
	// (mci-sidecar, mci-epp).
	heapProfile func(ctx context.Context) ([]byte, error)
	// profiles are the heap profiles saved, in order.
	profiles []string

	samples []sample
	errors  int
	lastErr string
}

// mciProcesses are every mci-apiserver replica, mci-sidecar and the
// mci-epps. The replicas serve /metrics on their secure port to the
// cluster's admin (authorized by the cluster like any request); the
// sidecar and the EPPs serve it in the clear on port 9090.
func mciProcesses(cs *localclusterset.ClusterSet) ([]*scraped, error) {
	var out []*scraped
	pidOf := func(name string) func() int {
		return func() int {
			for _, p := range cs.Processes() {
				if p.Name == name && p.Alive {
					return p.PID
				}
			}
			for _, p := range cs.DataPathServers() {
				if p.Name == name && p.Alive {
					return p.PID
				}
			}
			return 0
		}
	}
	for _, c := range cs.Clusters {
		for r, port := range c.MCIAPIServerReplicaPorts {
			name := c.Name + "-mci-apiserver"
			if r > 0 {
				name = fmt.Sprintf("%s-%d", name, r)
			}
			config := rest.CopyConfig(c.Config)
			config.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
			config.TLSClientConfig.CAData = nil
			config.TLSClientConfig.CAFile = filepath.Join(cs.Dir, "pki", "mci-serving-ca.crt")
			config.Timeout = 5 * time.Second
			// Uncompressed: a gzip writer per scrape is heap the replica
			// would hold until the next collections, the soak's own noise
			// in the figure it judges.
			config.DisableCompression = true
			// One client, kept: a new one per reading would open a
			// connection each time, which the server keeps while idle.
			client, err := kubernetes.NewForConfig(config)
			if err != nil {
				return nil, err
			}
			rc := client.Discovery().RESTClient()
			out = append(out, &scraped{Name: name, Cluster: c.Name, pid: pidOf(name),
				get: func(ctx context.Context) ([]byte, error) {
					return rc.Get().AbsPath("/metrics").DoRaw(ctx)
				},
				heapProfile: func(ctx context.Context) ([]byte, error) {
					return rc.Get().AbsPath("/debug/pprof/heap").Param("gc", "1").DoRaw(ctx)
				},
			})
		}
	}
	httpClient := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	for _, s := range cs.DataPathServers() {
		if !strings.HasSuffix(s.Name, "-mci-sidecar") && !strings.HasSuffix(s.Name, "-mci-epp") {
			continue
		}
		host, _, err := net.SplitHostPort(s.Address)
		if err != nil {
			return nil, fmt.Errorf("%s: address %q: %w", s.Name, s.Address, err)
		}
		url := "http://" + net.JoinHostPort(host, "9090") + "/metrics"
		out = append(out, &scraped{Name: s.Name, pid: pidOf(s.Name), get: func(ctx context.Context) ([]byte, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return nil, err
			}
			resp, err := httpClient.Do(req)
			if err != nil {
				return nil, err
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("%s: %s", url, resp.Status)
			}
			return io.ReadAll(resp.Body)
		}})
	}
	return out, nil
}

// read takes one sample; a process that cannot be read (paused
// kube-apiserver behind its authorization, replica stopped) is counted.
func (s *scraped) read(ctx context.Context) {
	pid := s.pid()
	if pid == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := s.get(ctx)
	if err != nil && ctx.Err() != nil {
		return // the soak is stopping
	}
	if err != nil {
		s.errors++
		s.lastErr = err.Error()
		return
	}
	m, err := promtext.Parse(body)
	if err != nil {
		s.errors++
		s.lastErr = err.Error()
		return
	}
	values, err := gauges(m, "go_memstats_heap_alloc_bytes", "go_goroutines", "process_open_fds", "go_memstats_next_gc_bytes")
	if err != nil {
		s.errors++
		s.lastErr = err.Error()
		return
	}
	x := sample{At: time.Now(), PID: pid, HeapBytes: values[0], Goroutines: values[1], FDs: values[2], NextGC: values[3]}
	if s.Cluster != "" {
		x.Watches = m.Sum("apiserver_longrunning_requests", map[string]string{"verb": "WATCH"})
	}
	s.samples = append(s.samples, x)
}

// saveHeapProfile writes the process's heap profile to
// dir/<name>-<label>-<pid>.pb.gz, so that `go tool pprof -base` of the
// start and end profiles shows by allocation site what a growth of the
// live heap is made of. Processes without pprof are skipped.
func (s *scraped) saveHeapProfile(ctx context.Context, dir, label string) error {
	pid := s.pid()
	if s.heapProfile == nil || pid == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := s.heapProfile(ctx)
	if err != nil {
		return fmt.Errorf("%s: heap profile: %w", s.Name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.pb.gz", s.Name, label, pid))
	if err := os.WriteFile(path, body, 0o644); err != nil {
		return err
	}
	s.profiles = append(s.profiles, path)
	return nil
}

// gauges reads the named unlabelled series of a Prometheus text
// exposition; an absent one is an error.
func gauges(m promtext.Metrics, names ...string) ([]float64, error) {
	out := make([]float64, 0, len(names))
	for _, n := range names {
		v, found, err := m.Lookup(n)
		if err != nil {
			return nil, err
		}
		if !found {
			return nil, fmt.Errorf("no %s (a gauge, counter or untyped series without labels) on /metrics", n)
		}
		out = append(out, v)
	}
	return out, nil
}

// growth compares a process's runtime at the start and the end.
type growth struct {
	Name string `json:"name"`
	// Judged is false when the figures cannot say anything (too short a
	// run, the process restarted late); Why says why.
	Judged bool   `json:"judged"`
	Why    string `json:"why,omitempty"`
	PID    int    `json:"pid"`
	// From is when the start figures were taken.
	From         time.Time `json:"from"`
	HeapStartMiB float64   `json:"heap_start_mib"`
	HeapEndMiB   float64   `json:"heap_end_mib"`
	LiveStartMiB float64   `json:"live_heap_start_mib"`
	LiveEndMiB   float64   `json:"live_heap_end_mib"`
	// Series are the samples of the process's last PID, for plots.
	Series          []sample `json:"series,omitempty"`
	GoroutinesStart float64  `json:"goroutines_start"`
	GoroutinesEnd   float64  `json:"goroutines_end"`
	FDsStart        float64  `json:"fds_start"`
	FDsEnd          float64  `json:"fds_end"`
	// WatchesStart and WatchesEnd are the watches a replica served in the
	// two windows. Rebaselined is when the watches it serves last moved to
	// the level of the end window (another replica of its cluster
	// restarted, say): its figures are taken from then, like those of a
	// process that restarted, so that the cluster's watchers moving onto
	// it are not read as growth. Whether the cluster's replicas serve more
	// watches in all is judged apart (watchTotals).
	WatchesStart float64    `json:"watches_start,omitempty"`
	WatchesEnd   float64    `json:"watches_end,omitempty"`
	Rebaselined  *time.Time `json:"rebaselined,omitempty"`
	Samples      int        `json:"samples"`
	// HeapProfiles are the heap profiles taken after the warm-up and at
	// the end (mci-apiserver replicas only).
	HeapProfiles []string `json:"heap_profiles,omitempty"`
	ScrapeErrors int      `json:"scrape_errors"`
	Failures     []string `json:"failures,omitempty"`
}

// compare takes the start figures over the first window of samples of
// the process's last PID from from, the end of the warm-up (from its start
// if it restarted, after settle)
// and the end figures over the last window. The heap in use
// (go_memstats_heap_alloc_bytes) swings with each GC cycle, up to twice
// the live heap, so a reading at a given instant says little: it is
// reported as the least reading of each window, and the heap is judged on
// the live heap the last collection found (go_memstats_next_gc_bytes / 2,
// the window's median), which grows only with what the process keeps.
// Goroutines and
// descriptors are the windows' medians, so a connection being replaced at
// the instant of one sample does not count.
func (s *scraped) compare(from time.Time, win, settle time.Duration, judge bool, minLife time.Duration) growth {
	g := growth{Name: s.Name, ScrapeErrors: s.errors, HeapProfiles: s.profiles}
	if len(s.samples) == 0 {
		g.Why = "no sample (" + s.lastErr + ")"
		return g
	}
	last := s.samples[len(s.samples)-1]
	g.PID = last.PID
	var life []sample
	for _, x := range s.samples {
		if x.PID == last.PID && !x.At.Before(from) {
			life = append(life, x)
		}
	}
	if len(life) == 0 {
		g.Why = "no sample after the warm-up"
		return g
	}
	if restarted := life[0].At.After(from.Add(win)); restarted {
		cut := life[0].At.Add(settle)
		life = slices.DeleteFunc(life, func(x sample) bool { return x.At.Before(cut) })
	}
	if s.Cluster != "" {
		if at, ok := watchesMoved(life, win); ok {
			g.Rebaselined = &at
			cut := at.Add(settle)
			life = slices.DeleteFunc(life, func(x sample) bool { return x.At.Before(cut) })
		}
	}
	g.Samples = len(life)
	if len(life) < 4 {
		g.Why = "too few samples of its last process"
		return g
	}
	first, end := life[0].At, life[len(life)-1].At
	g.From = first
	startWin := pick(life, func(x sample) bool { return !x.At.After(first.Add(win)) })
	endWin := pick(life, func(x sample) bool { return !x.At.Before(end.Add(-win)) })
	heap := func(w []sample) float64 {
		return slices.MinFunc(w, func(a, b sample) int { return cmp.Compare(a.HeapBytes, b.HeapBytes) }).HeapBytes / (1 << 20)
	}
	g.HeapStartMiB, g.HeapEndMiB = heap(startWin), heap(endWin)
	live := func(x sample) float64 { return x.NextGC / 2 / (1 << 20) }
	g.LiveStartMiB, g.LiveEndMiB = median(startWin, live), median(endWin, live)
	g.Series = life
	g.GoroutinesStart, g.GoroutinesEnd = median(startWin, func(x sample) float64 { return x.Goroutines }), median(endWin, func(x sample) float64 { return x.Goroutines })
	g.FDsStart, g.FDsEnd = median(startWin, func(x sample) float64 { return x.FDs }), median(endWin, func(x sample) float64 { return x.FDs })
	g.WatchesStart, g.WatchesEnd = median(startWin, func(x sample) float64 { return x.Watches }), median(endWin, func(x sample) float64 { return x.Watches })
	switch {
	case !judge:
		g.Why = "run too short to judge growth"
		return g
	case end.Sub(first) < minLife && g.Rebaselined != nil:
		g.Why = fmt.Sprintf("its cluster's watches moved to or from it: only its last %s serving as many measured", end.Sub(first).Round(time.Second))
		return g
	case end.Sub(first) < minLife:
		g.Why = fmt.Sprintf("restarted: only %s of its last process measured", end.Sub(first).Round(time.Second))
		return g
	}
	g.Judged = true
	if g.LiveEndMiB > g.LiveStartMiB*1.10 {
		what := fmt.Sprintf("live heap %.1f MiB -> %.1f MiB (+%.0f%%, target 10%%)", g.LiveStartMiB, g.LiveEndMiB, 100*(g.LiveEndMiB/g.LiveStartMiB-1))
		if n := len(s.profiles); n >= 2 {
			what += fmt.Sprintf("; what grew: go tool pprof -sample_index=inuse_space -top -base %s %s", s.profiles[n-2], s.profiles[n-1])
		}
		g.Failures = append(g.Failures, what)
	}
	if g.GoroutinesEnd > g.GoroutinesStart*1.10 {
		g.Failures = append(g.Failures, fmt.Sprintf("goroutines %.0f -> %.0f (+%.0f%%, target 10%%)", g.GoroutinesStart, g.GoroutinesEnd, 100*(g.GoroutinesEnd/g.GoroutinesStart-1)))
	}
	if g.FDsEnd > g.FDsStart+max(2, g.FDsStart*0.05) {
		g.Failures = append(g.Failures, fmt.Sprintf("file descriptors %.0f -> %.0f (target flat: +2 or 5%%)", g.FDsStart, g.FDsEnd))
	}
	return g
}

// watchTolerance is how far a count of watches may stray from another
// before it is a different load: a watch being reopened (client-go's
// informers reopen theirs every few minutes) is not one.
func watchTolerance(level float64) float64 { return max(3, level/10) }

// watchesMoved tells when the watches a replica serves last left the level
// of the end window (the window's median, within watchTolerance) for two
// samples or more in a row; false when they stayed at that level
// throughout. One sample away is a blip (watches reopened between two
// readings), not a move. No samples (a replica restarted too late in the
// run for any of its own to settle) did not move.
func watchesMoved(life []sample, win time.Duration) (time.Time, bool) {
	if len(life) == 0 {
		return time.Time{}, false
	}
	end := life[len(life)-1].At
	level := median(pick(life, func(x sample) bool { return !x.At.Before(end.Add(-win)) }), func(x sample) float64 { return x.Watches })
	var at time.Time
	run := 0
	for _, x := range life {
		if math.Abs(x.Watches-level) <= watchTolerance(level) {
			run = 0
			continue
		}
		if run++; run >= 2 {
			at = x.At
		}
	}
	return at, !at.IsZero()
}

func pick(s []sample, keep func(sample) bool) []sample {
	var out []sample
	for _, x := range s {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

func median(s []sample, v func(sample) float64) float64 {
	vals := make([]float64, 0, len(s))
	for _, x := range s {
		vals = append(vals, v(x))
	}
	slices.Sort(vals)
	return vals[len(vals)/2]
}
