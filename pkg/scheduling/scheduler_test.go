package scheduling

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
)

var now = time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)

// candidate is a named candidate of a test case.
type candidate struct {
	name    string
	metrics *Metrics
}

// pod is a candidate measured just now.
func pod(name string, queue int, kvCache float64) candidate {
	return candidate{name: name, metrics: &Metrics{WaitingQueue: queue, KVCacheUsage: kvCache, UpdatedAt: now}}
}

func (c candidate) active(adapters ...string) candidate {
	c.metrics.ActiveAdapters = sets.New(adapters...)
	return c
}

func (c candidate) waiting(adapters ...string) candidate {
	c.metrics.WaitingAdapters = sets.New(adapters...)
	return c
}

func (c candidate) maxLoRA(n int) candidate {
	c.metrics.MaxLoRA = n
	return c
}

func (c candidate) updatedAt(t time.Time) candidate {
	c.metrics.UpdatedAt = t
	return c
}

func unmeasured(name string) candidate { return candidate{name: name} }

func split(cands []candidate) ([]string, []*Metrics) {
	names := make([]string, len(cands))
	metrics := make([]*Metrics, len(cands))
	for i, c := range cands {
		names[i], metrics[i] = c.name, c.metrics
	}
	return names, metrics
}

// runs is how many decisions each case makes, each with another seed, so that
// a pick that should be certain is not right by luck and every candidate of a
// random tie shows up.
const runs = 500

