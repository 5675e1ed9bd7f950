package exportstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterset"
	poolclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned/typed/inferencepool/v1"
	poollisters "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
)

// FieldManager is the field manager of mci's status writes: the pool's
// managedFields name it as the writer of status.parents.
const FieldManager = "mci-apiserver"

// Source is what the controller reads: the ClusterSet cache.
type Source interface {
	// Snapshot is the read-only view the Exported condition is computed from.
	Snapshot() imports.ClusterSet
	// Ready is nil once every member has synced or been flagged
	// unreachable: before that a member still listing would look like a
	// member without the pool's namespace.
	Ready() error
	// PoolsUsingService lists the member's pools (namespace/name) whose
	// endpointPickerRef names the Service.
	PoolsUsingService(member, namespace, service string) []string
}

// Controller keeps mci's export entry on the local cluster's InferencePools
// in line with the Exported condition. Notify feeds it the cache's events;
// Run elects a leader and, on the leader only, runs the worker.
type Controller struct {
	src   Source
	local string
	pools poolclient.InferencePoolsGetter
	now   func() metav1.Time

	// queue is the work queue of the current leadership term, nil while
	// this replica does not lead: events are then dropped, and a new term
	// starts with every pool.
	queue atomic.Pointer[workqueue.TypedRateLimitingInterface[string]]
	// dirty says a local pool or a member changed since demand was last
	// computed.
	dirty      atomic.Bool
	lastDemand atomic.Bool

	// logged remembers, per pool, the last failure logged, so that a write
	// that keeps failing the same way is logged once.
	loggedMu sync.Mutex
	logged   map[string]string
}

// New returns a controller for the local cluster named local, writing
// through pools (a client of the local cluster).
func New(src Source, local string, pools poolclient.InferencePoolsGetter) *Controller {
	c := &Controller{src: src, local: local, pools: pools, now: metav1.Now, logged: map[string]string{}}
	c.dirty.Store(true)
	return c
}

// Notify maps a cache event to the pools whose entry it may change. It
// never blocks. EndpointSlice and Gateway events are ignored: readiness is
// not part of the export state.
func (c *Controller) Notify(ev clusterset.Event) {
	local := ev.Member == c.local
	if ev.Kind == clusterset.KindMember || (local && ev.Kind == clusterset.KindInferencePool) {
		c.dirty.Store(true)
	}
	qp := c.queue.Load()
	if qp == nil {
		return
	}
	q := *qp
	switch {
	case ev.Kind == clusterset.KindMember:
		c.enqueueAll(q, "")
	case local && ev.Kind == clusterset.KindInferencePool:
		q.Add(ev.Namespace + "/" + ev.Name)
	case local && ev.Kind == clusterset.KindService:
		for _, key := range c.src.PoolsUsingService(c.local, ev.Namespace, ev.Name) {
			q.Add(key)
		}
	case !local && ev.Kind == clusterset.KindNamespace:
		c.enqueueAll(q, ev.Namespace)
	}
}

// localPools is the local member's pool lister, nil when the cache does not
// hold the local cluster yet.
func localPools(cs imports.ClusterSet) poollisters.InferencePoolLister {
	for _, m := range cs.Members {
		if m.Name == cs.Local {
			return m.Pools
		}
	}
	return nil
}

// enqueueAll adds every local pool in namespace ("" = all) that has, or
// may need, mci's entry.
func (c *Controller) enqueueAll(q workqueue.TypedRateLimitingInterface[string], namespace string) {
	for _, p := range c.candidates(namespace) {
		q.Add(p.Namespace + "/" + p.Name)
	}
}

// candidates are the local pools in namespace ("" = all) that carry an
// export annotation or mci's entry: the pools mci has something to write on.
func (c *Controller) candidates(namespace string) []*poolv1.InferencePool {
	lister := localPools(c.src.Snapshot())
	if lister == nil {
		return nil
	}
	var (
		pools []*poolv1.InferencePool
		err   error
	)
	if namespace == "" {
		pools, err = lister.List(labels.Everything())
	} else {
		pools, err = lister.InferencePools(namespace).List(labels.Everything())
	}
	if err != nil {
		return nil
	}
	return slices.DeleteFunc(pools, func(p *poolv1.InferencePool) bool { return !needsEntryCheck(p) })
}

func needsEntryCheck(p *poolv1.InferencePool) bool {
	_, export := p.Annotations[v1alpha1.ExportAnnotation]
	_, exportMode := p.Annotations[v1alpha1.ExportModeAnnotation]
	return export || exportMode || slices.IndexFunc(p.Status.Parents, isOwnEntry) >= 0
}

