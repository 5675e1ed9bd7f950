package outlier

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// at is a clock stopped at t.
func at(t time.Time) func() time.Time { return func() time.Time { return t } }

// step is one thing that happens to a cluster of pool "p" at an offset
// from epoch: a result, a request sent, a request ended without result.
type step struct {
	at      time.Duration
	cluster string
	// what is "ok", "5xx", "gw", "sent" or "none"; times repeats it.
	what  string
	times int
}

func run(t *testing.T, d *Detector, clusters []string, steps []step) {
	t.Helper()
	for _, c := range clusters {
		require.False(t, d.Ejected(Key{"p", c}, at(epoch)), "%s starts in", c)
	}
	for _, s := range steps {
		k, now := Key{"p", s.cluster}, epoch.Add(s.at)
		for range max(s.times, 1) {
			switch s.what {
			case "ok":
				d.Record(k, Success, now)
			case "5xx":
				d.Record(k, Error5xx, now)
			case "gw":
				d.Record(k, GatewayFailure, now)
			case "sent":
				d.Ejected(k, at(now))
				d.Sent(k, now)
			case "none":
				d.NoResult(k)
			default:
				t.Fatalf("unknown step %q", s.what)
			}
		}
	}
}

func describe(ev []Event) []string {
	var out []string
	for _, e := range ev {
		s := e.Cluster + " " + map[EventKind]string{EventEjected: "ejected", EventProbing: "probing", EventReturned: "returned", EventOverflow: "overflow"}[e.Kind]
		if e.Reason != "" {
			s += " " + string(e.Reason)
		}
		if e.For > 0 {
			s += " " + e.For.String()
		}
		out = append(out, s)
	}
	return out
}