func TestSchedule(t *testing.T) {
	critical := Request{Criticality: Critical}
	sheddable := Request{Criticality: Sheddable}

	tests := []struct {
		name   string
		config func(*Config)
		req    Request
		cands  []candidate
		// want lists the candidates the decision may pick; over all runs it
		// must pick each of them and nothing else.
		want    []string
		wantErr error
	}{
		{
			name: "seed example 1: a critical request for LoRA-X goes to the low-queue pod that has LoRA-X loaded",
			req:  Request{Criticality: Critical, Adapter: "lora-x"},
			cands: []candidate{
				pod("A", 10, 0.30).active("lora-x"),
				pod("B", 5, 0.70),
				pod("C", 60, 0.20).active("lora-x"),
			},
			want: []string{"A"},
		},
		{
			name: "seed example 2: a sheddable request goes to the only pod with capacity",
			req:  sheddable,
			cands: []candidate{
				pod("A", 6, 0.85),
				pod("B", 4, 0.75),
				pod("C", 7, 0.60),
			},
			want: []string{"B"},
		},
		{
			name: "seed example 3: a critical request for LoRA-Y with high queues everywhere goes to the least-queued pod with LoRA-Y",
			req:  Request{Criticality: Critical, Adapter: "lora-y"},
			cands: []candidate{
				pod("A", 70, 0.40).active("lora-y"),
				pod("B", 80, 0.60).active("lora-y"),
				pod("C", 65, 0.70),
			},
			want: []string{"A"},
		},
		{
			name:    "no candidates is an error for a critical request",
			req:     critical,
			wantErr: ErrNoCandidates,
		},
		{
			name:    "no candidates is an error for a sheddable request",
			req:     sheddable,
			wantErr: ErrNoCandidates,
		},
		{
			name: "equal candidates are picked at random, each of them sometimes",
			req:  critical,
			cands: []candidate{
				pod("A", 3, 0.5), pod("B", 3, 0.5), pod("C", 3, 0.5), pod("D", 3, 0.5),
			},
			want: []string{"A", "B", "C", "D"},
		},
		{
			name: "a single candidate is picked",
			req:  critical,
			cands: []candidate{
				pod("A", 500, 1),
			},
			want: []string{"A"},
		},
		{
			name: "a candidate without metrics loses to a busy candidate with metrics",
			req:  critical,
			cands: []candidate{
				unmeasured("A"),
				pod("B", 500, 0.99),
			},
			want: []string{"B"},
		},
		{
			name: "a candidate with stale metrics loses to a busy candidate with fresh metrics, however idle it looked",
			req:  critical,
			cands: []candidate{
				pod("A", 0, 0).updatedAt(now.Add(-6 * time.Second)),
				pod("B", 500, 0.99),
			},
			want: []string{"B"},
		},
		{
			name: "metrics exactly as old as the staleness bound are still fresh",
			req:  critical,
			cands: []candidate{
				pod("A", 0, 0).updatedAt(now.Add(-5 * time.Second)),
				pod("B", 500, 0.99),
			},
			want: []string{"A"},
		},
		{
			name: "metrics never updated are stale",
			req:  critical,
			cands: []candidate{
				pod("A", 0, 0).updatedAt(time.Time{}),
				pod("B", 500, 0.99),
			},
			want: []string{"B"},
		},
		{
			name: "metrics from slightly in the future (clock skew) are fresh",
			req:  critical,
			cands: []candidate{
				pod("A", 0, 0).updatedAt(now.Add(time.Second)),
				pod("B", 500, 0.99),
			},
			want: []string{"A"},
		},
		{
			name:   "a zero staleness bound never makes metrics stale",
			config: func(c *Config) { c.MetricsStaleness = 0 },
			req:    critical,
			cands: []candidate{
				pod("A", 0, 0).updatedAt(now.Add(-time.Hour)),
				pod("B", 500, 0.99),
			},
			want: []string{"A"},
		},
		{
			name: "a NaN KV cache usage makes a candidate unknown",
			req:  critical,
			cands: []candidate{
				pod("A", 0, nan()),
				pod("B", 500, 0.99),
			},
			want: []string{"B"},
		},
		{
			name: "a critical request goes to a random candidate when no candidate has known metrics",
			req:  critical,
			cands: []candidate{
				unmeasured("A"),
				pod("B", 0, 0).updatedAt(now.Add(-time.Minute)),
				unmeasured("C"),
			},
			want: []string{"A", "B", "C"},
		},
		{
			name: "a sheddable request is dropped when no candidate has known metrics",
			req:  sheddable,
			cands: []candidate{
				unmeasured("A"),
				pod("B", 0, 0).updatedAt(now.Add(-time.Minute)),
			},
			wantErr: ErrDropped,
		},
		{
			name: "a sheddable request is dropped when no candidate has capacity",
			req:  sheddable,
			cands: []candidate{
				pod("A", 6, 0.10),
				pod("B", 0, 0.81),
				pod("C", 60, 0.95),
			},
			wantErr: ErrDropped,
		},
		{
			name: "a sheddable request is not served by a stale candidate that looked like it had capacity",
			req:  sheddable,
			cands: []candidate{
				pod("A", 0, 0).updatedAt(now.Add(-time.Minute)),
				pod("B", 6, 0.10),
			},
			wantErr: ErrDropped,
		},
		{
			name: "a sheddable request fits a candidate exactly at both capacity thresholds",
			req:  sheddable,
			cands: []candidate{
				pod("A", 5, 0.80),
				pod("B", 6, 0.10),
			},
			want: []string{"A"},
		},
		{
			name: "a standard request is never dropped: it takes the critical path",
			req:  Request{Criticality: Standard},
			cands: []candidate{
				pod("A", 60, 0.95),
				pod("B", 70, 0.90),
			},
			want: []string{"A"},
		},
		{
			name: "a critical request is never dropped, even when no candidate has capacity",
			req:  critical,
			cands: []candidate{
				pod("A", 60, 0.95),
				pod("B", 70, 0.90),
			},
			want: []string{"A"},
		},
		{
			name: "a queue at the low-queue threshold is not low",
			req:  Request{Criticality: Critical, Adapter: "lora-x"},
			cands: []candidate{
				// Were 50 low, both would pass and A's adapter would win.
				pod("A", 50, 0.5).active("lora-x"),
				pod("B", 0, 0.5),
			},
			want: []string{"B"},
		},
		{
			name: "below the low-queue threshold, adapter affinity beats a shorter queue",
			req:  Request{Criticality: Critical, Adapter: "lora-x"},
			cands: []candidate{
				pod("A", 0, 0.1),
				pod("B", 49, 0.9).active("lora-x"),
			},
			want: []string{"B"},
		},
		{
			name: "when no pod has the adapter, the one with room under max_lora is preferred",
			req:  Request{Criticality: Critical, Adapter: "lora-x"},
			cands: []candidate{
				pod("A", 1, 0.5).active("a", "b").maxLoRA(2),
				pod("B", 1, 0.5).active("a").maxLoRA(4),
				pod("C", 1, 0.5).maxLoRA(0),
			},
			want: []string{"B"},
		},
		{
			name: "when no pod has the adapter and none can load it, all pods stay candidates",
			req:  Request{Criticality: Critical, Adapter: "lora-x"},
			cands: []candidate{
				pod("A", 1, 0.5).active("a", "b").maxLoRA(2),
				pod("B", 1, 0.5).active("a").maxLoRA(1),
			},
			want: []string{"A", "B"},
		},
		{
			name: "an adapter in the waiting set counts as affinity",
			req:  Request{Criticality: Critical, Adapter: "lora-x"},
			cands: []candidate{
				pod("A", 1, 0.5).waiting("lora-x").maxLoRA(1),
				pod("B", 1, 0.5).maxLoRA(4),
			},
			want: []string{"A"},
		},
		{
			name: "adapters of waiting requests use up max_lora slots",
			req:  Request{Criticality: Critical, Adapter: "lora-x"},
			cands: []candidate{
				pod("A", 1, 0.5).active("a").waiting("b").maxLoRA(2),
				pod("B", 1, 0.5).active("a").waiting("a").maxLoRA(2),
			},
			want: []string{"B"},
		},
		{
			name: "a request for the base model has no adapter preference",
			req:  critical,
			cands: []candidate{
				pod("A", 2, 0.5).active("lora-x").maxLoRA(1),
				pod("B", 2, 0.5).maxLoRA(4),
			},
			want: []string{"A", "B"},
		},
		{
			name: "a sheddable request with capacity prefers the adapter after the least queue",
			req:  Request{Criticality: Sheddable, Adapter: "lora-x"},
			cands: []candidate{
				pod("A", 1, 0.2),
				pod("B", 2, 0.7).active("lora-x"),
				pod("C", 5, 0.1).active("lora-x"),
				pod("D", 9, 0.1).active("lora-x"),
			},
			// Has capacity: A, B, C. Least queue: 1 + 4/3 = 2, so A and B.
			// LoRA: B.
			want: []string{"B"},
		},
		{
			name:  "prefix: among low queues, the pod holding the longest prefix of the prompt",
			req:   Request{Criticality: Critical, PrefixMatch: []int{3, 40, 0}},
			cands: []candidate{pod("A", 0, 0.2), pod("B", 2, 0.5), pod("C", 0, 0.1)},
			want:  []string{"B"},
		},
		{
			name:  "prefix: yields to a queue longer than the least by more than the margin",
			req:   Request{Criticality: Critical, PrefixMatch: []int{3, 40, 0}},
			cands: []candidate{pod("A", 0, 0.2), pod("B", 3, 0.5), pod("C", 0, 0.1)},
			// B is out of reach: the longest prefix within it is A's.
			want: []string{"A"},
		},
		{
			name:  "prefix: yields to a KV cache above the sheddable threshold (it would evict)",
			req:   Request{Criticality: Critical, PrefixMatch: []int{0, 40, 0}},
			cands: []candidate{pod("A", 0, 0.2), pod("B", 0, 0.85), pod("C", 0, 0.1)},
			// Nothing else holds the prefix: least queue, then least KV
			// cache (bound 0.1 + 0.75/3): A and C.
			want: []string{"A", "C"},
		},
		{
			name:   "prefix: a larger margin keeps the affinity under more load",
			config: func(c *Config) { c.PrefixQueueMargin = 5 },
			req:    Request{Criticality: Critical, PrefixMatch: []int{3, 40, 0}},
			cands:  []candidate{pod("A", 0, 0.2), pod("B", 3, 0.5), pod("C", 0, 0.1)},
			want:   []string{"B"},
		},
		{
			name:   "prefix: a negative margin turns the filter off",
			config: func(c *Config) { c.PrefixQueueMargin = -1 },
			req:    Request{Criticality: Critical, PrefixMatch: []int{3, 40, 0}},
			cands:  []candidate{pod("A", 0, 0.2), pod("B", 0, 0.5), pod("C", 0, 0.1)},
			want:   []string{"A", "C"},
		},
		{
			name:  "prefix: nobody holds any of it, the seed's chain decides",
			req:   Request{Criticality: Critical, PrefixMatch: []int{0, 0, 0}},
			cands: []candidate{pod("A", 0, 0.2), pod("B", 0, 0.5), pod("C", 0, 0.1)},
			want:  []string{"A", "C"},
		},
		{
			name:  "prefix: LoRA affinity comes first",
			req:   Request{Criticality: Critical, Adapter: "lora-x", PrefixMatch: []int{40, 3, 0}},
			cands: []candidate{pod("A", 0, 0.2), pod("B", 0, 0.5).active("lora-x"), pod("C", 0, 0.1).active("lora-x")},
			want:  []string{"B"},
		},
		{
			name:  "prefix: a sheddable request, among the pods with capacity",
			req:   Request{Criticality: Sheddable, PrefixMatch: []int{40, 10, 0}},
			cands: []candidate{pod("A", 1, 0.9), pod("B", 1, 0.5), pod("C", 1, 0.1)},
			// A has no capacity; B holds the longest prefix of the rest.
			want: []string{"B"},
		},
		{
			name:  "prefix: a match list of another length is ignored, never a panic",
			req:   Request{Criticality: Critical, PrefixMatch: []int{40}},
			cands: []candidate{pod("A", 0, 0.2), pod("B", 0, 0.5), pod("C", 0, 0.1)},
			want:  []string{"A", "C"},
		},
		{
			name: "least KV cache breaks a queue tie",
			req:  critical,
			cands: []candidate{
				pod("A", 2, 0.9),
				pod("B", 2, 0.3),
				pod("C", 2, 0.35),
			},
			// Bound 0.3 + 0.6/3 = 0.5: B and C.
			want: []string{"B", "C"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.config != nil {
				tt.config(&cfg)
			}
			names, cands := split(tt.cands)
			picked := map[string]int{}
			for seed := range uint64(runs) {
				s := New(cfg, rand.NewPCG(seed, 1))
				i, err := s.Schedule(tt.req, cands, now)
				if tt.wantErr != nil {
					require.ErrorIs(t, err, tt.wantErr)
					assert.Equal(t, -1, i)
					continue
				}
				require.NoError(t, err)
				require.GreaterOrEqual(t, i, 0)
				require.Less(t, i, len(cands))
				picked[names[i]]++
			}
			if tt.wantErr == nil {
				got := make([]string, 0, len(picked))
				for name := range picked {
					got = append(got, name)
				}
				assert.ElementsMatch(t, tt.want, got, "picks: %v", picked)
			}
		})
	}
}

