// Package poll keeps the latest result of a periodic check of each of a
// changing set of targets: EPP health addresses and EPP metrics URLs for
// mci-sidecar, model servers' /metrics URLs for the reference EPP
// (metrics.Scraper). One loop for all of them, so that a target's
// lifetime, its wake-ups and the stop are written once.
package poll

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Poller keeps the latest result of a periodic check of each of a
// changing set of targets. Each target is polled by a goroutine of its
// own, so a hung target delays no other; a target's checks never overlap
// (the interval starts when a check ends). All methods are safe for
// concurrent use; targets may be set before Run.
type Poller[T any] struct {
	interval time.Duration
	check    func(ctx context.Context, target string) (*T, error)
	// Forget, when set, is called once a target is removed and its
	// goroutine has ended. Set it before Run.
	Forget func(target string)

	mu sync.RWMutex
	// targets is replaced when they change, never modified (Set).
	targets map[string]*pollTarget[T]
	// sets numbers the calls of Set (same).
	sets uint64
	// published are the targets as last set: Get and the other readers
	// look them up without a lock, the sidecar's picks reading 1,000 of
	// them or more each while they change only with the routing table.
	published atomic.Pointer[publishedTargets[T]]
	runCtx    context.Context
	wg        sync.WaitGroup
}

type pollTarget[T any] struct {
	// seen is the number of the last Set that named it (same); written
	// with the poller's mu held for writing.
	seen   uint64
	cancel context.CancelFunc
	value  atomic.Pointer[T]
	// wake, when it holds a token, makes the loop check at once rather
	// than at the end of its interval.
	wake chan struct{}
}

// publishedTargets are the targets at one moment, and which change of
// them that was (Version).
type publishedTargets[T any] struct {
	version uint64
	targets map[string]*pollTarget[T]
}

func newPollTarget[T any]() *pollTarget[T] {
	return &pollTarget[T]{wake: make(chan struct{}, 1)}
}

// New returns a poller without targets that checks each target every
// interval. check polls one target: an error keeps the last value (it goes
// stale); a check that wants a failure recorded returns a value saying so.
func New[T any](interval time.Duration, check func(ctx context.Context, target string) (*T, error)) *Poller[T] {
	p := &Poller[T]{interval: interval, check: check, targets: map[string]*pollTarget[T]{}}
	p.publish()
	return p
}

// publish makes the readers see the targets as they are, p.targets,
// which Set replaces rather than modifies. p.mu must be held, or p not
// yet shared.
func (p *Poller[T]) publish() {
	next := &publishedTargets[T]{targets: p.targets}
	if last := p.published.Load(); last != nil {
		next.version = last.version + 1
	}
	p.published.Store(next)
}

// target is key's target as last published; nil when none.
func (p *Poller[T]) target(key string) *pollTarget[T] {
	return p.published.Load().targets[key]
}

// Ref is a target's latest value read without a look-up, for a caller
// that reads the same targets again and again (the clusters of a
// backend, at every pick of the sidecar) and looks them up once for each
// change of the targets (Refs, Version). The zero Ref, or one of a key
// that was no target, has no value.
type Ref[T any] struct{ t *pollTarget[T] }

// Load is the target's latest value, as Get returns it while the targets
// are those of the version its Ref was made in; nil when none.
func (r Ref[T]) Load() *T {
	if r.t == nil {
		return nil
	}
	return r.t.value.Load()
}

// Refs sets out[i] to the Ref of keys(i) for each i below len(out), and
// returns the version of the targets they are the targets of: they read
// what Get reads as long as Version returns it. A target removed, and
// set again, is another target, which its old Ref does not read.
func (p *Poller[T]) Refs(keys func(i int) string, out []Ref[T]) (version uint64) {
	pub := p.published.Load()
	for i := range out {
		out[i] = Ref[T]{t: pub.targets[keys(i)]}
	}
	return pub.version
}

