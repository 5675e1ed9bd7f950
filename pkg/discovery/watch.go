package discovery

import (
	"context"
	"fmt"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/recompute"
)

// watchReadySet runs the informers of factory until ctx ends and streams the
// changes of the ready set that snapshot computes from their caches.
//
// Level-triggered, as controllers are (pkg/recompute): informer handlers
// only note that something changed, and one worker recomputes the whole
// ready set from the caches and emits its difference from the set last
// emitted. An instance that moves between objects (an endpoint from one
// EndpointSlice to another) therefore causes no event when both are seen
// in one recomputation, and changes that arrive while a slow consumer holds
// up a send are folded into the next difference instead of piling up.
func watchReadySet(ctx context.Context, what string, factory informers.SharedInformerFactory, informer cache.SharedIndexInformer, snapshot func() (map[string]Instance, error)) (<-chan Event, error) {
	loop := recompute.New("discovery")
	if _, err := informer.AddEventHandler(loop.Handler()); err != nil {
		return nil, fmt.Errorf("watching %s: %w", what, err)
	}
	logger := klog.FromContext(ctx).WithValues("source", what)
	factory.Start(ctx.Done())

	events := make(chan Event)
	go func() {
		defer close(events)
		// Shutdown waits for the informers' goroutines, which stop with ctx.
		defer factory.Shutdown()
		if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			return
		}
		emitted := map[string]Instance{}
		loop.Run(ctx, func(ctx context.Context) error {
			current, err := snapshot()
			if err != nil {
				// Only a broken cache fails here; the last set stays and
				// the loop retries.
				logger.Error(err, "Computing the ready instances")
				return err
			}
			for _, ev := range Diff(emitted, current) {
				select {
				case events <- ev:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			emitted = current
			return nil
		})
	}()
	return events, nil
}
