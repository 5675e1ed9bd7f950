package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/versionvector"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/membermock"
	"github.com/mci-dev/mci/test/waitfor"
)

// The member mock (test/membermock) stands for real members in the fleet
// measurements; it must serve what a real member serves. The same
// changes are made to a real member of the local ClusterSet (cluster-a,
// read as its other members' servers read it: through its aggregator,
// with the summary reader's identity) and to a mock member of the same
// name; a summary-mode reader must be sent the same LIST and the same
// WATCH events (watch-list, as informers watch) by both, and resume both
// from a resourceVersion of the middle of the sequence to the same tail.
// resourceVersions differ in value; on each side their member component
// must grow with each event.
func TestMemberMockServesWhatARealMemberServes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, ns2 = "e2e-membermock", "e2e-membermock-2"
	real := mockSide(t, ctx, "real", clusterClients(t, "cluster-a"), memberReaderConfig(t, "cluster-a"), ns, ns2)
	fleet := startMockFleet(t, ctx)
	mock := fleet.Member("cluster-a")
	namespaces, err := real.admin.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for i := range namespaces.Items {
		if namespaces.Items[i].DeletionTimestamp == nil {
			require.NoError(t, mock.Apply(&namespaces.Items[i]))
		}
	}
	mockConfig, err := fleet.RESTConfig("cluster-a")
	require.NoError(t, err)
	fake := mockSide(t, ctx, "mock", nil, mockConfig, ns, ns2)
	fake.apply = func(t *testing.T, obj runtime.Object) { require.NoError(t, mock.Apply(obj)) }
	fake.remove = func(t *testing.T, obj runtime.Object) { require.NoError(t, mock.Delete(obj)) }
	sides := []*memberSide{real, fake}
	each := func(f func(s *memberSide)) {
		for _, s := range sides {
			f(s)
		}
	}
	type want map[string]metav1.ConditionStatus
	wait := func(step string, pools want, listing string) {
		each(func(s *memberSide) {
			waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
				got, err := s.readyByPool(ctx)
				if err != nil {
					return false, err.Error()
				}
				ok := fmt.Sprint(got) == fmt.Sprint(pools) && (listing == "" || s.clusters.listing() == listing)
				return ok, fmt.Sprintf("%s after %q: %v listing %s, want %v listing %s", s.name, step, got, s.clusters.listing(), pools, listing)
			})
		})
	}

	// Before the watches start, the namespace gets its pools, unexported,
	// with their EPPs. A real member's server starts watching the
	// namespace's Services, EndpointSlices and Pods at its first pool and
	// computes nothing of it until they have all listed, so an export made
	// while they fill is published Ready at once, as the mock publishes it.
	each(func(s *memberSide) {
		s.apply(t, membermock.Namespace(ns))
		for pool, address := range map[string]string{"llm": "127.0.0.5", "llm-2": "127.0.0.6"} {
			s.apply(t, membermock.ExportedPool(ns, pool, false))
			s.apply(t, membermock.EPPService(ns, pool, address))
			s.apply(t, membermock.EPPEndpoints(ns, pool, true))
		}
	})
	for _, s := range sides {
		s.startWatches(t, ctx)
	}

	steps := []struct {
		name    string
		change  func(s *memberSide)
		want    want
		listing string
	}{
		{name: "a ready pool is exported", change: func(s *memberSide) { s.apply(t, membermock.ExportedPool(ns, "llm-2", true)) },
			want: want{"llm-2": metav1.ConditionTrue}},
		{name: "a second one", change: func(s *memberSide) { s.apply(t, membermock.ExportedPool(ns, "llm", true)) },
			want: want{"llm": metav1.ConditionTrue, "llm-2": metav1.ConditionTrue}},
		{name: "its EPP becomes unready", change: func(s *memberSide) { s.apply(t, membermock.EPPEndpoints(ns, "llm", false)) },
			want: want{"llm": metav1.ConditionFalse, "llm-2": metav1.ConditionTrue}},
		{name: "and ready again", change: func(s *memberSide) { s.apply(t, membermock.EPPEndpoints(ns, "llm", true)) },
			want: want{"llm": metav1.ConditionTrue, "llm-2": metav1.ConditionTrue}},
		{name: "its export is withdrawn", change: func(s *memberSide) { s.apply(t, membermock.ExportedPool(ns, "llm", false)) },
			want: want{"llm-2": metav1.ConditionTrue}},
		{name: "and made again", change: func(s *memberSide) { s.apply(t, membermock.ExportedPool(ns, "llm", true)) },
			want: want{"llm": metav1.ConditionTrue, "llm-2": metav1.ConditionTrue}},
		{name: "the pool is deleted", change: func(s *memberSide) { s.remove(t, membermock.ExportedPool(ns, "llm", true)) },
			want: want{"llm-2": metav1.ConditionTrue}},
		{name: "another namespace is created", change: func(s *memberSide) { s.apply(t, membermock.Namespace(ns2)) },
			want: want{"llm-2": metav1.ConditionTrue}, listing: "[true true]"},
	}
	for _, step := range steps {
		each(step.change)
		listing := step.listing
		if listing == "" {
			listing = "[true false]"
		}
		wait(step.name, step.want, listing)
	}

	t.Run("LIST", func(t *testing.T) {
		lists := make([]string, len(sides))
		for i, s := range sides {
			l, err := s.reader.InferenceV1alpha1().InferencePoolExportSummaries(ns).List(ctx, metav1.ListOptions{})
			require.NoError(t, err)
			var items []string
			for j := range l.Items {
				items = append(items, normalSummary(&l.Items[j]))
			}
			lists[i] = strings.Join(items, "\n")
		}
		require.Equal(t, lists[0], lists[1])
	})

	t.Run("WATCH", func(t *testing.T) {
		// The last step's event has reached both (the LISTs agree): give
		// any event after it a moment to show itself.
		time.Sleep(500 * time.Millisecond)
		require.Equal(t, real.exports.events(), fake.exports.events())
		require.Equal(t, real.clusters.events(), fake.clusters.events())
		for _, s := range sides {
			require.True(t, s.exports.initialEnd(), "%s: the initial-events-end bookmark", s.name)
			s.exports.requireVersionsGrow(t, s.name)
		}
	})

	t.Run("a watch resumes from the middle of the sequence to the same tail", func(t *testing.T) {
		tails := make([][]string, len(sides))
		for i, s := range sides {
			all := s.exports.events()
			const from = 2 // after "its EPP becomes unready"
			require.Greater(t, len(all), from)
			w, err := s.reader.InferenceV1alpha1().InferencePoolExportSummaries(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: s.exports.versionAt(from), AllowWatchBookmarks: true})
			require.NoError(t, err)
			resumed := &summaryRecorder{}
			go resumed.record(w)
			waitfor.Eventually(t, ctx, 10*time.Second, func(context.Context) (bool, string) {
				return len(resumed.events()) >= len(all)-from-1, fmt.Sprintf("%s resumed: %v", s.name, resumed.events())
			})
			// Taken before the watch stops: a stopped stream may end
			// with an error event.
			tails[i] = resumed.events()[:len(all)-from-1]
			w.Stop()
			require.Equal(t, all[from+1:], tails[i], s.name)
		}
		require.Equal(t, tails[0], tails[1])
	})
}

