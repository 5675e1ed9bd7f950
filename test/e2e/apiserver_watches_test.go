package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// Hundreds of watches proxied by the aggregator, more than an HTTP/2
// connection carries by default (100 streams), all stay open and all see
// the same change.
func TestAPIServerServesHundredsOfConcurrentWatches(t *testing.T) {
	const watchers = 300
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-many-watches"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	imports := b.mci.InferenceV1alpha1().InferencePoolImports(ns)

	l, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	ws := make([]watch.Interface, 0, watchers)
	defer func() {
		for _, w := range ws {
			w.Stop()
		}
	}()
	for range watchers {
		w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
		require.NoError(t, err)
		ws = append(ws, w)
	}

	start := time.Now()
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "many", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var latencies []time.Duration
	failed := 0
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case ev, ok := <-w.ResultChan():
					if ok && ev.Type == watch.Bookmark {
						continue
					}
					mu.Lock()
					defer mu.Unlock()
					if !ok || ev.Type != watch.Added {
						failed++
						return
					}
					latencies = append(latencies, time.Since(start))
					return
				case <-ctx.Done():
					mu.Lock()
					failed++
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, failed, "watches that ended or saw no ADDED event")
	require.Len(t, latencies, watchers)
	slowest := time.Duration(0)
	for _, d := range latencies {
		slowest = max(slowest, d)
	}
	t.Logf("%d watches through the aggregator each saw the import; the last %s after the pool was created", watchers, slowest.Round(time.Millisecond))
}
