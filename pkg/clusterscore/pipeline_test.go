package clusterscore

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

const scope = "ns/llm"

func freshPool(queue, kv float64) *PoolMetrics {
	return &PoolMetrics{AverageQueue: queue, AverageKVCache: kv, ReadyPods: 2, UpdatedAt: epoch}
}

// affinityFixture is PrefixAffinity over clusters a, b and c, all serving
// with the same fresh metrics, and a prompt of 16 blocks.
type affinityFixture struct {
	p      *Pipeline
	mem    *Memory
	cands  []Candidate
	blocks []uint64
}

func newAffinityFixture(t testing.TB) *affinityFixture {
	t.Helper()
	mem := NewMemory(DefaultMemoryOptions())
	p, err := New(routingpolicy.Named()[routingpolicy.PrefixAffinity], scheduling.DefaultConfig(), mem)
	require.NoError(t, err)
	f := &affinityFixture{p: p, mem: mem, blocks: chain(42, 16)}
	for _, n := range []string{"a", "b", "c"} {
		f.cands = append(f.cands, Candidate{Name: n, Weight: 1, Health: HealthServing, Pool: freshPool(1, 0.3)})
	}
	return f
}

func (f *affinityFixture) req() *Request {
	return &Request{Now: epoch, Scope: scope, Blocks: f.blocks, Criticality: scheduling.Standard}
}

func (f *affinityFixture) order(t testing.TB, req *Request) ([]string, error) {
	t.Helper()
	idx, err := f.p.Pick(req, f.cands, nil, nil, nil)
	var out []string
	for _, i := range idx {
		out = append(out, f.cands[i].Name)
	}
	return out, err
}

func (f *affinityFixture) cand(name string) *Candidate {
	for i := range f.cands {
		if f.cands[i].Name == name {
			return &f.cands[i]
		}
	}
	panic(name)
}

// scorersOnly is PrefixAffinity's scorers and margin without its home
// bound: where the learned index, sessions and load alone order the
// clusters, as for a request without a prompt block.
const scorersOnly = "prefix-cache=3,session=2,in-flight=1,latency=1,errors=1,queue=1,kv-cache=1"

func withConfig(t testing.TB, f *affinityFixture, annotation string) {
	t.Helper()
	cfg, err := routingpolicy.Parse(annotation)
	require.NoError(t, err)
	f.p, err = New(cfg, scheduling.DefaultConfig(), f.mem)
	require.NoError(t, err)
}