// memberSide is one member, real or mock, as the test changes it and as a
// summary reader reads it.
type memberSide struct {
	name   string
	admin  *cluster
	reader mciclient.Interface
	ns     string
	apply  func(t *testing.T, obj runtime.Object)
	remove func(t *testing.T, obj runtime.Object)

	exports, clusters *summaryRecorder
}

func mockSide(t *testing.T, ctx context.Context, name string, admin *cluster, readerConfig *rest.Config, ns, ns2 string) *memberSide {
	s := &memberSide{name: name, admin: admin, reader: mciclient.NewForConfigOrDie(readerConfig), ns: ns, exports: &summaryRecorder{}, clusters: &summaryRecorder{namespaces: []string{ns, ns2}}}
	if admin != nil {
		s.apply = func(t *testing.T, obj runtime.Object) { applyToRealMember(t, ctx, admin, obj) }
		s.remove = func(t *testing.T, obj runtime.Object) {
			p := obj.(*poolv1.InferencePool)
			require.NoError(t, admin.mci.InferencePoolV1().InferencePools(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}))
		}
	}
	return s
}

// startWatches watches the summaries as an informer does: a watch-list
// (sendInitialEvents) with bookmarks.
func (s *memberSide) startWatches(t *testing.T, ctx context.Context) {
	opts := metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true}
	w, err := s.reader.InferenceV1alpha1().InferencePoolExportSummaries(s.ns).Watch(ctx, opts)
	require.NoError(t, err, s.name)
	t.Cleanup(w.Stop)
	go s.exports.record(w)
	cw, err := s.reader.InferenceV1alpha1().InferenceClusterSummaries().Watch(ctx, opts)
	require.NoError(t, err, s.name)
	t.Cleanup(cw.Stop)
	go s.clusters.record(cw)
}

