package clusterset

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// podAccess follows whether the member's credentials may list the Pods of
// one namespace of its pools. Reading Pods is the one permission mci can
// do without: a member identity minted before exports published their
// pods' addresses (a member-reader role without pods) is served as it is,
// and its exports in that namespace publish no endpoint addresses, which
// importers read as "no destination of this EPP can be accepted". Were the
// 403 taken as the member refusing its credentials, or the informer left
// waiting to list, one missing rule would flag or hold back everything
// else the member serves.
type podAccess struct {
	mu sync.Mutex
	// since is when the 403 came; zero while the Pods can be listed.
	since time.Time
	// lastSynced is the informer's last synced resourceVersion when the
	// 403 came: a list that succeeds since moves it.
	lastSynced string
}

// deny records a 403; it reports whether it is a change.
func (a *podAccess) deny(lastSynced string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.since.IsZero() {
		return false
	}
	a.since, a.lastSynced = now, lastSynced
	return true
}

func (a *podAccess) allow() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.since, a.lastSynced = time.Time{}, ""
}

// denied returns since when the Pods may not be listed, zero if they may.
func (a *podAccess) denied() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.since
}

// followPodAccess makes the namespace's Pods informer report a 403 to
// changed, once, rather than retry the list behind a log line, and tells
// changed again once a list succeeds. Other errors are client-go's usual
// ones. It must be called before the informer starts; what it starts
// ends with the informer (the reflector's context).
func followPodAccess(namespace string, n *namespaceInformers, changed func(namespace string, since time.Time)) {
	_ = n.pods.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !apierrors.IsForbidden(err) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			return
		}
		at := n.pods.LastSyncResourceVersion()
		now := time.Now()
		if !n.access.deny(at, now) {
			return
		}
		changed(namespace, now)
		// The reflector lists again with its backoff; a list that
		// succeeds moves the last synced resourceVersion.
		go func() {
			if wait.PollUntilContextCancel(ctx, time.Second, false, func(context.Context) (bool, error) {
				return n.pods.LastSyncResourceVersion() != at, nil
			}) == nil {
				n.access.allow()
				changed(namespace, time.Time{})
			}
		}()
	})
}

// deniedPods is the namespace lister of a namespace whose Pods have never
// been listed because the member's credentials may not: it fails, so the
// pools there publish no addresses, with the reason.
type deniedPods struct{ err error }

var _ corev1listers.PodNamespaceLister = deniedPods{}

func (d deniedPods) List(labels.Selector) ([]*corev1.Pod, error) { return nil, d.err }
func (d deniedPods) Get(string) (*corev1.Pod, error)             { return nil, d.err }

func podsDeniedError(namespace string, since time.Time) error {
	return fmt.Errorf("this server's credentials for the member may not list the pods of namespace %s (403 Forbidden since %s): grant them list and watch on pods, as the chart's member-reader role does",
		namespace, since.UTC().Format(time.RFC3339))
}

// podsAccessChanged says, once per change, that the member's credentials
// may not (since non-zero) or may again list a namespace's Pods, and
// recomputes what its pools there publish (deliver: the namespace's events).
func (m *member) podsAccessChanged(namespace string, since time.Time, deliver Handler) {
	logger := klog.Background().WithValues("member", m.name, "namespace", namespace)
	if since.IsZero() {
		logger.Info("Member's pods can be listed again: its exports in the namespace publish their endpoint addresses")
	} else {
		logger.Info("Member's credentials may not list pods: its exports in the namespace publish no endpoint addresses (their last known ones if listed before), so importers accept no destination their EPPs name; grant list and watch on pods", "since", since.UTC().Format(time.RFC3339))
	}
	deliver(Event{Member: m.name, Kind: KindPod, Namespace: namespace})
}
