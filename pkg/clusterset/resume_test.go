package clusterset

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/inlineinformer"
)

// aggregatorUnavailable is the error client-go makes of what a
// kube-apiserver's aggregator answers a watch of an aggregated API whose
// server is down: a 503 with a plain-text body.
func aggregatorUnavailable() error {
	return apierrors.NewGenericServerResponse(http.StatusServiceUnavailable, "GET",
		schema.GroupResource{Group: v1alpha1.SchemeGroupVersion.Group, Resource: "inferenceclustersummaries"}, "",
		"error trying to reach service: dial tcp 127.0.0.1:1: connect: connection refused", 0, true)
}

// scriptedSummaries serves one cluster summary as a streaming list, ends
// that first watch after one change, then answers each later watch with
// the next of its errors, and then with a watch that stays open. It
// records every request.
type scriptedSummaries struct {
	errs []error

	mu      sync.Mutex
	lists   int
	watches []metav1.ListOptions
}

func (s *scriptedSummaries) List(context.Context, metav1.ListOptions) (*v1alpha1.InferenceClusterSummaryList, error) {
	s.mu.Lock()
	s.lists++
	s.mu.Unlock()
	return &v1alpha1.InferenceClusterSummaryList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: []v1alpha1.InferenceClusterSummary{*clusterSummaryAt("10")}}, nil
}

func (s *scriptedSummaries) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	s.mu.Lock()
	n := len(s.watches)
	s.watches = append(s.watches, opts)
	s.mu.Unlock()
	w := watch.NewFakeWithChanSize(4, false)
	switch {
	case n == 0:
		// The streaming list, one change, then the stream ends, as a
		// watch does when the server behind it stops.
		bookmark := &v1alpha1.InferenceClusterSummary{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "10", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
		w.Add(clusterSummaryAt("10"))
		w.Action(watch.Bookmark, bookmark)
		w.Modify(clusterSummaryAt("11"))
		go func() {
			time.Sleep(1100 * time.Millisecond) // not a "very short watch"
			w.Stop()
		}()
	case n-1 < len(s.errs):
		return nil, s.errs[n-1]
	}
	return w, nil
}

func (s *scriptedSummaries) requests() (lists int, watches []metav1.ListOptions) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists, append([]metav1.ListOptions(nil), s.watches...)
}

func clusterSummaryAt(rv string) *v1alpha1.InferenceClusterSummary {
	return &v1alpha1.InferenceClusterSummary{ObjectMeta: metav1.ObjectMeta{Name: "member", ResourceVersion: rv}}
}

// TestAWatchThatMeetsTheMembersServerDownResumes drives client-go's
// Reflector (through the in-line informer summary mode uses) over a
// member's ListerWatcher whose watch, once its stream ended, cannot start
// again at once: a 503 from the member's aggregator is retried inside the
// call from the same resourceVersion, with nothing listed again and the
// Reflector none the wiser, and reported once; a 410 Gone still lists
// again.
func TestAWatchThatMeetsTheMembersServerDownResumes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		errs        []error
		relist      bool
		unavailable int
	}{
		{name: "503 twice: resumed from the same resourceVersion", errs: []error{aggregatorUnavailable(), aggregatorUnavailable()}, unavailable: 1},
		{name: "410 Gone: listed again", errs: []error{apierrors.NewResourceExpired("too old resource version: 11 (12)")}, relist: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			m, err := newMember("member", "test", &rest.Config{Host: "https://127.0.0.1:1"}, 1<<20, func(Event) {})
			require.NoError(t, err)
			m.quota = newQuota(Limits{Objects: 100, Bytes: 1 << 20, Namespaces: 100, ResponseBytes: 1 << 20, FreezeRetry: time.Hour})
			summaries := &scriptedSummaries{errs: tc.errs}
			lw := boundedListWatch(m, KindNamespace, "", summaries, trimSummary)
			var reported atomic.Int32
			lw.unavailable = func(context.Context, error) { reported.Add(1) }
			var relisted atomic.Int32
			inf := inlineinformer.New(lw, &v1alpha1.InferenceClusterSummary{}, inlineinformer.Options{
				Handler:           cache.ResourceEventHandlerFuncs{},
				WatchErrorHandler: func(context.Context, *cache.Reflector, error) { relisted.Add(1) },
			})
			go inf.Run(ctx)

			// The first watch, the errors, then the watch that stays open.
			want := len(tc.errs) + 2
			require.Eventually(t, func() bool {
				_, watches := summaries.requests()
				return len(watches) >= want
			}, 30*time.Second, 10*time.Millisecond, "the watch is started again after each error")
			lists, watches := summaries.requests()
			var streamingLists int
			for i, w := range watches[1:want] {
				if w.SendInitialEvents != nil && *w.SendInitialEvents {
					streamingLists++
					continue
				}
				assert.Equal(t, "11", w.ResourceVersion, "watch %d resumes from the last resourceVersion", i+1)
			}
			if tc.relist {
				assert.Equal(t, 1, lists+streamingLists, "listed again once")
				assert.EqualValues(t, 1, relisted.Load(), "the watch error handler is told")
				return
			}
			assert.Zero(t, lists+streamingLists, "nothing listed again")
			assert.Zero(t, relisted.Load(), "ListAndWatch did not end")
			assert.EqualValues(t, tc.unavailable, reported.Load(), "the call that met the 503s is reported once")
		})
	}
}

// TestOnlyAWatchThatFindsNoServerIsMadeAgain: a watch that meets a 503
// is made again, from the same resourceVersion, until the server answers;
// any other error is returned as it is, after one call.
func TestOnlyAWatchThatFindsNoServerIsMadeAgain(t *testing.T) {
	m, err := newMember("member", "test", &rest.Config{Host: "https://127.0.0.1:1"}, 1<<20, func(Event) {})
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		err     error
		resumed bool
	}{
		{name: "the aggregator's 503", err: aggregatorUnavailable(), resumed: true},
		{name: "a Status 503 ServiceUnavailable", err: apierrors.NewServiceUnavailable("service unavailable"), resumed: true},
		{name: "410 Gone", err: apierrors.NewResourceExpired("too old")},
		{name: "403 Forbidden", err: apierrors.NewForbidden(schema.GroupResource{Resource: "inferenceclustersummaries"}, "", nil)},
		{name: "500", err: apierrors.NewInternalError(assert.AnError)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lw := boundedListWatch(m, KindNamespace, "", &scriptedSummaries{}, trimSummary)
			var asked []string
			lw.watch = func(_ context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				asked = append(asked, opts.ResourceVersion)
				if len(asked) == 1 {
					return nil, tc.err
				}
				return watch.NewFake(), nil
			}
			w, got := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "11"})
			if tc.resumed {
				require.NoError(t, got)
				w.Stop()
				assert.Equal(t, []string{"11", "11"}, asked, "made again from the same resourceVersion")
				return
			}
			assert.Equal(t, tc.err, got)
			assert.Len(t, asked, 1)
		})
	}
}
