package scheduling

import (
	"math/rand/v2"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"
)

// benchCandidates returns n candidates with a spread of queues, KV cache
// usage and adapters, a few of them unmeasured, like a busy pool.
func benchCandidates(n int) []*Metrics {
	r := rand.New(rand.NewPCG(uint64(n), 0))
	adapters := []string{"lora-a", "lora-b", "lora-c", "lora-d", "lora-e", "lora-f"}
	cands := make([]*Metrics, n)
	for i := range cands {
		if r.IntN(50) == 0 {
			continue // unmeasured
		}
		m := &Metrics{
			WaitingQueue:    r.IntN(100),
			KVCacheUsage:    r.Float64(),
			ActiveAdapters:  sets.New[string](),
			WaitingAdapters: sets.New[string](),
			MaxLoRA:         4,
			UpdatedAt:       now,
		}
		for range r.IntN(5) {
			m.ActiveAdapters.Insert(adapters[r.IntN(len(adapters))])
		}
		if r.IntN(3) == 0 {
			m.WaitingAdapters.Insert(adapters[r.IntN(len(adapters))])
		}
		cands[i] = m
	}
	return cands
}

func benchmarkSchedule(b *testing.B, n int) {
	cands := benchCandidates(n)
	reqs := []struct {
		name string
		req  Request
	}{
		{"critical-lora", Request{Criticality: Critical, Adapter: "lora-c"}},
		{"critical-missing-lora", Request{Criticality: Critical, Adapter: "lora-z"}},
		{"standard-base", Request{}},
		{"sheddable-lora", Request{Criticality: Sheddable, Adapter: "lora-c"}},
	}
	for _, rq := range reqs {
		b.Run(rq.name, func(b *testing.B) {
			s := New(DefaultConfig(), rand.NewPCG(1, 2))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Schedule(rq.req, cands, now); err != nil && err != ErrDropped {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSchedule10(b *testing.B)   { benchmarkSchedule(b, 10) }
func BenchmarkSchedule100(b *testing.B)  { benchmarkSchedule(b, 100) }
func BenchmarkSchedule1000(b *testing.B) { benchmarkSchedule(b, 1000) }

// TestScheduleDoesNotAllocate pins the zero-allocation goal so that a change
// that breaks it fails a test, not just a benchmark nobody reads.
func TestScheduleDoesNotAllocate(t *testing.T) {
	cands := benchCandidates(1000)
	s := New(DefaultConfig(), rand.NewPCG(1, 2))
	for _, req := range []Request{
		{Criticality: Critical, Adapter: "lora-c"},
		{Criticality: Critical, Adapter: "lora-z"},
		{Criticality: Standard},
		{Criticality: Sheddable, Adapter: "lora-c"},
	} {
		allocs := testing.AllocsPerRun(100, func() {
			_, _ = s.Schedule(req, cands, now)
		})
		if allocs != 0 {
			t.Errorf("Schedule(%+v) over 1000 candidates allocates %v times per decision, want 0", req, allocs)
		}
	}
}
