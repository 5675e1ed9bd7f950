// Package informerhealth tells whether each informer of a process
// currently lists and watches its resource.
//
// client-go's reflector retries a failed list or watch forever and keeps
// the informer's cache as it was meanwhile; by default only its own log
// says so, at every retry. A Tracker follows each informer it builds
// instead: the reflector's watch error handler and every failed List or
// Watch call mark the resource failing (but a streaming list the server
// refuses, which the reflector follows with a List), a List that answers
// or a Watch that opens marks it reachable again. Each change is logged once (a new
// error while failing at most once a minute) and shown by two metrics:
// <prefix>_watch_reachable{resource} (1/0, absent until the first list or
// watch answered or failed) and <prefix>_watch_failures_total{resource}
// (times the resource went from reachable, or not known yet, to failing).
//
// A List or Watch that finds no server is tried again inside the call
// (package noserver): what is built from these caches (a routing table)
// needs them current within a second of the server's return.
package informerhealth

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/noserver"
)

// Tracker follows whether the informers it builds list and watch their
// resources. Safe for concurrent use.
type Tracker struct {
	reachable *prometheus.GaugeVec
	failures  *prometheus.CounterVec
	now       func() time.Time

	mu     sync.Mutex
	states map[string]*state
}

// NewTracker returns a tracker whose metrics are named
// <prefix>_watch_reachable and <prefix>_watch_failures_total. The tracker is
// their prometheus.Collector: register it where the process's other
// metrics are.
func NewTracker(prefix string) *Tracker {
	return &Tracker{
		reachable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_watch_reachable",
			Help: "Whether the informer of a resource lists and watches it now: 1 its last list answered or its watch opened, 0 its last list or watch failed (its cache, and what is built from it, stays as last read until it recovers); absent until the first list answered or failed.",
		}, []string{"resource"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_watch_failures_total",
			Help: "Times the informer of a resource lost its list and watch (went from reachable, or not known yet, to failing); see the log line of each.",
		}, []string{"resource"}),
		now:    time.Now,
		states: map[string]*state{},
	}
}

// Describe and Collect make the tracker the prometheus.Collector of its
// metrics.
func (t *Tracker) Describe(ch chan<- *prometheus.Desc) {
	t.reachable.Describe(ch)
	t.failures.Describe(ch)
}

func (t *Tracker) Collect(ch chan<- prometheus.Metric) {
	t.reachable.Collect(ch)
	t.failures.Collect(ch)
}

// NewInformer returns a shared informer of resource (a name for the logs
// and metrics, such as "services" or "httproutes.gateway.networking.k8s.io")
// listed and watched with lw, which t follows. It has the namespace index,
// as the generated informers do.
func (t *Tracker) NewInformer(resource string, lw cache.ListerWatcher, example runtime.Object) cache.SharedIndexInformer {
	t.failures.WithLabelValues(resource) // exported at 0 from the start
	inf := cache.NewSharedIndexInformerWithOptions(&trackedListWatch{inner: cache.ToListerWatcherWithContext(lw), outer: lw, tracker: t, resource: resource},
		example, cache.SharedIndexInformerOptions{Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
	// The handler replaces client-go's default, which logs every retry. It
	// sees what ListAndWatch returns: the list errors that the wrapped
	// List saw too, and those that came after the server answered
	// (decoding, a watch-list stream that broke).
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		t.observe(ctx, resource, err)
	}); err != nil {
		// Only an informer that started refuses a handler, and this one
		// was just made.
		panic(err)
	}
	return inf
}

// ListWatch is the ListerWatcher of one resource of a typed clientset, with
// its List and Watch (clientset.CoreV1().Services("").List and .Watch, for
// example). clientset says whether the client streams lists (watch-list;
// fake clientsets do not), as for the generated informers.
func ListWatch[L runtime.Object](clientset any, list func(context.Context, metav1.ListOptions) (L, error), watchFunc func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			l, err := list(ctx, opts)
			if err != nil {
				return nil, err
			}
			return l, nil
		},
		WatchFuncWithContext: watchFunc,
	}, clientset)
}