func TestDetector(t *testing.T) {
	abc := []string{"a", "b", "c"}
	tests := []struct {
		name     string
		cfg      func(*Config)
		clusters []string
		steps    []step
		// wantEvents are the events in order; wantOut the clusters out of
		// the choice at checkAt.
		wantEvents []string
		checkAt    time.Duration
		wantOut    []string
	}{
		{
			name:       "five 5xx in a row eject a cluster for the base ejection time",
			clusters:   abc,
			steps:      []step{{cluster: "b", what: "5xx", times: 5}},
			wantEvents: []string{"b ejected consecutive_5xx 5s"},
			checkAt:    4 * time.Second, wantOut: []string{"b"},
		},
		{
			name:     "a success breaks the row",
			clusters: abc,
			steps: []step{
				{cluster: "b", what: "5xx", times: 4}, {cluster: "b", what: "ok"}, {cluster: "b", what: "5xx", times: 4},
			},
			checkAt: time.Second,
		},
		{
			name:       "three gateway failures in a row eject before five 5xx would",
			clusters:   abc,
			steps:      []step{{cluster: "a", what: "gw", times: 3}},
			wantEvents: []string{"a ejected consecutive_gateway_failure 5s"},
			checkAt:    time.Second, wantOut: []string{"a"},
		},
		{
			name:     "a plain 5xx breaks the row of gateway failures but counts as a 5xx",
			clusters: abc,
			steps: []step{
				{cluster: "a", what: "gw", times: 2}, {cluster: "a", what: "5xx"}, {cluster: "a", what: "gw", times: 2},
			},
			wantEvents: []string{"a ejected consecutive_5xx 5s"},
			checkAt:    time.Second, wantOut: []string{"a"},
		},
		{
			name:     "the ejection time over, the cluster is probed with one request at a time, and a success returns it",
			clusters: abc,
			steps: []step{
				{cluster: "b", what: "5xx", times: 5},
				{at: 5 * time.Second, cluster: "b", what: "sent"},
				{at: 5100 * time.Millisecond, cluster: "b", what: "ok"},
			},
			wantEvents: []string{"b ejected consecutive_5xx 5s", "b probing", "b returned"},
			checkAt:    6 * time.Second,
		},
		{
			name:     "a probe in flight keeps the cluster out of the choice",
			clusters: abc,
			steps: []step{
				{cluster: "b", what: "5xx", times: 5},
				{at: 5 * time.Second, cluster: "b", what: "sent"},
			},
			wantEvents: []string{"b ejected consecutive_5xx 5s", "b probing"},
			checkAt:    6 * time.Second, wantOut: []string{"b"},
		},
		{
			name:     "a probe that ends without a result lets the next one go",
			clusters: abc,
			steps: []step{
				{cluster: "b", what: "5xx", times: 5},
				{at: 5 * time.Second, cluster: "b", what: "sent"},
				{at: 5 * time.Second, cluster: "b", what: "none"},
			},
			wantEvents: []string{"b ejected consecutive_5xx 5s", "b probing"},
			checkAt:    6 * time.Second,
		},
		{
			name:     "a failed probe ejects again at once, for longer each time, up to the maximum",
			clusters: abc,
			steps: []step{
				{cluster: "b", what: "5xx", times: 5},
				{at: 5 * time.Second, cluster: "b", what: "sent"}, {at: 5 * time.Second, cluster: "b", what: "5xx"},
				{at: 15 * time.Second, cluster: "b", what: "sent"}, {at: 15 * time.Second, cluster: "b", what: "gw"},
				{at: 30 * time.Second, cluster: "b", what: "sent"}, {at: 30 * time.Second, cluster: "b", what: "5xx"},
				{at: 50 * time.Second, cluster: "b", what: "sent"}, {at: 50 * time.Second, cluster: "b", what: "5xx"},
			},
			wantEvents: []string{
				"b ejected consecutive_5xx 5s",
				"b probing", "b ejected failed_probe 10s",
				"b probing", "b ejected failed_probe 15s",
				"b probing", "b ejected failed_probe 20s",
				"b probing", "b ejected failed_probe 20s",
			},
			checkAt: 69 * time.Second, wantOut: []string{"b"},
		},
		{
			name:     "a cluster back for a base ejection time forgets one ejection",
			clusters: abc,
			steps: []step{
				{cluster: "b", what: "5xx", times: 5},
				{at: 5 * time.Second, cluster: "b", what: "sent"}, {at: 5 * time.Second, cluster: "b", what: "5xx"},
				{at: 15 * time.Second, cluster: "b", what: "sent"}, {at: 15 * time.Second, cluster: "b", what: "ok"},
				{at: 20 * time.Second, cluster: "b", what: "5xx", times: 5},
			},
			wantEvents: []string{
				"b ejected consecutive_5xx 5s",
				"b probing", "b ejected failed_probe 10s",
				"b probing", "b returned",
				"b ejected consecutive_5xx 10s",
			},
			checkAt: 29 * time.Second, wantOut: []string{"b"},
		},
		{
			name:     "half of three clusters is one: a second is withheld, said once",
			clusters: abc,
			steps: []step{
				{cluster: "a", what: "5xx", times: 5},
				{cluster: "b", what: "5xx", times: 7},
			},
			wantEvents: []string{"a ejected consecutive_5xx 5s", "b overflow consecutive_5xx"},
			checkAt:    time.Second, wantOut: []string{"a"},
		},
		{
			name:     "the withheld cluster is ejected once the first is back",
			clusters: abc,
			steps: []step{
				{cluster: "a", what: "5xx", times: 5},
				{cluster: "b", what: "5xx", times: 5},
				{at: 5 * time.Second, cluster: "a", what: "sent"}, {at: 5 * time.Second, cluster: "a", what: "ok"},
				{at: 6 * time.Second, cluster: "b", what: "5xx"},
			},
			wantEvents: []string{"a ejected consecutive_5xx 5s", "b overflow consecutive_5xx", "a probing", "a returned", "b ejected consecutive_5xx 5s"},
			checkAt:    7 * time.Second, wantOut: []string{"b"},
		},
		{
			name:       "one of two clusters may be ejected",
			clusters:   []string{"a", "b"},
			steps:      []step{{cluster: "a", what: "5xx", times: 5}},
			wantEvents: []string{"a ejected consecutive_5xx 5s"},
			checkAt:    time.Second, wantOut: []string{"a"},
		},
		{
			name:       "the only cluster of a pool is never ejected",
			clusters:   []string{"a"},
			steps:      []step{{cluster: "a", what: "5xx", times: 10}},
			wantEvents: []string{"a overflow consecutive_5xx"},
			checkAt:    time.Second,
		},
		{
			name:     "a success rate well below the others' ejects at the end of the window",
			cfg:      func(c *Config) { c.Consecutive5xx, c.ConsecutiveGatewayFailure = 0, 0 },
			clusters: abc,
			steps: []step{
				{cluster: "a", what: "ok", times: 30}, {cluster: "b", what: "ok", times: 30},
				{cluster: "c", what: "ok", times: 15}, {cluster: "c", what: "5xx", times: 15},
				{at: 10 * time.Second, cluster: "a", what: "ok"},
			},
			wantEvents: []string{"c ejected success_rate 5s"},
			checkAt:    11 * time.Second, wantOut: []string{"c"},
		},
		{
			name:     "clusters that all fail alike eject none",
			cfg:      func(c *Config) { c.Consecutive5xx, c.ConsecutiveGatewayFailure = 0, 0 },
			clusters: abc,
			steps: []step{
				{cluster: "a", what: "5xx", times: 20}, {cluster: "b", what: "5xx", times: 20}, {cluster: "c", what: "5xx", times: 20},
				{cluster: "a", what: "ok", times: 10}, {cluster: "b", what: "ok", times: 10}, {cluster: "c", what: "ok", times: 10},
				{at: 10 * time.Second, cluster: "a", what: "ok"},
			},
			checkAt: 11 * time.Second,
		},
		{
			name:     "a cluster with too few requests is not judged by its rate",
			cfg:      func(c *Config) { c.Consecutive5xx, c.ConsecutiveGatewayFailure = 0, 0 },
			clusters: abc,
			steps: []step{
				{cluster: "a", what: "ok", times: 30}, {cluster: "b", what: "ok", times: 30},
				{cluster: "c", what: "5xx", times: 19},
				{at: 10 * time.Second, cluster: "a", what: "ok"},
			},
			checkAt: 11 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			require.NoError(t, cfg.Validate())
			var events []Event
			d := New(cfg, DefaultFirstByteConfig(), func(e Event) { events = append(events, e) })
			run(t, d, tt.clusters, tt.steps)
			// Checking may start a probe: only the events of the steps count.
			assert.Equal(t, tt.wantEvents, describe(events))
			// Ejected of those NotIn finds answers as Ejected of every
			// cluster, a cluster not seen yet among them; asked first, it
			// is the one that finds ejections over.
			among := append(slices.Clone(tt.clusters), "unseen")
			notIn, version := d.NotIn(len(among), func(i int) Key { return Key{"p", among[i]} }, nil)
			assert.Contains(t, notIn, len(among)-1, "a cluster not seen yet may be out")
			var outAmong []string
			for _, i := range notIn {
				if d.Ejected(Key{"p", among[i]}, at(epoch.Add(tt.checkAt))) {
					outAmong = append(outAmong, among[i])
				}
			}
			assert.NotEqual(t, version, d.Changes(), "the cluster not seen yet was added")
			var out []string
			for _, c := range among {
				if d.Ejected(Key{"p", c}, at(epoch.Add(tt.checkAt))) {
					out = append(out, c)
				}
			}
			assert.Equal(t, tt.wantOut, out)
			assert.Equal(t, out, outAmong, "Ejected of those NotIn finds answers as Ejected of all")
		})
	}
}

