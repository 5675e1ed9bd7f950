package clusterscore

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/promptprefix"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// homeOf is the home of the fixture's prompt among a, b and c with equal
// capacities: the cluster of the highest rendezvous score.
func homeOf(blocks []uint64, names ...string) string {
	best, home := 0.0, ""
	for _, n := range names {
		if r := rendezvous(homeKey(blocks), promptprefix.ClusterID(n), 2); r > best {
			best, home = r, n
		}
	}
	return home
}

// secondOf is the cluster of the next highest rendezvous score after
// home: where a key served once goes when its home cannot take it.
func secondOf(blocks []uint64, home string, names ...string) string {
	var others []string
	for _, n := range names {
		if n != home {
			others = append(others, n)
		}
	}
	return homeOf(blocks, others...)
}

// answered records requests sent to cluster at at that had their first
// byte after each of took, and finished.
func answered(f *affinityFixture, cluster string, at time.Time, took ...time.Duration) {
	for _, d := range took {
		f.mem.Observed.Started(scope, cluster, at)
		f.mem.Observed.FirstByte(scope, cluster, d)
		f.mem.Observed.Finished(scope, cluster, false)
	}
}

// known makes the prompt known to the sidecar, as after its first request
// (served on cluster), so that its home takes it within the full bound.
func known(f *affinityFixture, req *Request, cluster string) {
	f.mem.Prefixes.Record(req.Blocks[:1], promptprefix.ClusterID(cluster))
	f.mem.Homes.Served(req.Scope, homeKey(req.Blocks), 0, req.Now)
}

