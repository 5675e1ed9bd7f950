package routetable

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// Router holds the current routing table. Requests load it with one atomic
// read and use that table to the end, so they never see a half-built one;
// Publish compiles the policies of the next and swaps it in.
type Router struct {
	table atomic.Pointer[Table]
	// mu serializes Publish: generations and carried-over state must follow
	// the order of the swaps.
	mu      sync.Mutex
	scoring Scoring
	// compiled are the policies of the current table, compiled, by their
	// text (Config.Name): the next table's backends of the same policy
	// take them as they are.
	compiled map[string]*clusterscore.Pipeline
}

// Scoring is what the policies of a published table are compiled with:
// the thresholds of the saturation filter and of the filter chain, and the
// memory every policy's scorers share (its entries are scoped by pool).
type Scoring struct {
	Thresholds scheduling.Config
	Memory     *clusterscore.Memory
}

// NewRouter returns a router with an empty table (generation 0), which
// answers every request 404, and whose tables' policies are compiled with
// scheduling.DefaultConfig and a memory of clusterscore.DefaultMemoryOptions
// until SetScoring says otherwise.
func NewRouter() *Router {
	r := &Router{scoring: Scoring{Thresholds: scheduling.DefaultConfig(), Memory: clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())}}
	r.table.Store(&Table{})
	return r
}

// SetScoring sets what the policies of the router's tables are compiled
// with; a nil Memory keeps the current one. It is refused once a table is
// published, whose policies would keep the scoring they were compiled
// with, and for thresholds that do not validate, with which no policy
// would compile.
func (r *Router) SetScoring(s Scoring) error {
	if err := s.Thresholds.Validate(); err != nil {
		return fmt.Errorf("cluster scoring thresholds: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.table.Load().Generation != 0 {
		return errors.New("cluster scoring set after a routing table was published")
	}
	if s.Memory == nil {
		s.Memory = r.scoring.Memory
	}
	r.scoring = s
	return nil
}

// Memory is the memory the published policies share: what they learn
// from the requests routed.
func (r *Router) Memory() *clusterscore.Memory {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.scoring.Memory
}

// Table returns the current table.
func (r *Router) Table() *Table { return r.table.Load() }

// Publish compiles t's policies and makes their candidates
// (Backend.Candidates), makes t the current table and gives it the next
// generation, so that no request compiles a policy or makes a candidate
// list. The
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
	r.compile(t)
	for b := range t.Backends {
		if b.candidates == nil {
			b.candidates = candidatesOf(b)
		}
	}
	t.Generation = old.Generation + 1
	r.table.Store(t)
}

// compile gives every backend of t its policy compiled: the one of the
// current table for the same text, else a new one. A policy that does
// not compile (only a Config written in code can fail: Parse accepts only
// what Validate does, and the thresholds were validated) makes its
// backend invalid, reported once in t.Errors, rather than routed by a
// policy nobody chose. A backend shared with the current table keeps what
// it has.
func (r *Router) compile(t *Table) {
	compiled := make(map[string]*clusterscore.Pipeline, len(r.compiled))
	failed := map[string]error{}
	for b := range t.Backends {
		switch {
		case b.scoring == invalidPolicy:
			continue
		case b.scoring != nil:
			compiled[b.Policy.Name] = b.scoring
			continue
		case b.Invalid != "":
			// Answered 500 before any policy is asked; it has none.
			b.scoring = invalidPolicy
			continue
		}
		name := b.Policy.Name
		p := compiled[name]
		if p == nil && failed[name] == nil {
			p = r.compiled[name]
		}
		if p == nil && failed[name] == nil {
			var err error
			if p, err = clusterscore.New(b.Policy, r.scoring.Thresholds, r.scoring.Memory); err != nil {
				failed[name] = err
				t.Errors = append(slices.Clip(t.Errors), &BuildError{Kind: string(b.Kind), Namespace: b.Namespace, Name: b.Name,
					Reason: ReasonInvalidAnnotation, Message: fmt.Sprintf("%s: cluster policy does not compile: %v", PolicyAnnotation, err)})
			}
		}
		if err := failed[name]; err != nil {
			b.Invalid = fmt.Sprintf("cluster policy %q does not compile: %v", name, err)
			b.scoring = invalidPolicy
			continue
		}
		compiled[name] = p
		b.scoring = p
	}
	r.compiled = compiled
}

// invalidPolicy is the compiled policy of an Invalid backend (one whose
// own policy does not compile, or that cannot be used at all): requests
// never reach it (they are answered 500), but a backend of a published
// table always has one. Weighted needs
// neither memory nor thresholds, so it compiles (TestInvalidPolicyCompiles).
var invalidPolicy, _ = clusterscore.New(routingpolicy.Named()[routingpolicy.Weighted], scheduling.DefaultConfig(), nil)