// TestPrefixAffinity: PrefixAffinity's scorers, which order the clusters
// after the home and place the requests that have no home.
func TestPrefixAffinity(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(f *affinityFixture, req *Request)
		want    []string // the order, or only its first when one name is given
		wantErr error
	}{
		{
			name:  "a request goes where its prefix was served",
			setup: func(f *affinityFixture, req *Request) { f.mem.Served(req, "b") },
			want:  []string{"b"},
		},
		{
			name: "the longer cached prefix wins",
			setup: func(f *affinityFixture, req *Request) {
				f.mem.Prefixes.Record(f.blocks[:4], promptprefix.ClusterID("a"))
				f.mem.Prefixes.Record(f.blocks[:12], promptprefix.ClusterID("c"))
			},
			want: []string{"c", "a", "b"},
		},
		{
			name: "affinity yields to saturation: the saturated cluster goes last",
			setup: func(f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				f.cand("b").Pool = freshPool(30, 0.5)
				f.cand("c").Pool = freshPool(2, 0.3) // no tie to break at random
			},
			want: []string{"a", "c", "b"},
		},
		{
			name: "a sheddable request never goes to a saturated cluster, affinity or not",
			setup: func(f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				f.cand("b").Pool = freshPool(3, 0.95)
				f.cand("c").Pool = freshPool(2, 0.3)
				req.Criticality = scheduling.Sheddable
			},
			want: []string{"a", "c"},
		},
		{
			name: "a sheddable request is shed when every cluster is measured and saturated",
			setup: func(f *affinityFixture, req *Request) {
				for i := range f.cands {
					f.cands[i].Pool = freshPool(10, 0.5)
				}
				req.Criticality = scheduling.Sheddable
			},
			wantErr: ErrShed,
		},
		{
			name: "an unmeasured cluster takes a sheddable request rather than shed it",
			setup: func(f *affinityFixture, req *Request) {
				f.cands[0].Pool, f.cands[1].Pool, f.cands[2].Pool = freshPool(10, 0.5), nil, freshPool(10, 0.5)
				req.Criticality = scheduling.Sheddable
			},
			want: []string{"b"},
		},
		{
			name: "affinity yields to load: a short shared prefix does not outweigh ten more requests in flight",
			setup: func(f *affinityFixture, req *Request) {
				f.mem.Prefixes.Record(f.blocks[:3], promptprefix.ClusterID("b"))
				for range 10 {
					f.mem.Observed.Started(scope, "b", epoch)
				}
				f.cand("c").Pool = freshPool(3, 0.3)
			},
			// c's longer queue costs it less than b's load.
			want: []string{"a", "c", "b"},
		},
		{
			name: "a cluster known not to serve is never tried, whatever its affinity",
			setup: func(f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				f.cand("b").Health = HealthNotServing
				f.cand("c").ModelUnavailable = true
			},
			want: []string{"a"},
		},
		{
			name: "a session goes back to its cluster",
			setup: func(f *affinityFixture, req *Request) {
				req.Blocks, req.Session = nil, "alice"
				f.mem.Served(req, "c")
			},
			want: []string{"c"},
		},
		{
			name: "a session leaves its cluster while that one is saturated",
			setup: func(f *affinityFixture, req *Request) {
				req.Blocks, req.Session = nil, "alice"
				f.mem.Served(req, "c")
				f.cand("c").Pool = freshPool(0, 0.99)
				f.cand("b").Pool = freshPool(2, 0.3)
			},
			want: []string{"a", "b", "c"},
		},
		{
			name: "slow and failing clusters come after the others",
			setup: func(f *affinityFixture, req *Request) {
				req.Blocks = nil
				f.mem.Observed.FirstByte(scope, "a", 400*time.Millisecond)
				f.mem.Observed.FirstByte(scope, "b", 100*time.Millisecond)
				f.mem.Observed.FirstByte(scope, "c", 100*time.Millisecond)
				f.mem.Observed.Started(scope, "c", epoch)
				f.mem.Observed.Finished(scope, "c", true)
			},
			want: []string{"b", "c", "a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			withConfig(t, f, scorersOnly)
			req := f.req()
			tt.setup(f, req)
			got, err := f.order(t, req)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if len(tt.want) == 1 {
				require.NotEmpty(t, got)
				got = got[:1]
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// Between two metric scrapes every cluster looks the same: the requests
// must spread, not herd on one.
func TestNoHerdingBetweenScrapes(t *testing.T) {
	t.Run("the sidecar's own in-flight counts spread requests evenly", func(t *testing.T) {
		f := newAffinityFixture(t)
		got := map[string]int{}
		for range 300 {
			req := f.req()
			req.Blocks = nil
			order, err := f.order(t, req)
			require.NoError(t, err)
			got[order[0]]++
			f.mem.Observed.Started(scope, order[0], epoch) // none finishes
		}
		assert.Equal(t, map[string]int{"a": 100, "b": 100, "c": 100}, got)
	})
	t.Run("equal scores are broken at random", func(t *testing.T) {
		f := newAffinityFixture(t)
		got := map[string]int{}
		for range 600 {
			req := f.req()
			req.Blocks = nil
			order, err := f.order(t, req)
			require.NoError(t, err)
			got[order[0]]++
		}
		for _, n := range []string{"a", "b", "c"} {
			assert.Greater(t, got[n], 120, "cluster %s first %d times of 600: %v", n, got[n], got)
		}
	})
	t.Run("power of two choices never takes the worst of three", func(t *testing.T) {
		mem := NewMemory(DefaultMemoryOptions())
		cfg, err := routingpolicy.Parse("in-flight=1,pick=two-choices")
		require.NoError(t, err)
		p, err := New(cfg, scheduling.DefaultConfig(), mem)
		require.NoError(t, err)
		cands := []Candidate{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}
		for range 5 {
			mem.Observed.Started(scope, "c", epoch)
		}
		mem.Observed.Started(scope, "b", epoch)
		got := map[string]int{}
		for range 300 {
			order, err := p.Pick(&Request{Scope: scope}, cands, nil, nil, nil)
			require.NoError(t, err)
			got[cands[order[0]].Name]++
		}
		assert.Zero(t, got["c"])
		assert.Greater(t, got["b"], 40, "the middle one is taken when drawn with the worst: %v", got)
	})
	t.Run("MetricsBased's chain counts the requests in flight since the scrape", func(t *testing.T) {
		mem := NewMemory(DefaultMemoryOptions())
		p, err := New(routingpolicy.Named()[routingpolicy.MetricsBased], scheduling.DefaultConfig(), mem)
		require.NoError(t, err)
		// One scrape: a's queue is the shortest, and stays so until the
		// next one; every cluster has capacity.
		pool := func(queue float64) *PoolMetrics {
			return &PoolMetrics{AverageQueue: queue, AverageKVCache: 0.2, ReadyPods: 2, UpdatedAt: epoch}
		}
		cands := []Candidate{
			{Name: "a", Weight: 1, Health: HealthServing, Pool: pool(0)},
			{Name: "b", Weight: 1, Health: HealthServing, Pool: pool(1)},
			{Name: "c", Weight: 1, Health: HealthServing, Pool: pool(1)},
		}
		rot := NewRotation(cands)
		got := map[string]int{}
		for range 60 {
			order, err := p.Pick(&Request{Scope: scope, Now: epoch}, cands, rot, nil, nil)
			require.NoError(t, err)
			got[cands[order[0]].Name]++
			mem.Observed.Started(scope, cands[order[0]].Name, epoch) // none finishes before the next scrape
		}
		for _, n := range []string{"a", "b", "c"} {
			assert.Greater(t, got[n], 10, "cluster %s first %d times of 60: %v", n, got[n], got)
		}
		assert.Greater(t, got["a"], got["b"], "a started with the shortest queue: %v", got)
	})
}

func TestExplanation(t *testing.T) {
	f := newAffinityFixture(t)
	req := f.req()
	f.mem.Served(req, "b")
	f.cand("c").Health = HealthNotServing
	var ex Explanation
	order, err := f.p.Pick(req, f.cands, nil, nil, &ex)
	require.NoError(t, err)
	require.Equal(t, []int{1, 0}, order)
	assert.Equal(t, "PrefixAffinity home-outcome=home,home=b,home-load=0,home-bound=1,home-queue=1"+
		" a:kept,tier=0,load=1,prefix-cache=0,session=0,in-flight=1,latency=1,errors=1,queue=0.833,kv-cache=0.7,total=4.533"+
		" b:kept,tier=0,load=1,prefix-cache=1,session=0,in-flight=1,latency=1,errors=1,queue=0.833,kv-cache=0.7,total=7.533"+
		" c:not-serving", ex.String())

	order, err = f.p.Pick(req, f.cands, nil, order[:0], &ex)
	require.NoError(t, err)
	assert.Len(t, ex.Clusters, 3, "an explanation is overwritten, not appended to")
	assert.Equal(t, []int{1, 0}, order)

	allocs := testing.AllocsPerRun(100, func() {
		order, _ = f.p.Pick(req, f.cands, nil, order[:0], nil)
	})
	assert.Zero(t, allocs, "a pick without explanation into a reused order does not allocate")
}

// TestConcurrentPicks runs picks, hooks and records from many goroutines,
// as many ext_proc streams do; go test -race checks it.
func TestConcurrentPicks(t *testing.T) {
	f := newAffinityFixture(t)
	mb := mustPipeline(t, routingpolicy.MetricsBased)
	rot := NewRotation(f.cands)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var order []int
			var ex Explanation
			for i := range 200 {
				req := &Request{Now: epoch, Scope: scope, Blocks: chain(uint64(i%10), 8), Session: []string{"s1", "s2", ""}[i%3]}
				var err error
				order, err = f.p.Pick(req, f.cands, nil, order[:0], &ex)
				require.NoError(t, err)
				c := f.cands[order[0]].Name
				f.mem.Observed.Started(scope, c, epoch)
				f.mem.Observed.FirstByte(scope, c, time.Duration(g+1)*time.Millisecond)
				f.mem.Served(req, c)
				f.mem.Observed.Finished(scope, c, i%17 == 0)
				_, err = mb.Pick(req, f.cands, rot, order[:0], nil)
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	for _, c := range f.cands {
		assert.Zero(t, f.mem.Observed.Observe(scope, c.Name).InFlight)
	}
}

// The rule by which affinity yields to load: prefix-cache and session
// affinity count only among the clusters whose load (scraped queue plus
// this sidecar's requests in flight per ready pod) is within the affinity
// margin of the least loaded cluster's, so that a cluster that fills up
// loses the requests its affinity draws before they queue there. In the
// fixture every cluster has 2 ready pods and a scraped queue of 1: a load
// of 1 plus half its requests in flight.
func TestAffinityYieldsToLoad(t *testing.T) {
	inFlight := func(f *affinityFixture, cluster string, n int) {
		for range n {
			f.mem.Observed.Started(scope, cluster, epoch)
		}
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, f *affinityFixture, req *Request)
		want  string // the first cluster
		// withheld are the clusters whose affinity did not count.
		withheld []string
	}{
		{
			name: "affinity counts while its cluster is within the margin of the least loaded",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				inFlight(f, "b", 2) // load 2, the least 1: one request per pod more
			},
			want: "b",
		},
		{
			name: "a cluster beyond the margin loses its prefix affinity and competes on load alone",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				inFlight(f, "b", 3) // load 2.5
				inFlight(f, "c", 1) // load 1.5, within the margin of a's 1
			},
			want:     "a",
			withheld: []string{"b"},
		},
		{
			name: "and its session affinity",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				req.Blocks, req.Session = nil, "alice"
				f.mem.Served(req, "c")
				inFlight(f, "c", 4)
				inFlight(f, "a", 1)
			},
			want:     "b",
			withheld: []string{"c"},
		},
		{
			name: "the scraped queue counts with the requests in flight",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				f.cand("b").Pool = freshPool(3, 0.3) // below saturation (5), 2 above the others
				f.cand("c").Pool = freshPool(1.5, 0.3)
			},
			want:     "a",
			withheld: []string{"b"},
		},
		{
			name: "load is per ready pod: a larger cluster takes more requests before it yields",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				f.cand("b").Pool = &PoolMetrics{AverageQueue: 1, AverageKVCache: 0.3, ReadyPods: 8, UpdatedAt: epoch}
				inFlight(f, "b", 6) // load 1.75
			},
			want: "b",
		},
		{
			name: "an unmeasured cluster's requests in flight count for the whole cluster",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				f.mem.Served(req, "b")
				f.cand("b").Pool = nil // load = its 3 requests in flight
				inFlight(f, "b", 3)
				inFlight(f, "c", 1)
			},
			want:     "a",
			withheld: []string{"b"},
		},
		{
			name: "a margin of 0: affinity counts only for the least loaded",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				withConfig(t, f, "prefix-cache=3,in-flight=1,affinity-margin=0")
				f.mem.Served(req, "b")
				inFlight(f, "b", 1)
				inFlight(f, "c", 2)
			},
			want:     "a",
			withheld: []string{"b", "c"},
		},
		{
			name: "affinity-margin=off: a whole shared prompt outweighs any load below saturation",
			setup: func(t *testing.T, f *affinityFixture, req *Request) {
				withConfig(t, f, "prefix-cache=3,session=2,in-flight=1,latency=1,errors=1,queue=1,kv-cache=1,affinity-margin=off")
				f.mem.Served(req, "b")
				inFlight(f, "b", 10)
			},
			want: "b",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			withConfig(t, f, scorersOnly)
			req := f.req()
			tt.setup(t, f, req)
			var ex Explanation
			order, err := f.p.Pick(req, f.cands, nil, nil, &ex)
			require.NoError(t, err)
			require.NotEmpty(t, order)
			assert.Equal(t, tt.want, f.cands[order[0]].Name, "explanation: %s", ex.String())
			var withheld []string
			for _, c := range ex.Clusters {
				if c.AffinityWithheld {
					withheld = append(withheld, c.Name)
					assert.Zero(t, c.Scores[routingpolicy.ScorePrefixCache], c.Name)
					assert.Zero(t, c.Scores[routingpolicy.ScoreSession], c.Name)
				}
			}
			assert.Equal(t, tt.withheld, withheld, "explanation: %s", ex.String())
		})
	}

	// The saturated-cluster scenario of the routing benchmark, in small:
	// every request's prefix was served by b, whose servers are suddenly
	// all taken by traffic the sidecar does not see, so that its requests
	// never finish; a's and c's finish at once. b takes requests while its
	// load (1 + in flight / 2) is within 1 of the others' (1): 3 of them,
	// then none.
	t.Run("a cluster that stops answering loses its affinity after a few requests", func(t *testing.T) {
		f := newAffinityFixture(t)
		withConfig(t, f, scorersOnly)
		f.mem.Served(f.req(), "b")
		got := map[string]int{}
		for range 50 {
			order, err := f.order(t, f.req())
			require.NoError(t, err)
			got[order[0]]++
			f.mem.Observed.Started(scope, order[0], epoch)
			if order[0] != "b" {
				f.mem.Observed.Finished(scope, order[0], false)
			}
		}
		assert.Equal(t, 3, got["b"], "requests sent to the stalled cluster: %v", got)
	})
}

