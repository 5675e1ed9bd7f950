package sidecar

import (
	"errors"
	"sync/atomic"

	"github.com/go-logr/logr"
)

// Defaults of the global limits, sized for the chart's memory limit of
// mci-sidecar (512 MiB): the budget of request bodies and the streams'
// own memory (a few goroutines and buffers, about 50 KiB each) take
// together some 360 MiB, leaving the rest to the informers' caches, the
// prefix index and the Go runtime.
const (
	// DefaultMaxStreams bounds the gateway's ext_proc streams served at
	// once.
	DefaultMaxStreams = 2048
	// DefaultMaxInflightBodyBytes bounds the request body bytes buffered
	// across streams, each counted twice: the body read whole and the
	// gateway's messages kept to replay it to the next cluster. 256 MiB is
	// 16 bodies of the largest size (--max-request-body-bytes, 8 MiB) at
	// once, or thousands of ordinary ones.
	DefaultMaxInflightBodyBytes = 256 << 20
)

// The limits an admission refuses at, the limit label of
// mci_sidecar_admission_refused_total.
const (
	LimitStreams   = "streams"
	LimitBodyBytes = "body_bytes"
)

// errOverBudget ends the reading of a request whose body would take the
// bytes buffered across streams past their budget.
var errOverBudget = errors.New("the sidecar's budget of buffered request bytes is spent")

// admission bounds what the sidecar holds at once across streams: the
// streams served, and the bytes of request bodies they buffer. Beyond
// either a stream is answered 503 by the sidecar itself, counted, and the
// change logged once (when the limit is first reached, and when a stream
// is admitted again). 503 rather than 429: the sidecar, not the client,
// ran out of room, and no client's rate is to blame; clients and gateways
// retry a 503 as a passing overload, while a 429 tells an API client it
// exceeded its own quota.
type admission struct {
	maxStreams, maxBytes int64
	streams, bytes       atomic.Int64
	// full says, per limit, that the last stream refused was refused by
	// it and no stream was admitted since: its change is logged once.
	full    [2]atomic.Bool
	metrics *Metrics
	logger  logr.Logger
}

func newAdmission(maxStreams, maxBytes int64, metrics *Metrics, logger logr.Logger) *admission {
	a := &admission{maxStreams: maxStreams, maxBytes: maxBytes, metrics: metrics, logger: logger}
	metrics.admissionLimits(a)
	return a
}

// enter admits a stream, or says it is one too many.
func (a *admission) enter() bool {
	if a.streams.Add(1) > a.maxStreams {
		a.streams.Add(-1)
		a.refused(LimitStreams)
		return false
	}
	return true
}

// leave ends an admitted stream, whose bytes were released.
func (a *admission) leave() { a.streams.Add(-1) }

// reserve takes n bytes of the budget, or says they are not there.
func (a *admission) reserve(n int64) bool {
	for {
		cur := a.bytes.Load()
		if cur+n > a.maxBytes {
			a.refused(LimitBodyBytes)
			return false
		}
		if a.bytes.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// release gives n bytes back to the budget.
func (a *admission) release(n int64) {
	if n != 0 {
		a.bytes.Add(-n)
	}
}

// admitted notes a stream read whole within the limits: a limit reached
// before is logged as left.
func (a *admission) admitted() {
	for i, limit := range []string{LimitStreams, LimitBodyBytes} {
		if a.full[i].Load() && a.full[i].CompareAndSwap(true, false) {
			a.logger.Info("The sidecar admits streams again", "limit", limit)
		}
	}
}

func (a *admission) refused(limit string) {
	a.metrics.admissionRefused(limit)
	i := 0
	if limit == LimitBodyBytes {
		i = 1
	}
	if !a.full[i].Load() && a.full[i].CompareAndSwap(false, true) {
		a.logger.Info("The sidecar reached a global limit; streams beyond it are answered 503 (counted in mci_sidecar_admission_refused_total; logged again when streams are admitted again)",
			"limit", limit, "maxStreams", a.maxStreams, "maxInflightBodyBytes", a.maxBytes)
	}
}
