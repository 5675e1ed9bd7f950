package sidecar

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// poller keeps the latest result of a periodic check of each of a changing
// set of targets (EPP health addresses, EPP metrics URLs). Each target is
// polled by a goroutine of its own, so a hung target delays no other. All
// methods are safe for concurrent use; set may be called before Run.
// (metrics.Scraper keeps a loop of its own: it validates URLs and logs
// each model server's failures, where this one is generic over check.)
type poller[T any] struct {
	interval time.Duration
	// check polls one target. An error keeps the last value (it goes stale);
	// a check that wants a failure recorded returns a value saying so.
	check func(ctx context.Context, target string) (*T, error)
	// forget, when set, is called once a target is removed and its goroutine
	// has ended.
	forget func(target string)

	mu      sync.RWMutex
	targets map[string]*pollTarget[T]
	runCtx  context.Context
	wg      sync.WaitGroup
}

type pollTarget[T any] struct {
	cancel context.CancelFunc
	value  atomic.Pointer[T]
	// wake, when it holds a token, makes the loop check at once rather
	// than at the end of its interval.
	wake chan struct{}
}

func newPollTarget[T any]() *pollTarget[T] {
	return &pollTarget[T]{wake: make(chan struct{}, 1)}
}

func newPoller[T any](interval time.Duration, check func(context.Context, string) (*T, error)) *poller[T] {
	return &poller[T]{interval: interval, check: check, targets: map[string]*pollTarget[T]{}}
}

// Run polls until ctx ends, then waits for the checks in flight.
func (p *poller[T]) Run(ctx context.Context) error {
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

// set makes the targets exactly keys; kept targets keep their values.
func (p *poller[T]) set(keys []string) {
	want := make(map[string]bool, len(keys))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range keys {
		if k == "" {
			continue
		}
		want[k] = true
		if _, ok := p.targets[k]; ok {
			continue
		}
		t := newPollTarget[T]()
		p.targets[k] = t
		if p.runCtx != nil {
			p.start(k, t)
		}
	}
	for k, t := range p.targets {
		if !want[k] {
			delete(p.targets, k)
			if t.cancel != nil {
				t.cancel()
			} else if p.forget != nil {
				p.forget(k)
			}
		}
	}
}

// start runs a target's loop. p.mu must be held and p.runCtx set.
func (p *poller[T]) start(key string, t *pollTarget[T]) {
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
		if p.forget != nil {
			p.mu.RLock()
			_, back := p.targets[key]
			p.mu.RUnlock()
			if !back {
				p.forget(key)
			}
		}
	})
}

// get returns the latest value of a target; nil when unknown.
func (p *poller[T]) get(key string) *T {
	p.mu.RLock()
	t := p.targets[key]
	p.mu.RUnlock()
	if t == nil {
		return nil
	}
	return t.value.Load()
}

// has reports whether key is a target.
func (p *poller[T]) has(key string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	_, ok := p.targets[key]
	return ok
}

// poke makes a target check at once (its interval starts again after).
func (p *poller[T]) poke(key string) {
	p.mu.RLock()
	t := p.targets[key]
	p.mu.RUnlock()
	if t == nil {
		return
	}
	select {
	case t.wake <- struct{}{}:
	default: // a check is already due
	}
}

// put records a value for a target out of turn (a passive health finding).
func (p *poller[T]) put(key string, v *T) {
	p.mu.RLock()
	t := p.targets[key]
	p.mu.RUnlock()
	if t != nil {
		t.value.Store(v)
	}
}

// keys returns the targets.
func (p *poller[T]) keys() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]string, 0, len(p.targets))
	for k := range p.targets {
		out = append(out, k)
	}
	return out
}
