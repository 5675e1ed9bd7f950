package exportstatus

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Election says where the replicas of one cluster elect the writer.
type Election struct {
	// Leases is a client of the local cluster.
	Leases coordinationv1.LeasesGetter
	// Namespace and Name of the Lease: the server's namespace, LeaseName.
	Namespace, Name string
	// Identity of this replica, unique among the replicas.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's leader
	// election timings; DefaultElection's when zero.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// IdleAfter is how long the leader keeps the lease once the cluster
	// has nothing to write on (no exported pool, no entry left to remove)
	// before it releases it.
	IdleAfter time.Duration
}

// LeaseName is the Lease the replicas of mci-apiserver elect the Exported
// status writer with.
const LeaseName = "mci-apiserver-exported-status"

// The status is informational, so a slow failover is acceptable, and a
// long renew period keeps the leader's Lease writes few (one per
// retryPeriod while leading).
const (
	defaultLeaseDuration = 30 * time.Second
	defaultRenewDeadline = 20 * time.Second
	defaultRetryPeriod   = 5 * time.Second
	defaultIdleAfter     = time.Minute
	// demandInterval is how often demand is looked at.
	demandInterval = time.Second
)

func (e *Election) complete() {
	if e.Name == "" {
		e.Name = LeaseName
	}
	if e.LeaseDuration == 0 {
		e.LeaseDuration = defaultLeaseDuration
	}
	if e.RenewDeadline == 0 {
		e.RenewDeadline = defaultRenewDeadline
	}
	if e.RetryPeriod == 0 {
		e.RetryPeriod = defaultRetryPeriod
	}
	if e.IdleAfter == 0 {
		e.IdleAfter = defaultIdleAfter
	}
}

// Run takes part in the election whenever the local cluster has something
// to write on, and writes while it leads, until ctx ends. A cluster without
// exported pools (one that only imports) is never written to: no replica
// even holds the Lease.
func (c *Controller) Run(ctx context.Context, e Election) {
	e.complete()
	logger := klog.FromContext(ctx).WithValues("lease", klog.KRef(e.Namespace, e.Name), "identity", e.Identity)
	ctx = klog.NewContext(ctx, logger)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
		Client:     e.Leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	for ctx.Err() == nil {
		if err := wait.PollUntilContextCancel(ctx, demandInterval, true, func(context.Context) (bool, error) {
			return c.src.Ready() == nil && c.hasDemand(), nil
		}); err != nil {
			return
		}
		term, cancel := context.WithCancel(ctx)
		go c.cancelWhenIdle(term, cancel, e.IdleAfter)
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.LeaseDuration,
			RenewDeadline:   e.RenewDeadline,
			RetryPeriod:     e.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            e.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: c.lead,
				OnStoppedLeading: func() { logger.Info("No longer leading") },
			},
		})
		if err != nil {
			// Only a bad configuration gets here; it will not get better.
			logger.Error(err, "Cannot elect the Exported status writer; no Exported status is written")
			cancel()
			return
		}
		elector.Run(term)
		cancel()
	}
}

// hasDemand says whether some local pool has, or may need, mci's entry. It
// lists the pools only after a local pool or a member changed.
func (c *Controller) hasDemand() bool {
	if !c.dirty.Swap(false) {
		return c.lastDemand.Load()
	}
	d := len(c.candidates("")) > 0
	c.lastDemand.Store(d)
	return d
}

// cancelWhenIdle ends the term once the cluster has had nothing to write
// on for idleAfter.
func (c *Controller) cancelWhenIdle(term context.Context, cancel context.CancelFunc, idleAfter time.Duration) {
	var idleSince time.Time
	wait.UntilWithContext(term, func(context.Context) {
		if c.hasDemand() {
			idleSince = time.Time{}
			return
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if time.Since(idleSince) >= idleAfter {
			klog.FromContext(term).Info("Nothing to write on any more: leaving the election")
			cancel()
		}
	}, demandInterval)
}