func TestResultOfStatus(t *testing.T) {
	for code, want := range map[int]Result{200: Success, 404: Success, 429: Success, 500: Error5xx, 501: Error5xx, 502: GatewayFailure, 503: GatewayFailure, 504: GatewayFailure} {
		assert.Equal(t, want, ResultOfStatus(code), "%d", code)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(*Config)
		fb   func(*FirstByteConfig)
		want string
	}{
		{name: "the defaults are valid"},
		{name: "a negative threshold", cfg: func(c *Config) { c.Consecutive5xx = -1 }, want: "must not be negative"},
		{name: "a factor above one", cfg: func(c *Config) { c.SuccessRateFactor = 1.5 }, want: "success-rate factor"},
		{name: "a maximum below the base", cfg: func(c *Config) { c.MaxEjectionTime = time.Second }, want: "base ejection time"},
		{name: "a percent above a hundred", cfg: func(c *Config) { c.MaxEjectionPercent = 101 }, want: "max ejection percent"},
		{name: "a quantile of zero", fb: func(c *FirstByteConfig) { c.Quantile = 0 }, want: "quantile"},
		{name: "a factor below one", fb: func(c *FirstByteConfig) { c.Factor = 0.5 }, want: "factor"},
		{name: "a ceiling below the floor", fb: func(c *FirstByteConfig) { c.Ceiling = time.Millisecond }, want: "ceiling"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, fb := DefaultConfig(), DefaultFirstByteConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			if tt.fb != nil {
				tt.fb(&fb)
			}
			err := cfg.Validate()
			if err == nil {
				err = fb.Validate()
			}
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestFirstByteBound(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name    string
		samples []time.Duration
		want    time.Duration
	}{
		{name: "no history: the ceiling", want: time.Minute},
		{name: "too short a history: the ceiling", samples: repeat(ms(50), MinSamples-1), want: time.Minute},
		{name: "a fast cluster: the floor", samples: repeat(ms(50), 96), want: time.Second},
		{name: "three times the 99th percentile (the bound is derived every few samples)", samples: append(repeat(ms(500), 95), ms(900)), want: 2700 * time.Millisecond},
		{name: "one slow outlier in a hundred is above the quantile", samples: append(repeat(ms(500), 127), 40*time.Second), want: 1500 * time.Millisecond},
		{name: "a slow cluster: the ceiling", samples: repeat(30*time.Second, 96), want: time.Minute},
		{name: "only the last samples count", samples: append(repeat(30*time.Second, 100), repeat(ms(100), 132)...), want: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := New(DefaultConfig(), DefaultFirstByteConfig(), nil)
			k := Key{"p", "a"}
			for _, s := range tt.samples {
				d.FirstByte(k, s, epoch)
			}
			assert.Equal(t, tt.want, d.FirstByteBound(k))
		})
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

func TestRetainForgetsClusters(t *testing.T) {
	d := New(DefaultConfig(), DefaultFirstByteConfig(), nil)
	run(t, d, []string{"a", "b"}, []step{{cluster: "a", what: "5xx", times: 5}})
	require.True(t, d.Ejected(Key{"p", "a"}, at(epoch)))
	d.Retain(func(k Key) bool { return k.Cluster == "b" })
	assert.False(t, d.Ejected(Key{"p", "a"}, at(epoch)), "a cluster that left and came back starts afresh")
}

// A reader keeps what NotIn found while Changes stays: every change that
// may take a cluster out of the choice, or make it one of its pool's,
// must change it, and results that leave every cluster in need not.
func TestChangesSayWhenWhatNotInFoundMayNoLongerHold(t *testing.T) {
	d := New(DefaultConfig(), DefaultFirstByteConfig(), nil)
	keys := []Key{{"p", "a"}, {"p", "b"}}
	key := func(i int) Key { return keys[i] }
	notIn, version := d.NotIn(len(keys), key, nil)
	assert.Equal(t, []int{0, 1}, notIn, "clusters not seen yet")
	for _, k := range keys {
		require.False(t, d.Ejected(k, at(epoch)))
	}
	assert.NotEqual(t, version, d.Changes(), "clusters added")
	notIn, version = d.NotIn(len(keys), key, nil)
	assert.Empty(t, notIn)

	d.Record(keys[0], Success, epoch)
	d.Record(keys[1], Error5xx, epoch)
	d.Sent(keys[0], epoch)
	d.NoResult(keys[0])
	assert.Equal(t, version, d.Changes(), "results that eject nothing change nothing")

	for range 4 {
		d.Record(keys[1], Error5xx, epoch)
	}
	require.True(t, d.Ejected(keys[1], at(epoch)))
	assert.NotEqual(t, version, d.Changes(), "an ejection")
	notIn, version = d.NotIn(len(keys), key, nil)
	assert.Equal(t, []int{1}, notIn)

	d.Retain(func(k Key) bool { return k == keys[0] })
	assert.NotEqual(t, version, d.Changes(), "a cluster forgotten")
	notIn, _ = d.NotIn(len(keys), key, nil)
	assert.Equal(t, []int{1}, notIn, "a cluster forgotten is not one of its pool's")
}