// observe records the outcome of a List or Watch call (err nil: it
// answered), or an error the reflector's ListAndWatch returned.
func (t *Tracker) observe(ctx context.Context, resource string, err error) {
	if ctx.Err() != nil || isServerAnswer(err) {
		// Stopping, or the server answered in a way the reflector follows
		// at once with a new list: neither says anything of reachability.
		return
	}
	logger := klog.FromContext(ctx)
	now := t.now()
	t.mu.Lock()
	s := t.states[resource]
	if s == nil {
		s = &state{}
		t.states[resource] = s
	}
	var ch change
	var failedFor time.Duration
	if err == nil {
		ch, failedFor = s.succeeded(now)
	} else {
		ch = s.failed(now, rootCause(err))
	}
	t.mu.Unlock()

	switch ch {
	case firstReachable:
		t.reachable.WithLabelValues(resource).Set(1)
	case recovered:
		t.reachable.WithLabelValues(resource).Set(1)
		logger.Info("Listing and watching a resource again; its cache is current again", "resource", resource, "failedFor", failedFor.Round(time.Millisecond))
	case lost:
		t.reachable.WithLabelValues(resource).Set(0)
		t.failures.WithLabelValues(resource).Inc()
		logger.Error(err, "Cannot list or watch a resource; its cache keeps what was last read, and client-go retries with backoff", "resource", resource)
	case newError:
		logger.Error(err, "Still cannot list or watch a resource, now for another reason", "resource", resource)
	}
}

// isServerAnswer tells the errors that client-go's DefaultWatchErrorHandler
// does not report either: a watch that ended (io.EOF) and a resource
// version the server no longer has (410 Expired or Gone), after which the
// reflector lists again at once. Nil is no error at all.
func isServerAnswer(err error) bool {
	return err != nil && (errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err))
}

// rootCause is the text of the innermost error that err wraps: the same
// failure reads the same whether a List, a Watch or the reflector (which
// adds "failed to list ...: ") reports it, and whatever request URL the
// client error names.
func rootCause(err error) string {
	for {
		inner := errors.Unwrap(err)
		if inner == nil {
			return err.Error()
		}
		err = inner
	}
}

// trackedListWatch tells its tracker the outcome of every List and Watch:
// a List that answered or a Watch that opened means the server is
// reachable again, a failed one that it is not. The latter matters where
// the reflector retries a failed Watch itself without calling the watch
// error handler (connection refused, 429, a watch-list stream).
type trackedListWatch struct {
	inner    cache.ListerWatcherWithContext
	outer    cache.ListerWatcher
	tracker  *Tracker
	resource string
}

func (l *trackedListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return untilServerAnswers(ctx, l.resource, func() (runtime.Object, error) {
		obj, err := l.inner.ListWithContext(ctx, opts)
		l.tracker.observe(ctx, l.resource, err)
		return obj, err
	})
}

func (l *trackedListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return untilServerAnswers(ctx, l.resource, func() (watch.Interface, error) {
		w, err := l.inner.WatchWithContext(ctx, opts)
		if err != nil && !noserver.Is(err) && opts.SendInitialEvents != nil && *opts.SendInitialEvents && refusedStreamingList(err) {
			// The reflector lists instead of a streaming list that the
			// server refused (one that does not stream lists, say): that
			// List's outcome tells.
			return w, err
		}
		l.tracker.observe(ctx, l.resource, err)
		return w, err
	})
}

// untilServerAnswers makes call, a List or Watch of resource, until a
// server answers it (noserver.Retry). Each retry is logged at the
// verbosity of the reflector's own "Listing and watching" line.
func untilServerAnswers[T any](ctx context.Context, resource string, call func() (T, error)) (T, error) {
	return noserver.Retry(ctx, call, func(err error, pause time.Duration) {
		klog.FromContext(ctx).V(3).Info("No server answers the list or watch of a resource yet; trying again", "resource", resource, "in", pause.Round(time.Millisecond), "err", err)
	})
}

// refusedStreamingList tells the answers to a streaming list (watch-list)
// after which the reflector falls back to a List: an API error that it does
// not retry as a streaming list itself (client-go's reflector retries 429
// and connection refused, and relists at once after Expired).
func refusedStreamingList(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) && !apierrors.IsTooManyRequests(err)
}

// List and Watch complete cache.ListerWatcher; the reflector calls the
// WithContext methods.
func (l *trackedListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l *trackedListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// IsWatchListSemanticsUnSupported passes on what the wrapped ListerWatcher
// says, which the reflector asks to choose between watch-list and list.
func (l *trackedListWatch) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(l.outer)
}

// Start runs informers until ctx ends or the returned stop is called; stop
// also waits until every one of them has returned, so that a caller that
// defers it leaves no informer running behind it.
func Start(ctx context.Context, informers ...cache.SharedIndexInformer) (stop func()) {
	var running wait.Group
	ctx, cancel := context.WithCancel(ctx)
	for _, inf := range informers {
		running.StartWithContext(ctx, inf.RunWithContext)
	}
	return func() {
		cancel()
		running.Wait()
	}
}