func nan() float64 { z := 0.0; return z / z }

func TestRandomTieBreakIsRoughlyUniform(t *testing.T) {
	cands := []*Metrics{pod("A", 3, 0.5).metrics, pod("B", 3, 0.5).metrics, pod("C", 3, 0.5).metrics, pod("D", 3, 0.5).metrics}
	s := New(DefaultConfig(), rand.NewPCG(42, 42))
	counts := make([]int, len(cands))
	const n = 4000
	for range n {
		i, err := s.Schedule(Request{Criticality: Critical}, cands, now)
		require.NoError(t, err)
		counts[i]++
	}
	for i, c := range counts {
		assert.InDelta(t, n/len(cands), c, float64(n/len(cands)/5), "candidate %d picked %d times of %d", i, c, n)
	}
}

func TestSeedExample3Steps(t *testing.T) {
	// Seed 001, example 3, step by step: A 70/40% LoRA-Y, B 80/60% LoRA-Y,
	// C 65/70%.
	cands := []*Metrics{
		pod("A", 70, 0.40).active("lora-y").metrics,
		pod("B", 80, 0.60).active("lora-y").metrics,
		pod("C", 65, 0.70).metrics,
	}
	s := New(DefaultConfig(), rand.NewPCG(1, 1))
	s.reset(len(cands))
	s.cur = append(s.cur, 0, 1, 2)

	require.False(t, s.lowQueue(cands), "low queuing filter: fails, all queues are above 50")
	assert.Equal(t, []int{0, 1, 2}, s.cur, "a failed low queuing filter keeps every pod")

	s.leastQueue(cands)
	assert.Equal(t, []int{0, 2}, s.cur, "least queuing filter: pods A and C pass")

	s.lora(cands, "lora-y")
	assert.Equal(t, []int{0}, s.cur, "low cost LoRA filter: only pod A passes")

	s.leastKVCache(cands)
	assert.Equal(t, []int{0}, s.cur, "least KV cache filter: pod A passes")
}

