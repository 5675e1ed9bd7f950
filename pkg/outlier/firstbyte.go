package outlier

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// FirstByteConfig says how long a cluster may take to the first byte of a
// response before the request counts as a gateway failure: Factor times
// the Quantile of its last HistorySize times to first byte, within
// [Floor, Ceiling]. A cluster with fewer than MinSamples of them gets the
// Ceiling: it has no history to be held to.
type FirstByteConfig struct {
	Quantile float64
	Factor   float64
	Floor    time.Duration
	Ceiling  time.Duration
}

const (
	// HistorySize is how many of a cluster's last times to first byte its
	// bound is derived from.
	HistorySize = 128
	// MinSamples is how many a cluster needs before its bound is its own.
	MinSamples = 10
	// recompute: past MinSamples, the bound is derived again every
	// recompute samples.
	recompute = 8
)

// DefaultFirstByteConfig: three times a cluster's 99th percentile, at
// least 1 s (a hung cluster that answered in tens of milliseconds is then
// taken out within two seconds), at most 60 s (the first byte of a
// response that is not streamed comes with its last token).
func DefaultFirstByteConfig() FirstByteConfig {
	return FirstByteConfig{Quantile: 0.99, Factor: 3, Floor: time.Second, Ceiling: time.Minute}
}

// Validate says what is wrong with c.
func (c FirstByteConfig) Validate() error {
	switch {
	case !(c.Quantile > 0 && c.Quantile <= 1):
		return fmt.Errorf("first-byte quantile %v must be within (0, 1]", c.Quantile)
	case !(c.Factor >= 1) || math.IsInf(c.Factor, 0):
		return fmt.Errorf("first-byte factor %v must be at least 1", c.Factor)
	case c.Floor <= 0 || c.Ceiling < c.Floor:
		return fmt.Errorf("first-byte floor %v must be positive and at most the ceiling %v", c.Floor, c.Ceiling)
	}
	return nil
}

// history is a cluster's last times to first byte, and the bound derived
// from them.
type history struct {
	samples []time.Duration
	next    int
	added   int
	bound   time.Duration
}

func (h *history) add(d time.Duration, c FirstByteConfig) {
	if len(h.samples) < HistorySize {
		h.samples = append(h.samples, d)
	} else {
		h.samples[h.next] = d
		h.next = (h.next + 1) % HistorySize
	}
	if h.added++; len(h.samples) <= MinSamples || h.added%recompute == 0 {
		h.bound = c.derive(h.samples)
	}
}

// derive is the bound of samples.
func (c FirstByteConfig) derive(samples []time.Duration) time.Duration {
	if len(samples) < MinSamples {
		return c.Ceiling
	}
	sorted := slices.Sorted(slices.Values(samples))
	q := sorted[min(int(math.Ceil(c.Quantile*float64(len(sorted))))-1, len(sorted)-1)]
	b := time.Duration(min(float64(q)*c.Factor, float64(c.Ceiling)))
	return min(max(b, c.Floor), c.Ceiling)
}

// FirstByte notes that a request to k had its first byte after d.
func (d *Detector) FirstByte(k Key, took time.Duration, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, m := d.member(k, now)
	m.firstBytes.add(max(took, 0), d.fb)
}

// FirstByteBound is how long a request to k may wait for its first byte.
func (d *Detector) FirstByteBound(k Key) time.Duration {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if p := d.pools[k.Pool]; p != nil {
		if m := p.members[k.Cluster]; m != nil && m.firstBytes.bound > 0 {
			return m.firstBytes.bound
		}
	}
	return d.fb.Ceiling
}