func TestHomePlacement(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *affinityFixture, req *Request, home string)
		// want is the first cluster: "home", "not home", or a name.
		want     string
		wantLeft bool
		// outcome is the lead decision the explanation states.
		outcome HomeOutcome
	}{
		{
			name:    "a known prompt goes to its home, hashed from its leading blocks",
			setup:   func(f *affinityFixture, req *Request, home string) { known(f, req, home) },
			want:    "home",
			outcome: HomeAtHome,
		},
		{
			name: "its home keeps it where another cluster served a longer prefix (the index does not move it)",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				for _, c := range f.cands {
					if c.Name != home {
						f.mem.Served(req, c.Name)
					}
				}
			},
			want:    "home",
			outcome: HomeAtHome,
		},
		{
			name: "its home keeps it while its load is within the bound: 1 in flight, the others none (bound: 2 x 2/3, rounded up)",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				f.mem.Observed.Started(scope, home, epoch)
			},
			want:    "home",
			outcome: HomeAtHome,
		},
		{
			name: "a home beyond the bound is left for the best scored cluster within it: 2 in flight, the others none (bound: 2 x 3/3)",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				f.mem.Observed.Started(scope, home, epoch)
				f.mem.Observed.Started(scope, home, epoch)
			},
			want:     "not home",
			outcome:  HomeSecond,
			wantLeft: true,
		},
		{
			name: "a home beyond the bound whose servers queue no more than the others' and whose requests have all had their first byte keeps the request: a move would cost a cold prefill and save no wait",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				f.mem.Observed.Started(scope, home, epoch)
				f.mem.Observed.Started(scope, home, epoch)
				f.mem.Observed.FirstByte(scope, home, 30*time.Millisecond)
				f.mem.Observed.FirstByte(scope, home, 30*time.Millisecond)
			},
			want:    "home",
			outcome: HomeNoWait,
		},
		{
			name: "... but not one whose servers queue more than the least queued cluster's, even within the queue margin",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				f.cand(home).Pool = freshPool(1.5, 0.3)
				f.mem.Observed.Started(scope, home, epoch)
				f.mem.Observed.Started(scope, home, epoch)
				f.mem.Observed.FirstByte(scope, home, 30*time.Millisecond)
				f.mem.Observed.FirstByte(scope, home, 30*time.Millisecond)
			},
			want:     "not home",
			outcome:  HomeSecond,
			wantLeft: true,
		},
		{
			name: "a home one of whose requests has awaited its first byte past its due (its first bytes took 30 ms, due within 84 ms; this one 1 s) is left for its second home before any scrape shows it, within its bound",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				answered(f, home, epoch.Add(-2*time.Second), 30*time.Millisecond, 30*time.Millisecond)
				f.mem.Observed.Started(scope, home, epoch.Add(-time.Second))
			},
			want:     "second",
			outcome:  HomeOverdue,
			wantLeft: true,
		},
		{
			name: "... but not one whose request has awaited it no longer than its first bytes have taken: a prefill, not a full batch (30 to 90 ms; this one 80 ms)",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				answered(f, home, epoch.Add(-2*time.Second), 30*time.Millisecond, 90*time.Millisecond, 30*time.Millisecond, 90*time.Millisecond)
				f.mem.Observed.Started(scope, home, epoch.Add(-80*time.Millisecond))
			},
			want:    "home",
			outcome: HomeAtHome,
		},
		{
			name: "a saturated home is left",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				f.cand(home).Pool = freshPool(30, 0.5)
			},
			want:     "not home",
			outcome:  HomeSecond,
			wantLeft: true,
		},
		{
			name: "a request that leaves its home goes to its second home (the next of its rendezvous order) while that one takes it, not to a less loaded cluster",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				f.cand(home).Pool = freshPool(30, 0.5)
				f.mem.Observed.Started(scope, secondOf(req.Blocks, home, "a", "b", "c"), epoch)
			},
			want:     "second",
			outcome:  HomeSecond,
			wantLeft: true,
		},
		{
			name: "a second home beyond the bound is passed over for the best scored cluster within it: 3 in flight, the other none (bound: 1.5 x 4/2, rounded up)",
			setup: func(f *affinityFixture, req *Request, home string) {
				known(f, req, home)
				f.cand(home).Pool = freshPool(30, 0.5)
				second := secondOf(req.Blocks, home, "a", "b", "c")
				for range 3 {
					f.mem.Observed.Started(scope, second, epoch)
				}
			},
			want:     "third",
			outcome:  HomeSpill,
			wantLeft: true,
		},
		{
			name: "without the backend's rotation, a prompt new to the sidecar goes to the best scored cluster within the bound: not its home, busier by 1",
			setup: func(f *affinityFixture, req *Request, home string) {
				f.mem.Observed.Started(scope, home, epoch)
			},
			want:     "not home",
			outcome:  HomeDealt,
			wantLeft: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			req := f.req()
			home := homeOf(req.Blocks, "a", "b", "c")
			second := secondOf(req.Blocks, home, "a", "b", "c")
			tt.setup(f, req, home)
			var ex Explanation
			order, err := f.p.Pick(req, f.cands, nil, nil, &ex)
			require.NoError(t, err)
			got := f.cands[order[0]].Name
			assert.Equal(t, home, ex.Home.Home, ex.String())
			assert.Equal(t, tt.wantLeft, ex.Home.Left, ex.String())
			assert.Equal(t, tt.outcome, ex.Home.Outcome, ex.String())
			assert.Contains(t, ex.String(), " home-outcome="+tt.outcome.String()+",", "the explanation says the decision")
			if tt.outcome == HomeOverdue {
				assert.Contains(t, ex.String(), ",home-awaited=1s,home-due=84ms,overdue", "the explanation says how long it waited, and for how long it was due")
			}
			switch tt.want {
			case "home":
				assert.Equal(t, home, got, ex.String())
			case "not home":
				assert.NotEqual(t, home, got, ex.String())
			case "second":
				assert.Equal(t, second, got, ex.String())
				assert.Equal(t, second, ex.Home.Second, ex.String())
				assert.Contains(t, ex.String(), ",left,second="+second, "the explanation says where")
			case "third":
				assert.NotEqual(t, home, got, ex.String())
				assert.NotEqual(t, second, got, ex.String())
				assert.Empty(t, ex.Home.Second, ex.String())
			default:
				assert.Equal(t, tt.want, got, ex.String())
			}
		})
	}
}

// Replicas agree without talking: two sidecars that never saw each
// other's requests place every prompt on the same cluster while load
// allows, and prompts spread over the clusters by their capacities.
func TestHomeReplicasAgree(t *testing.T) {
	a, b := newAffinityFixture(t), newAffinityFixture(t)
	b.cands[0].Pool = &PoolMetrics{AverageQueue: 1, AverageKVCache: 0.3, ReadyPods: 4, UpdatedAt: epoch}
	a.cands[0].Pool = b.cands[0].Pool
	homes := map[string]int{}
	for i := range 3000 {
		req := &Request{Now: epoch, Scope: scope, Blocks: chain(uint64(i), 8), Criticality: scheduling.Standard}
		known(a, req, "a")
		known(b, req, "a")
		oa, err := a.order(t, req)
		require.NoError(t, err)
		ob, err := b.order(t, req)
		require.NoError(t, err)
		require.Equal(t, oa[0], ob[0], "prompt %d", i)
		homes[oa[0]]++
	}
	// a has 4 ready pods, b and c 2 each: half the prompts, a quarter each.
	assert.InDelta(t, 1500, homes["a"], 120, "%v", homes)
	assert.InDelta(t, 750, homes["b"], 90, "%v", homes)
	assert.InDelta(t, 750, homes["c"], 90, "%v", homes)
}