func TestLeastFiltersKeepTheFirstSegmentOfTheRange(t *testing.T) {
	tests := []struct {
		name    string
		queues  []int
		kvCache []float64
		want    []int
	}{
		{name: "seed example 3 queues keep the pods at or below min + (max-min)/n", queues: []int{70, 80, 65}, want: []int{0, 2}},
		{name: "equal queues keep everyone", queues: []int{7, 7, 7}, want: []int{0, 1, 2}},
		{name: "a fractional segment end rounds down for integer queues", queues: []int{0, 2, 10}, want: []int{0, 1}},
		{name: "a range smaller than n keeps only the minimum", queues: []int{0, 1, 2, 3, 4}, want: []int{0}},
		{name: "a candidate just above the segment end is cut", queues: []int{10, 20, 14}, want: []int{0}},
		{name: "a candidate at the segment end passes", queues: []int{10, 20, 13}, want: []int{0, 2}},
		{name: "equal KV cache keeps everyone", kvCache: []float64{0.5, 0.5}, want: []int{0, 1}},
		{name: "KV cache keeps the pods at or below min + (max-min)/n", kvCache: []float64{0.4, 0.2, 0.7, 0.1}, want: []int{1, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cands []*Metrics
			for _, q := range tt.queues {
				cands = append(cands, &Metrics{WaitingQueue: q})
			}
			for _, u := range tt.kvCache {
				cands = append(cands, &Metrics{KVCacheUsage: u})
			}
			s := New(DefaultConfig(), nil)
			s.reset(len(cands))
			for i := range cands {
				s.cur = append(s.cur, i)
			}
			if tt.queues != nil {
				s.leastQueue(cands)
			} else {
				s.leastKVCache(cands)
			}
			assert.Equal(t, tt.want, s.cur)
		})
	}
}

