// Package scheduling is the endpoint-picking filter chain of seed 001: given a
// request (its criticality and the LoRA adapter it targets) and the load
// metrics of a set of candidates, it picks one candidate or sheds the request.
//
// The chain does not know what a candidate is. The EPP schedules over
// model-server pods, the multi-cluster sidecar over whole clusters; both pass
// a slice of *Metrics parallel to their own candidate slice and get back an
// index into it.
package scheduling

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
)

// Metrics is the load of one candidate as the scheduler sees it. A *Metrics
// handed to the scheduler is read, never written, so producers (the scraper in
// pkg/metrics) publish a new value instead of mutating a published one.
type Metrics struct {
	// WaitingQueue is the number of requests waiting to be scheduled on the
	// candidate (vLLM's num_requests_waiting).
	WaitingQueue int
	// KVCacheUsage is the fraction of the KV cache in use, from 0 to 1.
	KVCacheUsage float64
	// RunningRequests is the number of requests in the candidate's batch
	// (vLLM's num_requests_running), summed over its engines, when
	// RunningKnown: a server may not expose it.
	RunningRequests int
	RunningKnown    bool
	// ActiveAdapters are the LoRA adapters of running requests: loaded.
	ActiveAdapters sets.Set[string]
	// WaitingAdapters are the LoRA adapters of waiting requests: about to be
	// loaded.
	WaitingAdapters sets.Set[string]
	// MaxLoRA is how many adapters the candidate can hold at once; 0 when it
	// serves no adapters.
	MaxLoRA int
	// UpdatedAt is when these metrics were observed. The zero time means never,
	// which the scheduler treats as stale.
	UpdatedAt time.Time
}

// hasAdapter reports whether the adapter is loaded or being loaded: in both
// cases a request for it does not make the candidate load another one.
func (m *Metrics) hasAdapter(name string) bool {
	// The len checks skip a map lookup for empty sets, the common case for
	// waiting adapters.
	return (len(m.ActiveAdapters) > 0 && m.ActiveAdapters.Has(name)) ||
		(len(m.WaitingAdapters) > 0 && m.WaitingAdapters.Has(name))
}

// canLoadAdapter reports whether the candidate has a free adapter slot.
// Adapters of waiting requests count against max_lora along with the running
// ones: they are next in line for a slot, so a candidate whose slots are all
// spoken for must not look free.
func (m *Metrics) canLoadAdapter() bool {
	n := len(m.ActiveAdapters)
	switch {
	case n >= m.MaxLoRA:
		return false
	case n+len(m.WaitingAdapters) < m.MaxLoRA:
		// Room even if no waiting adapter is already active; this spares
		// iterating a map, the costliest step of a decision, in the common case.
		return true
	}
	for name := range m.WaitingAdapters {
		if !m.ActiveAdapters.Has(name) {
			n++
		}
	}
	return n < m.MaxLoRA
}

// Criticality is how important a request is. It mirrors the InferenceModel
// criticality (inference.networking.x-k8s.io/v1alpha2).
type Criticality int8

const (
	// Standard is the zero value because it is the API's default for an
	// InferenceModel without a criticality. Seed 001 only knows "critical" and
	// "sheddable"; Standard takes the critical path (it is never shed) because
	// the API documents shedding for Sheddable requests only.
	Standard Criticality = iota
	// Critical requests go through low queue -> LoRA affinity -> least queue ->
	// least KV cache and are never dropped while a candidate exists.
	Critical
	// Sheddable requests are served only by a candidate with spare capacity
	// and are dropped (ErrDropped) when there is none.
	Sheddable
)

// String returns the API spelling of the criticality.
func (c Criticality) String() string {
	switch c {
	case Standard:
		return "Standard"
	case Critical:
		return "Critical"
	case Sheddable:
		return "Sheddable"
	default:
		return fmt.Sprintf("Criticality(%d)", int(c))
	}
}

// Request is what the scheduler needs to know about one request.
type Request struct {
	Criticality Criticality
	// Adapter is the LoRA adapter the request targets, after InferenceModel
	// rewrites. Empty means the base model: no LoRA preference, and the LoRA
	// filters are skipped.
	Adapter string
	// PrefixMatch, parallel to the candidates, is how many leading blocks
	// of the request's prompt each candidate is likely to hold in its
	// prefix cache (an approximate index of where earlier prompts went);
	// nil when nothing is known, and then the prefix filter is skipped.
	PrefixMatch []int
}

// Config holds the thresholds of the filter chain.
type Config struct {
	// LowQueueThreshold: a critical request prefers candidates whose waiting
	// queue is strictly below it.
	LowQueueThreshold int
	// SheddableQueueThreshold and SheddableKVCacheThreshold define "has
	// capacity" for sheddable requests: queue <= the first and KV cache usage
	// <= the second.
	SheddableQueueThreshold   int
	SheddableKVCacheThreshold float64
	// MetricsStaleness is how old metrics may be before the candidate counts as
	// unknown. Zero or negative disables the check (only nil metrics are
	// unknown then).
	MetricsStaleness time.Duration
	// PrefixQueueMargin is how many more waiting requests than the least
	// queued candidate a candidate holding the request's prefix may have
	// and still be preferred for it (its KV cache must also be at most
	// SheddableKVCacheThreshold): prefix affinity yields to load beyond
	// that. Negative turns the prefix filter off.
	PrefixQueueMargin int
}

// DefaultConfig returns the thresholds of seed 001.
func DefaultConfig() Config {
	return Config{
		LowQueueThreshold:         50,
		SheddableQueueThreshold:   5,
		SheddableKVCacheThreshold: 0.8,
		MetricsStaleness:          5 * time.Second,
		PrefixQueueMargin:         DefaultPrefixQueueMargin,
	}
}

// DefaultPrefixQueueMargin is the default Config.PrefixQueueMargin: a
// prefix served from cache spares the prefill of the whole shared prompt
// (system prompts of hundreds to thousands of tokens), worth waiting behind
// a couple of requests, not behind a queue.
const DefaultPrefixQueueMargin = 2

// Validate reports a configuration the chain cannot work with.
func (c Config) Validate() error {
	switch {
	case c.LowQueueThreshold < 0:
		return fmt.Errorf("low queue threshold %d is negative", c.LowQueueThreshold)
	case c.SheddableQueueThreshold < 0:
		return fmt.Errorf("sheddable queue threshold %d is negative", c.SheddableQueueThreshold)
	case !(c.SheddableKVCacheThreshold >= 0 && c.SheddableKVCacheThreshold <= 1):
		return fmt.Errorf("sheddable KV cache threshold %v is not between 0 and 1", c.SheddableKVCacheThreshold)
	}
	return nil
}