// A cluster that stops answering (its servers taken by traffic the
// sidecar does not see: its requests never finish) loses the prompts it
// is home to within one request of MetricsBased: a bound of 2 lets the
// home hold one request more than the least loaded when the others are
// idle (a tighter bound cost hit ratio in the simulation:
// docs/design/cluster-scoring.md). Its pool metrics, once they say it is
// saturated, take it out for every replica alike.
func TestHomeYieldsAsFastAsMetricsBased(t *testing.T) {
	stalled := func(t *testing.T, config string, clusters int) int {
		f := newAffinityFixture(t)
		f.cands = f.cands[:clusters]
		withConfig(t, f, config)
		home := homeOf(f.blocks, []string{"a", "b", "c"}[:clusters]...)
		known(f, f.req(), home)
		sent := 0
		for range 50 {
			order, err := f.order(t, f.req())
			require.NoError(t, err)
			f.mem.Observed.Started(scope, order[0], epoch)
			if order[0] == home {
				sent++
				continue
			}
			f.mem.Observed.Finished(scope, order[0], false)
		}
		return sent
	}
	tests := []struct {
		clusters int
		// want is how many requests PrefixAffinity sends the stalled
		// home; MetricsBased sends 1 (its chain sees the stalled
		// cluster's 1 in flight against the others' none), the margin
		// rule of old 3.
		want int
	}{
		{clusters: 3, want: 2}, // bounds 1 and 2 with 0 and 1 in flight
		{clusters: 2, want: 3}, // the bound at 1.5 (n - 1/2): 2, 3, then 3 for 4
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d clusters", tt.clusters), func(t *testing.T) {
			affinity, metrics := stalled(t, routingpolicy.PrefixAffinity, tt.clusters), stalled(t, routingpolicy.MetricsBased, tt.clusters)
			assert.Equal(t, 1, metrics, "requests MetricsBased sent to the stalled cluster")
			assert.Equal(t, tt.want, affinity, "requests PrefixAffinity sent to the stalled cluster")
		})
	}
}

// A home is loaded when its pool metrics say so: its servers' waiting
// queue (per server, as scraped) is more than the affinity margin (1
// request per server for PrefixAffinity) above the least queued
// candidate's. Its servers may be full of traffic this sidecar does not
// see, which its own in-flight count, and so the bound, cannot show.
func TestHomeLoadedByItsQueue(t *testing.T) {
	tests := []struct {
		name string
		// config replaces PrefixAffinity when set.
		config string
		// home and other are the home's and the other clusters' pools.
		home, other *PoolMetrics
		wantQueued  bool
	}{
		{
			name: "a home whose servers queue 2 per server while the others queue none is loaded",
			home: freshPool(2, 0.3), other: freshPool(0, 0.3), wantQueued: true,
		},
		{
			name: "a home whose servers queue 1 per server more than the others' (the margin) keeps its requests",
			home: freshPool(1, 0.3), other: freshPool(0, 0.3),
		},
		{
			name: "a home queued as much as every other cluster keeps its requests",
			home: freshPool(4, 0.3), other: freshPool(4, 0.3),
		},
		{
			name: "a home whose queue is known only from stale metrics keeps its requests (its bound still applies)",
			home: stalePool(4, 0.3), other: freshPool(0, 0.3),
		},
		{
			name: "a home queued beyond the margin above clusters that report no metrics is not compared with them",
			home: freshPool(4, 0.3),
		},
		{
			name:   "without a queue margin (queue-margin=off) the queue does not make a home loaded, whatever the affinity margin",
			config: "prefix-cache=3,in-flight=1,queue=1,home-bound=2,affinity-margin=1,queue-margin=off",
			home:   freshPool(4, 0.3), other: freshPool(0, 0.3),
		},
		{
			name:   "a queue margin of its own makes a home loaded where affinity never yields (affinity-margin=off)",
			config: "prefix-cache=3,in-flight=1,queue=1,home-bound=2,affinity-margin=off,queue-margin=1",
			home:   freshPool(2, 0.3), other: freshPool(0, 0.3), wantQueued: true,
		},
		{
			name:   "a written configuration without a queue margin takes its affinity margin's: without one (affinity-margin=off) the queue does not make a home loaded",
			config: "prefix-cache=3,in-flight=1,queue=1,home-bound=2,affinity-margin=off",
			home:   freshPool(4, 0.3), other: freshPool(0, 0.3),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			if tt.config != "" {
				withConfig(t, f, tt.config)
			}
			req := f.req()
			home := homeOf(req.Blocks, "a", "b", "c")
			known(f, req, home)
			for i := range f.cands {
				f.cands[i].Pool = tt.other
				if f.cands[i].Name == home {
					f.cands[i].Pool = tt.home
				}
			}
			var ex Explanation
			order, err := f.p.Pick(req, f.cands, nil, nil, &ex)
			require.NoError(t, err)
			assert.Equal(t, home, ex.Home.Home, ex.String())
			assert.Equal(t, tt.wantQueued, ex.Home.Queued, ex.String())
			assert.Equal(t, tt.wantQueued, ex.Home.Left, ex.String())
			if tt.wantQueued {
				assert.Equal(t, HomeQueued, ex.Home.Outcome, ex.String())
			} else {
				assert.Equal(t, HomeAtHome, ex.Home.Outcome, ex.String())
			}
			if tt.wantQueued {
				assert.NotEqual(t, home, f.cands[order[0]].Name, ex.String())
				assert.Contains(t, ex.String(), ",queued,left", "the explanation says why")
			} else {
				assert.Equal(t, home, f.cands[order[0]].Name, ex.String())
			}
		})
	}
}

