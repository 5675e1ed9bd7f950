package informerhealth

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// logLines keeps a logger's lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() klog.Logger {
	return funcr.New(func(_, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

func (l *logLines) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// refused is a dial error as net/http returns it for a closed port, wrapped
// as client-go's rest client does.
func refused(path string) error {
	return &url.Error{Op: "Get", URL: "https://127.0.0.1:6443" + path, Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
}

func TestTrackerLogsAndCountsChanges(t *testing.T) {
	unavailable := apierrors.NewServiceUnavailable("service unavailable")
	tests := []struct {
		name          string
		errs          []error // nil: a List that answered
		wantReachable float64 // -1: absent
		wantFailures  float64
		wantLogs      []string // a part of each line, in order
	}{
		{
			name:          "a first list that answers is not logged",
			errs:          []error{nil},
			wantReachable: 1,
		},
		{
			name:          "the same failure from the List, the reflector and the Watch, at every retry, is one loss",
			errs:          []error{nil, unavailable, fmt.Errorf("failed to list *v1.Service: %w", unavailable), unavailable, unavailable},
			wantReachable: 0, wantFailures: 1,
			wantLogs: []string{`"msg"="Cannot list or watch a resource; its cache keeps what was last read, and client-go retries with backoff" "error"="service unavailable" "resource"="services"`},
		},
		{
			name:          "connection refused on different URLs is the same failure",
			errs:          []error{refused("/api/v1/services?limit=500"), refused("/api/v1/services?watch=true"), nil},
			wantReachable: 1, wantFailures: 1,
			wantLogs: []string{`connect: connection refused`, `"msg"="Listing and watching a resource again; its cache is current again" "resource"="services" "failedFor"=`},
		},
		{
			name:          "a watch that ended or whose resource version expired is no failure",
			errs:          []error{nil, io.EOF, apierrors.NewResourceExpired("too old resource version"), apierrors.NewGone("gone")},
			wantReachable: 1,
		},
		{
			name:          "two losses count twice",
			errs:          []error{unavailable, nil, unavailable, nil},
			wantReachable: 1, wantFailures: 2,
			wantLogs: []string{"Cannot list", "again", "Cannot list", "again"},
		},
		{
			name:          "nothing observed yet: no gauge, a counter at 0",
			wantReachable: -1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker("test")
			var logs logLines
			ctx := klog.NewContext(context.Background(), logs.logger())
			for _, err := range tt.errs {
				tr.observe(ctx, "services", err)
			}
			if tt.wantReachable < 0 {
				assert.Equal(t, 0, testutil.CollectAndCount(tr.reachable))
			} else {
				assert.Equal(t, tt.wantReachable, testutil.ToFloat64(tr.reachable.WithLabelValues("services")))
			}
			assert.Equal(t, tt.wantFailures, testutil.ToFloat64(tr.failures.WithLabelValues("services")))
			got := logs.get()
			require.Len(t, got, len(tt.wantLogs), "log lines %q", got)
			for i, part := range tt.wantLogs {
				assert.Contains(t, got[i], part)
			}
		})
	}
}

func TestTrackerIgnoresOutcomesOfAStoppingInformer(t *testing.T) {
	tr := NewTracker("test")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tr.observe(ctx, "services", context.Canceled)
	assert.Equal(t, 0, testutil.CollectAndCount(tr.reachable))
}

// TestInformerReportsWatchRetriesTheReflectorKeepsToItself runs client-go's
// reflector on a ListerWatcher whose List answers and whose Watch fails
// with connection refused, which the reflector retries itself without
// calling the watch error handler: the tracker still sees the resource
// failing, once, and reachable again once a Watch opens.
func TestInformerReportsWatchRetriesTheReflectorKeepsToItself(t *testing.T) {
	server := &flakyServer{listsAnswer: true}
	server.down.Store(true)
	down, watches := &server.down, &server.watches
	tr := NewTracker("test")
	inf := tr.NewInformer("services", server.listWatch(), &corev1.Service{})
	var logs logLines
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logs.logger()))
	defer cancel()
	go inf.RunWithContext(ctx)

	gauge := func() float64 { return testutil.ToFloat64(tr.reachable.WithLabelValues("services")) }
	require.Eventually(t, func() bool { return watches.Load() >= 2 && gauge() == 0 }, 10*time.Second, 10*time.Millisecond, "the reflector retries the watch, the tracker says failing")
	down.Store(false)
	count := func(part string) (n int) {
		for _, l := range logs.get() {
			n += strings.Count(l, part)
		}
		return n
	}
	// The tracker sets the gauge, then logs the recovery: the line is
	// waited for, not read as soon as the gauge turns.
	require.Eventually(t, func() bool { return gauge() == 1 && count("Listing and watching a resource again") > 0 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(tr.failures.WithLabelValues("services")))
	failing, again := count("Cannot list or watch"), count("Listing and watching a resource again")
	assert.Equal(t, 1, failing, "one log line for the loss, whatever the retries (%d watches)", watches.Load())
	assert.Equal(t, 1, again)
}

// noWatchList is a ListerWatcher that says it streams no lists.
type noWatchList struct{ *cache.ListWatch }

// flakyServer answers Lists and Watches of Services while it is up, and
// refuses the connection of each Watch (and of each List unless
// listsAnswer) while down. Its ListerWatcher streams no lists (as a
// fake client's), so the reflector lists, then watches.
type flakyServer struct {
	down           atomic.Bool
	listsAnswer    bool
	lists, watches atomic.Int32
}

func (s *flakyServer) listWatch() cache.ListerWatcher {
	return noWatchList{&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			s.lists.Add(1)
			if s.down.Load() && !s.listsAnswer {
				return nil, refused("/api/v1/services?limit=500")
			}
			return &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			s.watches.Add(1)
			if s.down.Load() {
				return nil, refused("/api/v1/services?watch=true")
			}
			return watch.NewFake(), nil
		},
	}}
}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// TestInformerFallingBackFromStreamingListIsNoFailure runs client-go's
// reflector with watch-list (the default) on a ListerWatcher whose server
// refuses streaming lists (422, as a kube-apiserver without the feature
// answers sendInitialEvents): the reflector lists instead, which answers,
// so nothing failed.
func TestInformerFallingBackFromStreamingListIsNoFailure(t *testing.T) {
	var streamingLists, lists atomic.Int32
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			lists.Add(1)
			return &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
				streamingLists.Add(1)
				return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), "", nil)
			}
			return watch.NewFake(), nil
		},
	}
	tr := NewTracker("test")
	inf := tr.NewInformer("services", lw, &corev1.Service{})
	var logs logLines
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logs.logger()))
	defer cancel()
	go inf.RunWithContext(ctx)

	require.Eventually(t, inf.HasSynced, 10*time.Second, 10*time.Millisecond)
	require.Positive(t, streamingLists.Load(), "the reflector tried a streaming list first")
	require.Positive(t, lists.Load(), "then listed")
	assert.Equal(t, 1.0, testutil.ToFloat64(tr.reachable.WithLabelValues("services")))
	assert.Equal(t, 0.0, testutil.ToFloat64(tr.failures.WithLabelValues("services")))
	assert.Empty(t, logs.get())
}