// TestEjectedClustersAreTheLastResort: outlier detection's ejected
// clusters are left out while the filters keep any other, and kept, as
// if not ejected, when they keep none: a cluster whose responses failed
// lately may answer, no cluster certainly does not.
func TestEjectedClustersAreTheLastResort(t *testing.T) {
	for _, tt := range []struct {
		name       string
		health     map[string]Health
		local      string
		want       []string
		lastResort bool
		explained  string
	}{
		{
			name:   "an ejected cluster is left out while another is kept",
			health: map[string]Health{"a": HealthEjected, "c": HealthNotServing},
			want:   []string{"b"},
		},
		{
			name:       "ejected clusters are kept when every other is dropped",
			health:     map[string]Health{"a": HealthEjected, "b": HealthNotServing, "c": HealthEjected},
			want:       []string{"a", "c"},
			lastResort: true,
			explained:  "PrefixAffinity last-resort=ejected",
		},
		{
			name:       "an ejected local cluster leads again under local-first when it is the last resort",
			health:     map[string]Health{"a": HealthNotServing, "b": HealthNotServing, "c": HealthEjected},
			local:      "c",
			want:       []string{"c"},
			lastResort: true,
		},
		{
			name:   "no cluster at all when the others are dropped and none is ejected",
			health: map[string]Health{"a": HealthNotServing, "b": HealthNotServing, "c": HealthNotServing},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			if tt.local != "" {
				withConfig(t, f, scorersOnly+",filters=health+local-first")
				f.cand(tt.local).Local = true
			}
			for n, h := range tt.health {
				f.cand(n).Health = h
			}
			req := f.req()
			var ex Explanation
			idx, err := f.p.Pick(req, f.cands, nil, nil, &ex)
			require.NoError(t, err)
			var got []string
			for _, i := range idx {
				got = append(got, f.cands[i].Name)
			}
			assert.ElementsMatch(t, tt.want, got)
			assert.Equal(t, tt.lastResort, req.LastResort)
			assert.Equal(t, tt.lastResort, ex.LastResort)
			if tt.explained != "" {
				assert.Contains(t, ex.String(), tt.explained)
			}
		})
	}
}
