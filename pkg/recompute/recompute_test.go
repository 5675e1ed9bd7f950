package recompute

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoopComputesOnceAtStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runs := make(chan struct{}, 10)
	go New("test").Run(ctx, func(context.Context) error { runs <- struct{}{}; return nil })
	waitRun(t, runs)
	assertNoRun(t, runs)
}

func TestLoopFoldsABurstOfNotificationsIntoOneMoreRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := New("test")
	release := make(chan struct{})
	runs := make(chan struct{}, 10)
	var mu sync.Mutex
	concurrent, most := 0, 0
	go l.Run(ctx, func(context.Context) error {
		mu.Lock()
		concurrent++
		most = max(most, concurrent)
		mu.Unlock()
		runs <- struct{}{}
		<-release
		mu.Lock()
		concurrent--
		mu.Unlock()
		return nil
	})
	waitRun(t, runs) // the first run is under way and held
	for range 50 {
		l.Notify()
	}
	release <- struct{}{}
	waitRun(t, runs) // one more run for all fifty
	release <- struct{}{}
	assertNoRun(t, runs)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, most, "recomputations never overlap")
}

func TestLoopRetriesAFailedRecomputation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runs := make(chan struct{}, 10)
	failures := 2
	go New("test").Run(ctx, func(context.Context) error {
		runs <- struct{}{}
		if failures > 0 {
			failures--
			return errors.New("cache broken")
		}
		return nil
	})
	for range 3 {
		waitRun(t, runs)
	}
	assertNoRun(t, runs)
}

func TestRunReturnsWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		New("test").Run(ctx, func(context.Context) error { return nil })
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		require.Fail(t, "Run did not return after its context ended")
	}
}

func waitRun(t *testing.T, runs <-chan struct{}) {
	t.Helper()
	select {
	case <-runs:
	case <-time.After(10 * time.Second):
		require.Fail(t, "no recomputation within 10s")
	}
}

// assertNoRun proves an absence over a short window: the loop has nothing
// queued, so a run here could only come from a spurious requeue.
func assertNoRun(t *testing.T, runs <-chan struct{}) {
	t.Helper()
	select {
	case <-runs:
		assert.Fail(t, "an unexpected recomputation ran")
	case <-time.After(200 * time.Millisecond):
	}
}
