package soak

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// upgrade replaces Target's mci-apiserver replicas one at a time, replica
// 1 first, each stopped as a rollout stops it (SIGTERM: it fails its
// readiness at once and drains) once the other serves, and started again
// until it is ready. Meanwhile a watch of Target's imports through its
// aggregator resumes, each time it ends, from the last resourceVersion it
// saw, as client-go's reflectors do. resourceVersions are the members'
// own, not a replica's, so a replica takes up a version another one gave
// whenever it can prove it has seen all the version has. A replica just
// started cannot for a version older than its first listing of every
// member, nor for one issued before what it learnt out of order (every
// member joining it, at its start): it refuses those with 410 Gone and
// the watcher relists. Any other 410 (a history too short, say) is a
// relist the upgrade caused for nothing. So: at most one 410 per replica
// replaced, each for one of those two reasons.
func (in *injector) upgrade(ctx context.Context, f fault) error {
	resumer := startResumer(ctx, in.mci[f.Target].InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll))
	var err error
	for _, r := range []int{1, 0} {
		if err = in.cs.StopMCIAPIServerReplica(f.Target, r); err != nil {
			break
		}
		startCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err = in.cs.StartMCIAPIServerReplica(startCtx, f.Target, r)
		cancel()
		if err != nil {
			break
		}
		in.log("fault %s: replica %d replaced", f, r)
	}
	c := resumer.stop(2)
	c.Target = fmt.Sprintf("#%d %s %s: a watch of its imports resumed from its last resourceVersion as the replicas are replaced, refused with 410 Gone at most once per replica replaced and only for a version the new replica cannot place in its history", f.ID, f.Kind, f.Target)
	in.record(f.ID, c)
	return err
}

// watchResumer is one watch that resumes from its last resourceVersion.
type watchResumer struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	resumed  int
	gone     int
	failures int
	last     string
	// goneFor are the reasons of the 410s other than unprovable.
	goneFor []string
}

// unprovable are what a replica says refusing a version another one
// issued that it cannot place in its own history (pkg/registry/virtual):
// issued before it had listed every member, or before what it learnt out
// of order, or computed with another view of the members (a replica
// started during a partition of one of them sees it otherwise than one
// that was running when it began).
var unprovable = []string{"before this one had listed every member cluster", "before it had seen what this one learnt out of order", "whose view of the members (which, in which mode, reachable or not) differs from this one's"}

type importWatcher interface {
	List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.InferencePoolImportList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

func startResumer(ctx context.Context, imports importWatcher) *watchResumer {
	ctx, cancel := context.WithCancel(ctx)
	r := &watchResumer{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		rv := ""
		for ctx.Err() == nil {
			if rv == "" {
				list, err := imports.List(ctx, metav1.ListOptions{})
				if err != nil {
					r.failed(err)
					continue
				}
				rv = list.ResourceVersion
			}
			w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				if r.refused(err) {
					rv = ""
				}
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					if r.refused(apierrors.FromObject(ev.Object)) {
						rv = ""
					}
					continue
				}
				if m, err := meta.Accessor(ev.Object); err == nil && m.GetResourceVersion() != "" {
					rv = m.GetResourceVersion()
				}
			}
			w.Stop()
			if ctx.Err() == nil && rv != "" {
				r.mu.Lock()
				r.resumed++
				r.mu.Unlock()
			}
		}
	}()
	return r
}

// refused records a refused watch and reports whether it was 410 Gone.
func (r *watchResumer) refused(err error) bool {
	gone := apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
	r.mu.Lock()
	if gone {
		r.gone++
		if !slices.ContainsFunc(unprovable, func(s string) bool { return strings.Contains(err.Error(), s) }) {
			r.goneFor = append(r.goneFor, err.Error())
		}
	}
	r.mu.Unlock()
	if !gone {
		r.failed(err)
	}
	return gone
}

// failed records another failure (the aggregator answering 503 while it
// moves to the other replica): the watch is tried again shortly.
func (r *watchResumer) failed(err error) {
	r.mu.Lock()
	r.failures++
	r.last = err.Error()
	r.mu.Unlock()
	time.Sleep(200 * time.Millisecond)
}

// stop ends the watch and checks it against replaced, the replicas
// replaced meanwhile.
func (r *watchResumer) stop(replaced int) check {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	c := check{OK: r.gone <= replaced && len(r.goneFor) == 0, Figure: fmt.Sprintf("%d resumes, %d refused with 410 Gone (%d for a version the new replica could not place), %d other failures", r.resumed, r.gone, r.gone-len(r.goneFor), r.failures)}
	if len(r.goneFor) > 0 {
		c.Figure += " (other 410: " + r.goneFor[0] + ")"
	}
	if r.last != "" {
		c.Figure += " (last: " + r.last + ")"
	}
	return c
}

// checkReplicasAgree waits until every replica of Target, each asked
// directly, serves the same imports as a fresh LIST through its
// aggregator (entries of members under a fault and pools settling left
// out, as the views' comparison does): a new replica serves what the old
// ones did, not a partial list. Bound: the heal target.
func (in *injector) checkReplicasAgree(ctx context.Context, f fault, healed time.Time) check {
	c := check{Target: fmt.Sprintf("#%d %s %s: every replica, asked directly, serves the imports its aggregator's LIST does within %s of the heal", f.ID, f.Kind, f.Target, in.healBound)}
	i := slices.IndexFunc(in.mon.views, func(v *view) bool { return v.cluster == f.Target })
	if i < 0 {
		c.Figure = "no view of " + f.Target
		return c
	}
	v := in.mon.views[i]
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		j := in.w.snapshot()
		imps, err := v.list(ctx)
		if err != nil {
			last = "aggregator: " + err.Error()
			return false, nil
		}
		want := state(imps, j.skip[f.Target], j.settling)
		for r, client := range v.replicas {
			got, err := listImports(ctx, client)
			if err != nil {
				last = fmt.Sprintf("replica %d: %v", r, err)
				return false, nil
			}
			if s := state(got, j.skip[f.Target], j.settling); s != want {
				last = fmt.Sprintf("replica %d serves [%s], the aggregator [%s]", r, s, want)
				return false, nil
			}
		}
		return true, nil
	})
	took := time.Since(healed)
	if err != nil {
		c.Figure = fmt.Sprintf("not in %s: %s", took.Round(time.Second), last)
		return c
	}
	c.OK = took <= in.healBound
	c.Figure = fmt.Sprintf("%d replicas agree %.2fs after the heal", len(v.replicas), took.Seconds())
	return c
}