// A home is filled when its pool metrics say every batch place of its
// servers is taken and one of the sidecar's requests there has awaited its
// first byte longer than the home's first bytes take on average: a
// prefill runs in a batch place, so with none free the request waits for
// the others to end. A filled home is left before the overdue rule (four
// spreads later) would; a full cluster is dealt no new key.
func TestHomeFilled(t *testing.T) {
	// batch is a pool of 2 servers of 2 batch places each with running
	// requests on average, and no queue.
	batch := func(running, places float64) *PoolMetrics {
		m := freshPool(0, 0.3)
		m.AverageRunning, m.AverageBatchCapacity = running, places
		return m
	}
	tests := []struct {
		name string
		home *PoolMetrics
		// awaited is how long the sidecar's request at home has awaited
		// its first byte (0: none awaits); the home's first bytes took
		// 40 ms, so one is overdue past 80 ms.
		awaited    time.Duration
		wantFilled bool
	}{
		{name: "every place taken, a request awaiting past the home's average first byte: filled, left", home: batch(2, 2), awaited: 60 * time.Millisecond, wantFilled: true},
		{name: "every place taken, a request awaiting within the average first byte: home", home: batch(2, 2), awaited: 30 * time.Millisecond},
		{name: "every place taken, no request awaiting: home (the batch turns over)", home: batch(2, 2)},
		{name: "a place free, a request awaiting past the average: home (a prefill, not a full batch)", home: batch(1.5, 2), awaited: 60 * time.Millisecond},
		{name: "batch places not published (an upstream EPP): today's rules alone", home: batch(2, -1), awaited: 60 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			req := f.req()
			home := homeOf(req.Blocks, "a", "b", "c")
			known(f, req, home)
			for i := range f.cands {
				f.cands[i].Pool = batch(0, 2)
				if f.cands[i].Name == home {
					f.cands[i].Pool = tt.home
				}
			}
			f.mem.Observed.Started(scope, home, epoch.Add(-10*time.Second))
			f.mem.Observed.FirstByte(scope, home, 40*time.Millisecond)
			f.mem.Observed.Finished(scope, home, false)
			if tt.awaited > 0 {
				f.mem.Observed.Started(scope, home, epoch.Add(-tt.awaited))
			}
			var ex Explanation
			order, err := f.p.Pick(req, f.cands, nil, nil, &ex)
			require.NoError(t, err)
			assert.Equal(t, tt.wantFilled, ex.Home.Filled, ex.String())
			if !tt.wantFilled {
				assert.Equal(t, home, f.cands[order[0]].Name, ex.String())
				return
			}
			assert.False(t, ex.Home.Overdue, "not overdue yet: "+ex.String())
			assert.Equal(t, HomeFilled, ex.Home.Outcome, ex.String())
			assert.NotEqual(t, home, f.cands[order[0]].Name, ex.String())
			assert.Contains(t, ex.String(), ",filled,left", "the explanation says why")
		})
	}

	// A new key pays a cold prefill wherever it goes, so it goes to no
	// filled cluster; but a batch that a scrape read full turns over
	// under load, and keeping new keys off it until the next scrape sent
	// them all to the others (bursts of ten on the routing benchmark's
	// no-shared-prefix): only this sidecar's own late request there says
	// it does not turn over.
	dealt := func(t *testing.T, awaited time.Duration) map[string]int {
		f := newAffinityFixture(t)
		f.cand("a").Pool = batch(2, 2)
		for _, n := range []string{"b", "c"} {
			f.cand(n).Pool = batch(0, 2)
		}
		f.mem.Observed.Started(scope, "a", epoch.Add(-10*time.Second))
		f.mem.Observed.FirstByte(scope, "a", 40*time.Millisecond)
		f.mem.Observed.Finished(scope, "a", false)
		if awaited > 0 {
			f.mem.Observed.Started(scope, "a", epoch.Add(-awaited))
		}
		rot := NewRotation(f.cands)
		got := map[string]int{}
		for i := range 30 {
			req := f.req()
			req.Blocks = chain(uint64(1000+i), 16)
			var ex Explanation
			order, err := f.p.Pick(req, f.cands, rot, nil, &ex)
			require.NoError(t, err)
			require.Equal(t, HomeDealt, ex.Home.Outcome, ex.String())
			got[f.cands[order[0]].Name]++
		}
		return got
	}
	t.Run("new keys are not dealt to a filled cluster", func(t *testing.T) {
		got := dealt(t, 60*time.Millisecond)
		assert.Zero(t, got["a"], "%v", got)
		assert.Equal(t, 15, got["b"], "%v", got)
	})
	t.Run("new keys are dealt in turn to a cluster whose batch reads full while none of this sidecar's requests there is late", func(t *testing.T) {
		got := dealt(t, 0)
		assert.Equal(t, map[string]int{"a": 10, "b": 10, "c": 10}, got)
	})
}