// Version says which change of the targets is the latest: it changes
// whenever one is added or removed.
func (p *Poller[T]) Version() uint64 { return p.published.Load().version }

// Run polls until ctx ends, then waits for the checks in flight.
func (p *Poller[T]) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.runCtx != nil {
		p.mu.Unlock()
		return errors.New("already running")
	}
	p.runCtx = ctx
	for k, t := range p.targets {
		p.start(k, t)
	}
	p.mu.Unlock()
	<-ctx.Done()
	p.mu.Lock()
	p.runCtx = nil
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Set makes the targets exactly keys ("" is none); kept targets keep their
// values. The targets are a new map when they change, never modified
// after, so that readers read them without a lock (publish).
func (p *Poller[T]) Set(keys []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.same(keys) {
		return
	}
	next := make(map[string]*pollTarget[T], len(keys))
	changed := false
	for _, k := range keys {
		if k == "" {
			continue
		}
		if _, ok := next[k]; ok {
			continue
		}
		t, ok := p.targets[k]
		if !ok {
			t, changed = newPollTarget[T](), true
			if p.runCtx != nil {
				p.start(k, t)
			}
		}
		next[k] = t
	}
	for k, t := range p.targets {
		if _, ok := next[k]; ok {
			continue
		}
		changed = true
		if t.cancel != nil {
			t.cancel()
		} else if p.Forget != nil {
			p.Forget(k)
		}
	}
	if changed {
		p.targets = next
		p.publish()
	}
}

// same reports whether keys, without "", are the targets: the usual case
// of a new routing table, answered with a look-up a key rather than a
// map of them built (a millisecond at 10,000 targets). p.mu must be held
// for writing.
func (p *Poller[T]) same(keys []string) bool {
	// Each target found is marked with this call's number, so that a
	// repeated key counts once: as many distinct keys as targets, every
	// one a target, are the targets.
	p.sets++
	n := 0
	for _, k := range keys {
		if k == "" {
			continue
		}
		t, ok := p.targets[k]
		if !ok {
			return false
		}
		if t.seen != p.sets {
			t.seen = p.sets
			n++
		}
	}
	return n == len(p.targets)
}

// start runs a target's loop. p.mu must be held and p.runCtx set.
func (p *Poller[T]) start(key string, t *pollTarget[T]) {
	ctx, cancel := context.WithCancel(p.runCtx)
	t.cancel = cancel
	p.wg.Go(func() {
		defer cancel()
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
			case <-timer.C:
			case <-t.wake:
				timer.Stop()
			}
			if ctx.Err() != nil {
				break
			}
			v, err := p.check(ctx, key)
			if err == nil && ctx.Err() == nil {
				t.value.Store(v)
			}
			timer.Reset(p.interval)
		}
		if p.Forget != nil {
			p.mu.RLock()
			_, back := p.targets[key]
			p.mu.RUnlock()
			if !back {
				p.Forget(key)
			}
		}
	})
}

// Get returns the latest value of a target; nil when unknown.
func (p *Poller[T]) Get(key string) *T {
	t := p.target(key)
	if t == nil {
		return nil
	}
	return t.value.Load()
}

// Has reports whether key is a target.
func (p *Poller[T]) Has(key string) bool {
	return p.target(key) != nil
}

// Poke makes a target check at once (its interval starts again after).
func (p *Poller[T]) Poke(key string) {
	t := p.target(key)
	if t == nil {
		return
	}
	select {
	case t.wake <- struct{}{}:
	default: // a check is already due
	}
}

// Put records a value for a target out of turn (a passive health finding).
func (p *Poller[T]) Put(key string, v *T) {
	if t := p.target(key); t != nil {
		t.value.Store(v)
	}
}

// Keys returns the targets.
func (p *Poller[T]) Keys() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]string, 0, len(p.targets))
	for k := range p.targets {
		out = append(out, k)
	}
	return out
}
