package routetable

import (
	"sync"
	"sync/atomic"
)

// Router holds the current routing table. Requests load it with one atomic
// read and use that table to the end, so they never see a half-built one;
// Publish swaps in the next.
type Router struct {
	table atomic.Pointer[Table]
	// mu serializes Publish: generations and carried-over state must follow
	// the order of the swaps.
	mu sync.Mutex
}

// NewRouter returns a router with an empty table (generation 0), which
// answers every request 404.
func NewRouter() *Router {
	r := &Router{}
	r.table.Store(&Table{})
	return r
}

// Table returns the current table.
func (r *Router) Table() *Table { return r.table.Load() }

// Publish makes t the current table and gives it the next generation. The
// weighted pickers of t whose candidates and weights are unchanged take over
// the state of the previous table's, so that a rebuild (any informer event)
// does not restart the round-robin cycle, which would skew a split toward
// the candidates that come first (a table of Incremental comes with the
// state carried over already). t must not be in use yet.
func (r *Router) Publish(t *Table) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.table.Load()
	if !t.carried {
		prev := map[string]*rotation{}
		old.wrrs(func(w **rotation) { prev[(*w).key] = *w })
		t.wrrs(func(w **rotation) {
			if p, ok := prev[(*w).key]; ok {
				*w = p
			}
		})
	}
	t.Generation = old.Generation + 1
	r.table.Store(t)
}
