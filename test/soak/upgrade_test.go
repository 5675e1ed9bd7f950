package soak

import (
	"context"
	"fmt"
	"slices"
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
// saw, as client-go's reflectors do: a new replica must take up what an
// old one gave (resourceVersions are the members' own, not a replica's),
// so not one resume may be refused with 410 Gone (which makes every
// watcher of the cluster, mci-sidecar among them, relist).
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
	c := resumer.stop()
	c.Target = fmt.Sprintf("#%d %s %s: a watch of its imports resumed from its last resourceVersion as the replicas are replaced, never refused with 410 Gone", f.ID, f.Kind, f.Target)
	in.mu.Lock()
	in.upgraded[f.ID] = c
	in.mu.Unlock()
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
}

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

func (r *watchResumer) stop() check {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	c := check{OK: r.gone == 0, Figure: fmt.Sprintf("%d resumes, %d refused with 410 Gone, %d other failures", r.resumed, r.gone, r.failures)}
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
