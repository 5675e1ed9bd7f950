package simulator

import (
	"context"
	"maps"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/util/sets"
)

// engine models the part of a vLLM engine that its load metrics describe: a
// batch of at most concurrency running requests, a FIFO queue of waiting
// ones, and at most maxLoRA resident LoRA adapters.
//
// A request waits when the batch is full, or when it needs an adapter that
// is not resident and every adapter slot is held by an adapter that running
// requests use. An adapter stays resident after its requests finish (vLLM
// keeps adapters in its GPU cache too) until a request for another adapter
// needs its slot, when the least recently used idle adapter is evicted. As
// in vLLM's scheduler, a waiting request that cannot run does not hold up
// the ones behind it that can.
type engine struct {
	concurrency int
	maxLoRA     int

	mu       sync.Mutex
	running  int
	queue    []*pending
	adapters map[string]*adapter // resident
	tick     uint64              // orders adapter use for LRU eviction
}

type adapter struct {
	running  int
	lastUsed uint64
}

type pending struct {
	adapter  string
	admitted chan struct{}
	done     bool // admitted; guarded by engine.mu
}

func newEngine(concurrency, maxLoRA int) *engine {
	return &engine{concurrency: concurrency, maxLoRA: maxLoRA, adapters: map[string]*adapter{}}
}

// acquire waits until a request for adapter ("" for the base model) may run
// and returns the function that ends it. It fails only when ctx ends first,
// having left the queue.
func (e *engine) acquire(ctx context.Context, adapterName string) (release func(), err error) {
	p := &pending{adapter: adapterName, admitted: make(chan struct{})}
	e.mu.Lock()
	e.queue = append(e.queue, p)
	e.scheduleLocked()
	e.mu.Unlock()

	release = func() { e.finish(adapterName) }
	select {
	case <-p.admitted:
		return release, nil
	case <-ctx.Done():
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.done {
		// Admitted while giving up: run and end at once.
		e.finishLocked(adapterName)
		return nil, ctx.Err()
	}
	e.queue = slices.DeleteFunc(e.queue, func(q *pending) bool { return q == p })
	return nil, ctx.Err()
}

func (e *engine) finish(adapterName string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.finishLocked(adapterName)
}

func (e *engine) finishLocked(adapterName string) {
	e.running--
	if a := e.adapters[adapterName]; a != nil {
		a.running--
		e.tick++
		a.lastUsed = e.tick
	}
	e.scheduleLocked()
}

// scheduleLocked admits every waiting request that can run now, in queue
// order.
func (e *engine) scheduleLocked() {
	kept := e.queue[:0]
	for _, p := range e.queue {
		if e.running < e.concurrency && e.loadLocked(p.adapter) {
			e.running++
			if a := e.adapters[p.adapter]; a != nil {
				a.running++
				e.tick++
				a.lastUsed = e.tick
			}
			p.done = true
			close(p.admitted)
			continue
		}
		kept = append(kept, p)
	}
	clear(e.queue[len(kept):])
	e.queue = kept
}

// loadLocked makes adapterName resident if it is not, evicting the least
// recently used idle adapter when every slot is taken, and reports whether
// it is resident now. The base model ("") always is.
func (e *engine) loadLocked(adapterName string) bool {
	if adapterName == "" || e.adapters[adapterName] != nil {
		return true
	}
	if len(e.adapters) >= e.maxLoRA {
		victim, oldest := "", uint64(0)
		for name, a := range e.adapters {
			if a.running == 0 && (victim == "" || a.lastUsed < oldest) {
				victim, oldest = name, a.lastUsed
			}
		}
		if victim == "" {
			return false
		}
		delete(e.adapters, victim)
	}
	e.adapters[adapterName] = &adapter{}
	return true
}

// load is the engine's state as its metrics report it.
type load struct {
	Waiting, Running int
	KVCacheUsage     float64
	// RunningAdapters are the resident adapters, WaitingAdapters the
	// adapters of waiting requests; both sorted.
	RunningAdapters, WaitingAdapters []string
}

func (e *engine) load() load {
	e.mu.Lock()
	defer e.mu.Unlock()
	waiting := sets.New[string]()
	for _, p := range e.queue {
		if p.adapter != "" {
			waiting.Insert(p.adapter)
		}
	}
	return load{
		Waiting: len(e.queue),
		Running: e.running,
		// Running requests hold KV cache blocks; a full batch is a full
		// cache.
		KVCacheUsage:    min(float64(e.running)/float64(e.concurrency), 1),
		RunningAdapters: append([]string{}, slices.Sorted(maps.Keys(e.adapters))...),
		WaitingAdapters: sets.List(waiting),
	}
}