// stalePool is freshPool's metrics, a minute older than the staleness
// bound allows.
func stalePool(queue, kv float64) *PoolMetrics {
	m := freshPool(queue, kv)
	m.UpdatedAt = epoch.Add(-time.Minute)
	return m
}

// A prompt new to the sidecar has no cache it is known to reuse: it is
// dealt by the backend's rotation (as Weighted deals requests) among the
// clusters within the bound and not queued, whatever its home, which is
// how prompts that share nothing spread as evenly as round-robin spreads
// them.
func TestNewPromptsAreDealtInTurn(t *testing.T) {
	tests := []struct {
		name string
		// setup loads the clusters before the prompts come.
		setup func(f *affinityFixture)
		// want is where 6 new prompts go, in order.
		want []string
	}{
		{name: "in turn over the clusters, whatever their homes", setup: func(*affinityFixture) {}, want: []string{"a", "b", "c", "a", "b", "c"}},
		{
			name: "not to a cluster beyond the bound: 3 in flight on a, none elsewhere (bound 2 x 4/3, rounded up: 3)",
			setup: func(f *affinityFixture) {
				for range 3 {
					f.mem.Observed.Started(scope, "a", epoch)
				}
			},
			want: []string{"b", "c", "b", "c", "b", "c"},
		},
		{
			name: "not to a cluster where more wait than at the least waiting by a request or more, within the queue margin: b's servers queue 1 each, the others' none",
			setup: func(f *affinityFixture) {
				f.cand("b").Pool = freshPool(1, 0.3)
				f.cand("a").Pool = freshPool(0, 0.3)
				f.cand("c").Pool = freshPool(0, 0.3)
			},
			want: []string{"a", "c", "a", "c", "a", "c"},
		},
		{
			name: "but to a cluster that waits less than a request more (half a request per server, 2 servers)",
			setup: func(f *affinityFixture) {
				f.cand("b").Pool = freshPool(0.5, 0.3)
				f.cand("a").Pool = freshPool(0, 0.3)
				f.cand("c").Pool = freshPool(0, 0.3)
			},
			want: []string{"a", "b", "c", "a", "b", "c"},
		},
		{
			name: "the sidecar's own requests waiting for their first byte count between two scrapes: 2 in flight on each cluster, a's still waiting (1 per server), send the next prompts elsewhere",
			setup: func(f *affinityFixture) {
				for _, c := range []string{"a", "b", "c"} {
					f.mem.Observed.Started(scope, c, epoch)
					f.mem.Observed.Started(scope, c, epoch)
					if c != "a" {
						f.mem.Observed.FirstByte(scope, c, 30*time.Millisecond)
						f.mem.Observed.FirstByte(scope, c, 30*time.Millisecond)
					}
				}
			},
			want: []string{"b", "c", "b", "c", "b", "c"},
		},
		{
			name:  "not to a cluster whose servers queue beyond the margin",
			setup: func(f *affinityFixture) { f.cand("b").Pool = freshPool(3, 0.3) },
			want:  []string{"a", "c", "a", "c", "a", "c"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			tt.setup(f)
			rot := NewRotation(f.cands)
			var got []string
			for i := range tt.want {
				req := f.req()
				req.Blocks = chain(uint64(100+i), 8)
				var ex Explanation
				order, err := f.p.Pick(req, f.cands, rot, nil, &ex)
				require.NoError(t, err)
				require.True(t, ex.Home.New, ex.String())
				got = append(got, f.cands[order[0]].Name)
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// A cluster is further than the nearest by steps of 25 ms of their
// first-byte floors, or of the nearest's floor when that is longer: a
// remote cluster 50 ms away is 2 steps further, clusters that only
// differ by their prefills or that load slows alike are as near.
func TestDistances(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name   string
		floors []time.Duration
		want   []uint8
	}{
		{name: "one local, one 20 ms and one 70 ms away", floors: []time.Duration{ms(12), ms(32), ms(82)}, want: []uint8{0, 0, 2}},
		{name: "prefills apart: all near", floors: []time.Duration{ms(10), ms(18), ms(30)}, want: nil},
		{name: "loaded alike: steps of the least floor", floors: []time.Duration{ms(400), ms(600), ms(790)}, want: nil},
		{name: "twice the least under load: a step", floors: []time.Duration{ms(400), ms(820)}, want: []uint8{0, 1}},
		{name: "not measured: as near", floors: []time.Duration{0, ms(10), ms(70)}, want: []uint8{0, 0, 2}},
		{name: "none measured", floors: []time.Duration{0, 0}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slots := make([]slot, len(tt.floors))
			kept := make([]int, len(tt.floors))
			for i, f := range tt.floors {
				slots[i].floor, slots[i].capacity, kept[i] = f, 1, i
			}
			set, _ := keptIDs(make([]Candidate, len(kept)), kept, slots, homeSet{})
			assert.Equal(t, tt.want, set.far)
		})
	}
}

// The distance comes from the sidecar's own first bytes: with c's least
// first byte 70 ms above a's and b's, 8 groups leave c 2 of them whatever
// their keys, where without it c is home to 3 in some draws.
func TestHomesDealtNearerByFirstBytes(t *testing.T) {
	homesOfC := func(seed uint64, far bool) int {
		f := newAffinityFixture(t)
		if far {
			for range floorWindow {
				answered(f, "a", epoch, 12*time.Millisecond)
				answered(f, "b", epoch, 10*time.Millisecond)
				answered(f, "c", epoch, 82*time.Millisecond)
			}
		}
		var reqs []*Request
		for g := range uint64(8) {
			req := f.req()
			req.Blocks = chain(seed*8+g+7000, 8)
			reqs = append(reqs, req)
			f.mem.Homes.Served(req.Scope, homeKey(req.Blocks), 0, req.Now)
			f.mem.Homes.Served(req.Scope, homeKey(req.Blocks), 0, req.Now)
		}
		atC := 0
		for _, req := range reqs {
			var ex Explanation
			order, err := f.p.Pick(req, f.cands, nil, nil, &ex)
			require.NoError(t, err)
			require.Equal(t, HomeAtHome, ex.Home.Outcome, ex.String())
			if f.cands[order[0]].Name == "c" {
				atC++
			}
		}
		return atC
	}
	threeAtC := 0
	for seed := range uint64(40) {
		require.Equal(t, 2, homesOfC(seed, true), "seed %d: c is further", seed)
		if homesOfC(seed, false) == 3 {
			threeAtC++
		}
	}
	assert.Positive(t, threeAtC, "all near: c takes an extra in some draws")
}
