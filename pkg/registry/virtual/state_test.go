package virtual

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/imports"
)

// conditionedResource is a tableResource whose objects carry a condition
// that the computation writes without a time, as imports' do, and whose
// times are carried as imports' are: each run of the server stamps its
// own.
type conditionedResource struct{ *tableResource }

func withReady(o Object) Object {
	imp := o.(*inference.InferencePoolImport)
	imp.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready"}}
	return imp
}

func (r conditionedResource) Compute(cs imports.ClusterSet, ns, name string) (Object, bool) {
	o, ok := r.tableResource.Compute(cs, ns, name)
	if !ok {
		return nil, false
	}
	return withReady(o), true
}

func (r conditionedResource) ComputeNamespace(cs imports.ClusterSet, ns string) []Object {
	objs := r.tableResource.ComputeNamespace(cs, ns)
	for _, o := range objs {
		withReady(o)
	}
	return objs
}

func (conditionedResource) CarryTransitionTimes(prev, next Object, now metav1.Time) {
	p, _ := prev.(*inference.InferencePoolImport)
	imports.CarryTransitionTimes(p, next.(*inference.InferencePoolImport), now)
}

// runOf starts a Store of r, as one run of the server, whose clock is
// offset from the test's: its member cluster-a lists at rv, and then the
// ClusterSet is complete (its baseline).
func runOf(t *testing.T, r Resource, offset time.Duration, rv uint64) *Store {
	t.Helper()
	cluster := &syncingSnapshot{}
	s := NewStore(r, cluster, func() Object { return &inference.InferencePoolImport{} })
	s.now = func() time.Time { return time.Now().Add(offset) }
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Run(ctx)
	require.Eventually(t, s.Ready, 5*time.Second, 5*time.Millisecond)
	notifyPool(s, "cluster-a", "ns", "a", rv)
	require.Eventually(t, func() bool {
		_, v, _ := s.ListWithOptions(context.Background(), ListOptions{})
		c, _ := ParseVersion(v)
		return c["cluster-a"] == rv
	}, 5*time.Second, 5*time.Millisecond)
	cluster.mu.Lock()
	cluster.ready = true
	cluster.mu.Unlock()
	s.takeBaseline()
	require.Equal(t, rv, s.baseline["cluster-a"])
	return s
}

// After a restart the member's resourceVersion has moved with writes that
// change nothing served (leases, events), so the new run's baseline is
// past every version the old run issued: the member components cannot
// place them, and the clients relisted. The state a version names places
// it: a client of the old run resumes on the new one, without a relist,
// when the new run computed the same objects, whatever times it stamps on
// their conditions; and is refused when what it holds differs.
func TestARestartedStoreResumesTheVersionsOfTheStateItComputedAgain(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	r.set("ns", "b", nil, "cluster-a")
	resource := conditionedResource{r}
	old := runOf(t, resource, 0, 5)
	_, seen, err := old.ListWithOptions(context.Background(), ListOptions{})
	require.NoError(t, err)

	restarted := runOf(t, resource, time.Hour, 9)
	a, _, _ := restarted.Get("ns", "a")
	was, _, _ := old.Get("ns", "a")
	require.NotEqual(t, was.(*inference.InferencePoolImport).Status.Conditions[0].LastTransitionTime,
		a.(*inference.InferencePoolImport).Status.Conditions[0].LastTransitionTime, "each run stamps its own times")

	w, err := restarted.Watch(context.Background(), WatchOptions{ResourceVersion: seen})
	require.NoError(t, err, "the state the old run's version names is the restarted one's")
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		t.Fatalf("nothing changed, yet the resumed watch got %s", ev.Type)
	case <-time.After(100 * time.Millisecond):
	}
	r.set("ns", "b", nil, "cluster-a", "cluster-b")
	notifyPool(restarted, "cluster-b", "ns", "b", 3)
	ev := next(t, w)
	assert.Equal(t, watch.Modified, ev.Type)
	assert.Equal(t, "b", nameOf(ev), "a change after the restart reaches the resumed watch")

	_, err = restarted.Watch(context.Background(), WatchOptions{ResourceVersion: seen})
	require.NoError(t, err, "a state the history holds, not only the current one, places a version")

	// Changed while the server was down: the state differs.
	r.remove("ns", "a")
	changed := runOf(t, resource, 2*time.Hour, 12)
	_, err = changed.Watch(context.Background(), WatchOptions{ResourceVersion: seen})
	assert.True(t, apierrors.IsResourceExpired(err), "a state the new run never held: %v", err)
}

// A version within a recomputation carries the recomputation's state, of
// which the client has only some changes: its state places nothing.
func TestAVersionWithinARecomputationIsNotPlacedByItsState(t *testing.T) {
	v := Version{"cluster-a": 5, stateHighComponent: 1, stateLowComponent: 2}
	_, ok := stateOf(v)
	assert.True(t, ok)
	v[passComponent] = 1
	_, ok = stateOf(v)
	assert.False(t, ok)
	delete(v, passComponent)
	delete(v, stateLowComponent)
	_, ok = stateOf(v)
	assert.False(t, ok, "half a state")
}
