package sidecar

import (
	"runtime"
	"sync"
)

// workers run the goroutine the sidecar starts for each request's response
// phase (the pump of the gateway's messages to the EPP) on goroutines that
// outlive it, as gRPC's stream workers do for the streams: a new
// goroutine's stack starts small and grows again through gRPC's calls
// every time, which costs about as much as the pump's own work. A few
// workers wait for work; when they are all busy, a new goroutine does it.
type workers struct {
	work chan func()
	quit chan struct{}
	once sync.Once
}

// newWorkers starts one worker per processor the Go scheduler runs on.
func newWorkers() *workers {
	w := &workers{work: make(chan func()), quit: make(chan struct{})}
	for range runtime.GOMAXPROCS(0) {
		go w.run()
	}
	return w
}

func (w *workers) run() {
	for {
		select {
		case f := <-w.work:
			f()
		case <-w.quit:
			return
		}
	}
}

// Go runs f on a waiting worker, or else on a new goroutine.
func (w *workers) Go(f func()) {
	select {
	case w.work <- f:
	default:
		go f()
	}
}

// stop ends the workers once they are done with their work; Go still runs
// functions after, on new goroutines.
func (w *workers) stop() { w.once.Do(func() { close(w.quit) }) }