func TestSchedulerIsReusableAcrossCandidateCounts(t *testing.T) {
	s := New(DefaultConfig(), rand.NewPCG(7, 7))
	for _, n := range []int{2, 1000, 3, 1, 100} {
		cands := make([]*Metrics, n)
		for i := range cands {
			cands[i] = &Metrics{WaitingQueue: 10 + i, KVCacheUsage: 0.5, UpdatedAt: now}
		}
		i, err := s.Schedule(Request{Criticality: Critical}, cands, now)
		require.NoError(t, err)
		assert.Equal(t, 0, i, "the shortest queue wins among %d candidates", n)
	}
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())

	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{name: "a negative low queue threshold is rejected", mutate: func(c *Config) { c.LowQueueThreshold = -1 }},
		{name: "a negative sheddable queue threshold is rejected", mutate: func(c *Config) { c.SheddableQueueThreshold = -1 }},
		{name: "a KV cache threshold above 1 is rejected", mutate: func(c *Config) { c.SheddableKVCacheThreshold = 80 }},
		{name: "a NaN KV cache threshold is rejected", mutate: func(c *Config) { c.SheddableKVCacheThreshold = nan() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mutate(&cfg)
			assert.Error(t, cfg.Validate())
		})
	}
}

func TestCriticalityString(t *testing.T) {
	assert.Equal(t, "Standard", Criticality(0).String(), "the zero value is the API default")
	assert.Equal(t, "Critical", Critical.String())
	assert.Equal(t, "Sheddable", Sheddable.String())
	assert.Equal(t, "Criticality(9)", Criticality(9).String())
}
