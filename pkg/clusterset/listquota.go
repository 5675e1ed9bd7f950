package clusterset

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/noserver"
)

// listPageSize is how many objects a member is asked for in one page of a
// list: past its limits, this server holds at most one page more than
// they allow before it stops reading and freezes the member.
const listPageSize = 500

// typedListWatch is a typed client of one resource of a member, as
// client-go's and the generated clientsets make them.
type typedListWatch[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// boundedInformer makes, for an informer factory's InformerFor, the
// informer of obj (of kind) that lists and watches the member through
// client, a client of namespace ("": of all namespaces), within its limits
// (listQuota). Registered before the factory's own accessor is called, it
// is the one that accessor, its lister and the factory's Start use; the
// factory still sets its transform on it.
func boundedInformer[C any, L runtime.Object](m *member, kind Kind, namespace string, obj runtime.Object, client typedListWatch[L], transform cache.TransformFunc) func(C, time.Duration) cache.SharedIndexInformer {
	return func(C, time.Duration) cache.SharedIndexInformer {
		return cache.NewSharedIndexInformerWithOptions(boundedListWatch(m, kind, namespace, client, transform), obj, cache.SharedIndexInformerOptions{
			Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		})
	}
}

// boundedListWatch lists and watches the member's objects of kind through
// client, a client of namespace ("": of all namespaces), within its limits
// (listQuota).
func boundedListWatch[L runtime.Object](m *member, kind Kind, namespace string, client typedListWatch[L], transform cache.TransformFunc) *listQuota {
	return &listQuota{
		m:         m,
		kind:      kind,
		namespace: namespace,
		transform: transform,
		list: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			l, err := client.List(ctx, opts)
			if err != nil {
				return nil, err
			}
			return l, nil
		},
		watch: client.Watch,
	}
}

// listQuota is the ListerWatcher of a member's informer: it applies the
// member's objects and bytes limits while the member lists, page by page,
// rather than once client-go's reflector has gathered the whole list
// (which it does before the informer's handlers, and so the quota's
// accounting of each object, see the first one). A member that lists past
// its limits is frozen as soon as the page or the streamed object that
// passes them arrives; the list is not applied, and the informer keeps
// what it held before (nothing, at the member's first list). It is also
// where a list or watch that finds no server is made again in the call
// (noserver; reported by retrying), so that a watch that meets the
// member's server down resumes rather than relists: every informer of a
// member other than the local cluster, in full and summary mode, reads
// through one.
type listQuota struct {
	m    *member
	kind Kind
	// namespace is the one namespace the informer lists, "" when it lists
	// all: its list replaces what the member holds of kind there.
	namespace string
	transform cache.TransformFunc
	list      func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watch     func(context.Context, metav1.ListOptions) (watch.Interface, error)
	// unavailable, if set, is told of every list page or watch that
	// found no server behind the member's API, once per call (retrying):
	// the call is made again until the server answers, so the reflector's
	// watch error handler does not hear of it.
	unavailable func(context.Context, error)
}

// ListWithContext lists in pages of listPageSize with client-go's pager,
// counting the objects and their bytes across pages. The reflector asks
// for resourceVersion 0 on its first list, which a kube-apiserver answers
// from its watch cache whole, whatever the limit: it is asked for the
// latest ("") instead, which it pages. An expired continuation fails the
// list (the reflector lists again) rather than falling back to one
// unpaged list of everything.
func (l *listQuota) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	if opts.ResourceVersion == "0" {
		opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	}
	if opts.Limit <= 0 || opts.Limit > listPageSize {
		opts.Limit = listPageSize
	}
	var count listCount
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		page, err := noserver.Retry(ctx, func() (runtime.Object, error) { return l.list(ctx, opts) }, l.retrying(ctx, "list"))
		if err != nil {
			return nil, err
		}
		if err := meta.EachListItem(page, func(obj runtime.Object) error { return count.add(l, obj) }); err != nil {
			return nil, err
		}
		return page, nil
	})
	p.PageSize = listPageSize
	p.FullListIfExpired = false
	list, _, err := p.ListWithAlloc(ctx, opts)
	return list, err
}

// WatchWithContext bounds the initial events of a streaming list (a watch
// with sendInitialEvents, client-go's watch-list) as ListWithContext
// bounds a list's pages: the reflector gathers them all before it applies
// them. Other watches pass as they are: their changes are accounted one by
// one as the informer delivers them (quota.go).
func (l *listQuota) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := noserver.Retry(ctx, func() (watch.Interface, error) { return l.watch(ctx, opts) }, l.retrying(ctx, "watch"))
	if err != nil {
		return nil, err
	}
	if opts.SendInitialEvents == nil || !*opts.SendInitialEvents {
		return w, nil
	}
	return newInitialEventsBound(w, l), nil
}

