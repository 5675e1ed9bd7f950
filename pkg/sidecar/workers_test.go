package sidecar

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestWorkersRunEveryFunctionAndLeaveNothingBehind(t *testing.T) {
	before := runtime.NumGoroutine()
	w := newWorkers()
	n := 4 * runtime.GOMAXPROCS(0)
	// More functions than workers, all running at once: those no worker
	// takes run on goroutines of their own.
	var started, done sync.WaitGroup
	release := make(chan struct{})
	started.Add(n)
	done.Add(n)
	for range n {
		w.Go(func() {
			started.Done()
			<-release
			done.Done()
		})
	}
	started.Wait()
	close(release)
	done.Wait()

	w.stop()
	w.stop()
	ran := make(chan struct{})
	w.Go(func() { close(ran) })
	<-ran
	// Polled here: assert.Eventually runs goroutines of its own.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "the workers end once stopped")
}
