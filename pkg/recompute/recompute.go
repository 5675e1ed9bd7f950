// Package recompute is the level-triggered loop of client-go controllers for
// a component that derives one whole result from its informers' caches:
// event handlers only note that something changed, and one worker
// recomputes. It is a workqueue with a single key, so a burst of changes
// costs one recomputation, a recomputation never runs twice at once, and a
// failed one is retried with the workqueue's rate-limited backoff.
package recompute

import (
	"context"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// everything is the one key: what is recomputed is always the whole result.
type everything struct{}

// Loop coalesces change notifications into recomputations.
type Loop struct {
	queue workqueue.TypedRateLimitingInterface[everything]
}

// New returns a Loop whose first recomputation is already due, so Run
// computes once at start even if nothing changes. name labels the
// workqueue's metrics.
func New(name string) *Loop {
	l := &Loop{queue: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[everything](),
		workqueue.TypedRateLimitingQueueConfig[everything]{Name: name},
	)}
	l.Notify()
	return l
}

// Notify asks for a recomputation. Notifications that arrive before the
// worker takes the key, or while it recomputes, fold into one more run.
func (l *Loop) Notify() { l.queue.Add(everything{}) }

// Handler is an informer event handler that notifies on every add, update
// and delete.
func (l *Loop) Handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.Notify() },
		UpdateFunc: func(any, any) { l.Notify() },
		DeleteFunc: func(any) { l.Notify() },
	}
}

// Run calls compute once per burst of notifications until ctx ends, and
// again after a rate-limited delay when compute fails. compute must return
// when ctx ends.
func (l *Loop) Run(ctx context.Context, compute func(context.Context) error) {
	go func() {
		<-ctx.Done()
		l.queue.ShutDown()
	}()
	for {
		key, quit := l.queue.Get()
		if quit {
			return
		}
		if err := compute(ctx); err != nil && ctx.Err() == nil {
			l.queue.AddRateLimited(key)
		} else {
			l.queue.Forget(key)
		}
		l.queue.Done(key)
	}
}
