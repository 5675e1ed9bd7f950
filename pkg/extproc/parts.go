package extproc

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// Parts runs the long-lived parts of a server (its ext_proc, health and
// metrics servers; the EPP's and the sidecar's watchers and pollers) in an
// errgroup: the first part to fail ends the context of the others, and an
// error a part returns once that context has ended is the stop's own and
// is dropped.
type Parts struct {
	g   *errgroup.Group
	ctx context.Context
}

// NewParts returns the parts' group and the context they run with.
func NewParts(ctx context.Context) (*Parts, context.Context) {
	g, ctx := errgroup.WithContext(ctx)
	return &Parts{g: g, ctx: ctx}, ctx
}

// Run runs f with the parts' context. An error it returns while the parts
// run stops them, prefixed with what ("" when the error names its part
// already).
func (p *Parts) Run(what string, f func(context.Context) error) {
	p.g.Go(func() error {
		err := f(p.ctx)
		if err == nil || p.ctx.Err() != nil {
			return nil
		}
		if what == "" {
			return err
		}
		return fmt.Errorf("%s: %w", what, err)
	})
}

// Wait waits for every part and returns the failure that stopped them;
// nil when they stopped because the context given to NewParts ended.
func (p *Parts) Wait() error { return p.g.Wait() }