// retrying reports the calls of one List page or Watch that find no
// server (noserver): the first once, to unavailable where it is set
// (summary mode counts it and logs once per change) else in client-go's
// error log as a failed list or watch would be; the others at the
// verbosity of the reflector's own retries. Most often it is the member's
// own mci-apiserver that its aggregator proxies the summaries to, during a
// rolling restart ("service unavailable", "error trying to reach service:
// ... connection refused"): what this server has read is still good, and
// the call resumes from the same resourceVersion once it is back.
func (l *listQuota) retrying(ctx context.Context, verb string) func(error, time.Duration) {
	first := true
	return func(err error, pause time.Duration) {
		if !first {
			klog.FromContext(ctx).V(3).Info("No server answers the member yet; trying again", "member", l.m.name, "kind", l.kind, "verb", verb, "in", pause.Round(time.Millisecond), "err", err)
			return
		}
		first = false
		if l.unavailable != nil {
			l.unavailable(ctx, err)
			return
		}
		utilruntime.HandleErrorWithContext(ctx, err, "No server answers the member; trying again from the same resourceVersion", "member", l.m.name, "kind", l.kind, "verb", verb)
	}
}

// List and Watch complete cache.ListerWatcher; the reflector calls the
// WithContext methods.
func (l *listQuota) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l *listQuota) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// listCount is what one list (or the initial events of one streaming list)
// has brought so far, or what the member holds of a kind.
type listCount struct {
	objects int
	bytes   int64
}

func (c listCount) plus(objects int, bytes int64) listCount {
	return listCount{objects: c.objects + objects, bytes: c.bytes + bytes}
}

// add counts obj, and freezes the member when what it would hold with the
// list passes a limit (quota.listing); it then returns the error that
// stops the list.
func (c *listCount) add(l *listQuota, obj runtime.Object) error {
	c.objects++
	c.bytes += l.size(obj)
	reason, msg := l.m.quota.listing(l.kind, l.namespace, *c)
	if reason == "" {
		return nil
	}
	l.m.freeze(reason, msg)
	return fmt.Errorf("listing the %ss of member %s: %s", l.kind, l.m.name, msg)
}

// size is the size obj will take in the member's cache, as the quota
// counts it once delivered (objectSize of what the informer's transform
// keeps). A summary is measured as trimSummary trims it, on a copy: that
// transform takes the summary's resourceVersion, which the reflector
// still reads. A cluster summary's namespaces are counted by their own
// limit when it is delivered, not as bytes.
func (l *listQuota) size(obj runtime.Object) int64 {
	switch o := obj.(type) {
	case *v1alpha1.InferencePoolExportSummary:
		c := *o
		c.ManagedFields, c.Annotations, c.UID = nil, nil, ""
		c.ResourceVersion = memberComponent(c.ResourceVersion)
		return max(objectSize(&c), 1)
	case *v1alpha1.InferenceClusterSummary:
		return 0
	}
	if l.transform != nil {
		// The transforms of full mode make a trimmed copy, or trim in
		// place what they would trim again at the cache.
		if out, err := l.transform(obj); err == nil {
			return max(objectSize(out), 1)
		}
	}
	return max(objectSize(obj), 1)
}

// initialEventsBound passes on the events of a streaming list, counting its
// initial ADDED events until the bookmark that ends them
// (metav1.InitialEventsAnnotationKey); past the member's limits it
// freezes the member and ends the watch. It is a watch of its own rather
// than watch.Filter, whose loop would stay blocked on an event the
// reflector no longer reads once it stopped.
type initialEventsBound struct {
	inner  watch.Interface
	result chan watch.Event
	done   chan struct{}
	once   sync.Once
}

func newInitialEventsBound(inner watch.Interface, l *listQuota) *initialEventsBound {
	w := &initialEventsBound{inner: inner, result: make(chan watch.Event), done: make(chan struct{})}
	go w.run(l)
	return w
}

func (w *initialEventsBound) ResultChan() <-chan watch.Event { return w.result }

func (w *initialEventsBound) Stop() {
	w.once.Do(func() {
		close(w.done)
		w.inner.Stop()
	})
}

func (w *initialEventsBound) run(l *listQuota) {
	defer close(w.result)
	var count listCount
	initial := true
	for ev := range w.inner.ResultChan() {
		switch {
		case !initial:
		case ev.Type == watch.Added:
			if err := count.add(l, ev.Object); err != nil {
				w.Stop()
				return
			}
		case ev.Type == watch.Bookmark:
			if o, err := meta.Accessor(ev.Object); err == nil && o.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				initial = false
			}
		}
		select {
		case w.result <- ev:
		case <-w.done:
			return
		}
	}
}