// TestInformerReadsAServerThatComesBackWithinASecond runs client-go's
// reflector on a ListerWatcher whose server is away for 4 s (every List
// and Watch refused) and then answers. The calls that find no server are
// retried at most 1.5 s apart, where the reflector's own backoff would
// make at most 3 calls in 4 s and then wait 3 s or more: at least 4 Lists
// while it is away, and the cache synced within 2 s of its return.
func TestInformerReadsAServerThatComesBackWithinASecond(t *testing.T) {
	server := &flakyServer{}
	server.down.Store(true)
	away, lists := &server.down, &server.lists
	tr := NewTracker("test")
	inf := tr.NewInformer("services", server.listWatch(), &corev1.Service{})
	go inf.RunWithContext(t.Context())

	time.Sleep(4 * time.Second) // the server is away for this long; not a wait
	assert.GreaterOrEqual(t, lists.Load(), int32(4), "Lists while the server was away for 4s")
	assert.False(t, inf.HasSynced())
	away.Store(false)
	back := time.Now()
	require.Eventually(t, inf.HasSynced, 5*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(back), 2*time.Second, "the cache syncs within a reconnect pause of the server's return")
	assert.Equal(t, 1.0, testutil.ToFloat64(tr.failures.WithLabelValues("services")), "one loss, whatever the retries")
}