// lead runs the worker for one leadership term, until ctx ends.
func (c *Controller) lead(ctx context.Context) {
	logger := klog.FromContext(ctx)
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "exported_status"})
	c.queue.Store(&q)
	leading.Set(1)
	defer func() {
		c.queue.Store(nil)
		q.ShutDown()
		leading.Set(0)
	}()
	logger.Info("Leading: writing the Exported status of this cluster's exported InferencePools")
	c.enqueueAll(q, "")
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for c.processNext(ctx, q) {
		}
	}, time.Second)
	<-ctx.Done()
}

func (c *Controller) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	key, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(key)
	retryAfter, err := c.sync(ctx, key)
	switch {
	case err != nil:
		c.logFailure(ctx, key, err)
		q.AddRateLimited(key)
	case retryAfter > 0:
		q.Forget(key)
		q.AddAfter(key, retryAfter)
	default:
		c.forgetFailure(key)
		q.Forget(key)
	}
	return true
}

// notReadyRetry is how soon a pool is looked at again while the cache is
// not ready.
const notReadyRetry = time.Second

// sync brings mci's entry on the pool key in line with the cache. It writes
// only when the entry's content would change.
func (c *Controller) sync(ctx context.Context, key string) (time.Duration, error) {
	if err := c.src.Ready(); err != nil {
		return notReadyRetry, nil
	}
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil // not a key this controller made; nothing to retry
	}
	cs := c.src.Snapshot()
	lister := localPools(cs)
	if lister == nil {
		return notReadyRetry, nil
	}
	pool, err := lister.InferencePools(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var want *metav1.Condition
	if cond, ok := imports.Exported(cs, namespace, name); ok {
		want = &cond
	}

	// The cached pool first; on a conflict the cache was behind, and the
	// live object decides.
	current := pool
	return 0, retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if current == nil {
			live, err := c.pools.InferencePools(namespace).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("reading InferencePool %s: %w", key, err)
			}
			current = live
		}
		parents, changed := desiredParents(current.Status.Parents, namespace, name, want, c.now())
		rv := current.ResourceVersion
		current = nil
		if !changed {
			return nil
		}
		return c.patch(ctx, namespace, name, rv, parents, want)
	})
}

// statusPatch is a JSON merge patch of status.parents with a
// resourceVersion precondition: the whole list is replaced (it is atomic),
// so it must be replaced only from the version it was computed from.
type statusPatch struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Status struct {
		// Parents null removes the field.
		Parents []poolv1.ParentStatus `json:"parents"`
	} `json:"status"`
}

func (c *Controller) patch(ctx context.Context, namespace, name, resourceVersion string, parents []poolv1.ParentStatus, want *metav1.Condition) error {
	var p statusPatch
	p.Metadata.ResourceVersion = resourceVersion
	if len(parents) > 0 {
		p.Status.Parents = parents
	}
	body, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encoding the status patch of InferencePool %s/%s: %w", namespace, name, err)
	}
	_, err = c.pools.InferencePools(namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager}, "status")
	switch {
	case err == nil:
		writes.WithLabelValues("written").Inc()
	case apierrors.IsConflict(err):
		writes.WithLabelValues("conflict").Inc()
		return err
	case apierrors.IsNotFound(err):
		writes.WithLabelValues("gone").Inc()
		return nil
	default:
		writes.WithLabelValues("failed").Inc()
		return fmt.Errorf("writing the status of InferencePool %s/%s: %w", namespace, name, err)
	}
	logger := klog.FromContext(ctx)
	if want == nil {
		logger.V(2).Info("Removed the Exported status entry", "pool", klog.KRef(namespace, name))
	} else {
		logger.V(2).Info("Wrote the Exported status entry", "pool", klog.KRef(namespace, name), "status", want.Status, "reason", want.Reason)
	}
	return nil
}

// logFailure logs a failed sync once per distinct error per pool: a write
// that keeps failing (the API refusing a 33rd parent entry, a missing
// permission) is retried with backoff, counted in
// mci_exported_status_writes_total, and not logged at every retry.
func (c *Controller) logFailure(ctx context.Context, key string, err error) {
	c.loggedMu.Lock()
	defer c.loggedMu.Unlock()
	if c.logged[key] == err.Error() {
		return
	}
	c.logged[key] = err.Error()
	klog.FromContext(ctx).Error(err, "Cannot write the Exported status; retrying with backoff", "pool", key)
}

func (c *Controller) forgetFailure(key string) {
	c.loggedMu.Lock()
	defer c.loggedMu.Unlock()
	delete(c.logged, key)
}