func (s *memberSide) readyByPool(ctx context.Context) (map[string]metav1.ConditionStatus, error) {
	l, err := s.reader.InferenceV1alpha1().InferencePoolExportSummaries(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]metav1.ConditionStatus{}
	for _, item := range l.Items {
		out[item.Name] = metav1.ConditionUnknown
		for _, c := range item.Status.Conditions {
			if c.Type == v1alpha1.ConditionReady {
				out[item.Name] = c.Status
			}
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// summaryRecorder keeps a watch's events as comparable strings: the type
// and the object without what differs by nature between two clusters
// (resourceVersions, creation and transition times). A cluster summary
// is kept as which of the test's namespaces it lists, once per change of
// that: the real member's namespaces of other tests come and go.
type summaryRecorder struct {
	namespaces []string

	mu       sync.Mutex
	list     []string
	versions []string
	ended    bool
	listed   string
}

func (r *summaryRecorder) record(w watch.Interface) {
	for ev := range w.ResultChan() {
		r.mu.Lock()
		switch o := ev.Object.(type) {
		case *v1alpha1.InferencePoolExportSummary:
			if ev.Type == watch.Bookmark {
				r.ended = r.ended || o.Annotations[metav1.InitialEventsAnnotationKey] == "true"
				break
			}
			r.list = append(r.list, string(ev.Type)+" "+normalSummary(o))
			r.versions = append(r.versions, o.ResourceVersion)
		case *v1alpha1.InferenceClusterSummary:
			if ev.Type == watch.Bookmark {
				break
			}
			has := make([]bool, len(r.namespaces))
			for i, ns := range r.namespaces {
				has[i] = ev.Type != watch.Deleted && containsString(o.Status.Namespaces, ns)
			}
			if listed := fmt.Sprint(has); listed != r.listed {
				r.list = append(r.list, fmt.Sprintf("%s %s lists %v: %s", ev.Type, o.Name, r.namespaces, listed))
				r.listed = listed
			}
		default:
			r.list = append(r.list, fmt.Sprintf("%s %T", ev.Type, ev.Object))
		}
		r.mu.Unlock()
	}
}

func (r *summaryRecorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.list...)
}

func (r *summaryRecorder) versionAt(i int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.versions[i]
}

func (r *summaryRecorder) initialEnd() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// listing says which of the test's namespaces the cluster summary lists
// now.
func (r *summaryRecorder) listing() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.listed
}

// requireVersionsGrow checks that the member component of each event's
// resourceVersion (what a summary-mode reader orders them by) grows.
func (r *summaryRecorder) requireVersionsGrow(t *testing.T, side string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var last uint64
	for i, rv := range r.versions {
		v, err := versionvector.Decode(rv)
		require.NoError(t, err, "%s: event %d", side, i)
		var member uint64
		for k, c := range v {
			if !strings.HasPrefix(k, "~") {
				member = c
			}
		}
		require.Greater(t, member, last, "%s: event %d (%s) after %d", side, i, rv, last)
		last = member
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func normalSummary(s *v1alpha1.InferencePoolExportSummary) string {
	s = s.DeepCopy()
	s.ResourceVersion, s.CreationTimestamp, s.ManagedFields = "", metav1.Time{}, nil
	for i := range s.Status.Conditions {
		s.Status.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	data, _ := json.Marshal(s)
	return string(data)
}

// memberReaderConfig is the configuration the other members' servers read
// member name with (members/<name>.kubeconfig).
func memberReaderConfig(t *testing.T, name string) *rest.Config {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(clusters.MembersDir(), name+".kubeconfig"))
	require.NoError(t, err)
	return cfg
}

// startMockFleet runs a member mock with one member, cluster-a, of the
// local ClusterSet's name, read with the shared reader identity as the
// real one is.
func startMockFleet(t *testing.T, ctx context.Context) *membermock.Fleet {
	f, err := membermock.NewFleet(membermock.Options{ClusterSetName: localclusterset.ClusterSetName})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitfor.Eventually(t, ctx, 10*time.Second, func(context.Context) (bool, string) {
		_, err := f.Join("cluster-a")
		return err == nil, fmt.Sprint(err)
	})
	return f
}

// applyToRealMember creates or updates obj in the real member, as its
// owner and its controllers would (a Service's LoadBalancer status as a
// cloud controller writes it).
func applyToRealMember(t *testing.T, ctx context.Context, c *cluster, obj runtime.Object) {
	t.Helper()
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		c.createNamespace(t, ctx, o.Name)
	case *corev1.Service:
		var svc *corev1.Service
		svc, err = c.kube.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if err == nil {
			svc.Status = o.Status
			_, err = c.kube.CoreV1().Services(o.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
		}
	case *discoveryv1.EndpointSlice:
		err = createOrReplace(ctx, c.kube.DiscoveryV1().EndpointSlices(o.Namespace), o)
	case *poolv1.InferencePool:
		err = createOrReplace(ctx, c.mci.InferencePoolV1().InferencePools(o.Namespace), o)
	default:
		t.Fatalf("no rule to apply a %T", obj)
	}
	require.NoError(t, err)
}

// objectAPI is a typed client of objects of type T in one namespace.
type objectAPI[T metav1.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// createOrReplace creates o, or replaces the object of its name with it,
// retrying on a conflict: the member's controllers write the objects'
// status between a read and an update (its export status controller a
// pool's).
func createOrReplace[T metav1.Object](ctx context.Context, api objectAPI[T], o T) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		existing, err := api.Get(ctx, o.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = api.Create(ctx, o, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		o.SetResourceVersion(existing.GetResourceVersion())
		_, err = api.Update(ctx, o, metav1.UpdateOptions{})
		return err
	})
}
