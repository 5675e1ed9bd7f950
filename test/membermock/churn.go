package membermock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"k8s.io/klog/v2"
)

// Populate gives member m the namespace and pools exported pools, each with
// a ready EPP (the Service's address is of a documentation range: nothing
// is sent to it).
func Populate(m *Member, namespace string, pools int) error {
	if err := m.Apply(Namespace(namespace)); err != nil {
		return err
	}
	for i := range pools {
		name := PoolName(i)
		if err := m.Apply(EPPService(namespace, name, fmt.Sprintf("192.0.2.%d", 1+i%250))); err != nil {
			return err
		}
		if err := m.Apply(EPPEndpoints(namespace, name, true)); err != nil {
			return err
		}
		if err := m.Apply(ExportedPool(namespace, name, true)); err != nil {
			return err
		}
	}
	return nil
}

// Churn is what changes in a fleet, and how often, fleet-wide.
type Churn struct {
	Namespace string
	Pools     int
	// ExportChanges a second: a random pool's export is withdrawn, or made
	// again.
	ExportChanges float64
	// Flaps a second: a random pool's EPP becomes unready, or ready again.
	Flaps float64
	// MembershipChanges a minute: a random member leaves, or one that left
	// joins again (with a new CA and token, so its kubeconfig is written
	// again).
	MembershipChanges float64
	// Joined is called with each member that joins again, so that its
	// kubeconfig reaches the reader.
	Joined func(name string) error
	// Left is called with each member that leaves.
	Left func(name string) error
}

// RunChurn changes the fleet at the rates of c until ctx ends. Each kind
// of change runs on its own ticker; a change of a member that has left
// is skipped.
func (f *Fleet) RunChurn(ctx context.Context, c Churn) {
	logger := klog.FromContext(ctx)
	tick := func(perSecond float64, change func() error) {
		if perSecond <= 0 {
			return
		}
		t := time.NewTicker(time.Duration(float64(time.Second) / perSecond))
		go func() {
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := change(); err != nil {
						logger.Error(err, "Churn")
					}
				}
			}
		}()
	}
	exported := map[string]bool{}
	unready := map[string]bool{}
	left := []string{}
	changes := make(chan func() error)
	// One goroutine applies every change: the churn's own state needs no lock.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case change := <-changes:
				if err := change(); err != nil {
					logger.Error(err, "Churn")
				}
			}
		}
	}()
	send := func(change func() error) func() error {
		return func() error {
			select {
			case changes <- change:
			case <-ctx.Done():
			}
			return nil
		}
	}
	pick := func() (*Member, string) {
		names := f.Names()
		if len(names) == 0 || c.Pools == 0 {
			return nil, ""
		}
		m := f.Member(names[rand.IntN(len(names))])
		return m, PoolName(rand.IntN(c.Pools))
	}
	tick(c.ExportChanges, send(func() error {
		m, pool := pick()
		if m == nil {
			return nil
		}
		key := m.Name() + "/" + pool
		withdrawn := exported[key]
		exported[key] = !withdrawn
		return m.Apply(ExportedPool(c.Namespace, pool, withdrawn))
	}))
	tick(c.Flaps, send(func() error {
		m, pool := pick()
		if m == nil {
			return nil
		}
		key := m.Name() + "/" + pool
		ready := unready[key]
		unready[key] = !ready
		return m.Apply(EPPEndpoints(c.Namespace, pool, ready))
	}))
	tick(c.MembershipChanges/60, send(func() error {
		if len(left) > 0 && rand.IntN(2) == 0 {
			name := left[0]
			left = left[1:]
			m, err := f.Join(name)
			if err != nil {
				return err
			}
			if err := Populate(m, c.Namespace, c.Pools); err != nil {
				return err
			}
			if c.Joined != nil {
				return c.Joined(name)
			}
			return nil
		}
		m, _ := pick()
		if m == nil {
			return nil
		}
		if err := f.Leave(m.Name()); err != nil {
			return err
		}
		left = append(left, m.Name())
		if c.Left != nil {
			return c.Left(m.Name())
		}
		return nil
	}))
}
