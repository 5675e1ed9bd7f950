package virtual

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
)

// listed names the objects of a list with their cluster counts, e.g. "ns/a:1".
func listed(objs []Object) []string {
	out := []string{}
	for _, o := range objs {
		imp := o.(*inference.InferencePoolImport)
		out = append(out, imp.Namespace+"/"+imp.Name+":"+string(rune('0'+len(imp.Status.Clusters))))
	}
	return out
}

// waitForVersion waits until the store's version has member's component n.
func waitForVersion(t *testing.T, s *Store, member string, n uint64) string {
	t.Helper()
	var rv string
	require.Eventually(t, func() bool {
		_, rv, _ = s.ListWithOptions(context.Background(), ListOptions{})
		v, err := ParseVersion(rv)
		return err == nil && v[member] >= n
	}, 5*time.Second, 5*time.Millisecond)
	return rv
}

func TestListHonoursResourceVersionMatch(t *testing.T) {
	blockTimeout = 200 * time.Millisecond
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "a", nil, "cluster-a")
	r.set("other", "z", nil, "cluster-a")
	s := startStore(t, r)
	_, rv0, _ := s.ListWithOptions(context.Background(), ListOptions{})

	r.set("ns", "b", nil, "cluster-a")
	notifyPool(s, "cluster-a", "ns", "b", 5)
	rv1 := waitForVersion(t, s, "cluster-a", 5)
	r.set("ns", "a", nil, "cluster-a", "cluster-c")
	notifyPool(s, "cluster-a", "ns", "a", 6)
	rv2 := waitForVersion(t, s, "cluster-a", 6)
	r.remove("ns", "b")
	notifyPool(s, "cluster-a", "ns", "b", 7)
	rv3 := waitForVersion(t, s, "cluster-a", 7)

	foreignEpoch, err := ParseVersion(rv1)
	require.NoError(t, err)
	foreignEpoch[epochComponent]++
	future, err := ParseVersion(rv3)
	require.NoError(t, err)
	future["cluster-a"] = 100

	tests := []struct {
		name      string
		namespace string
		rv        string
		match     metav1.ResourceVersionMatch
		limit     int64
		want      []string
		wantRV    string
		wantErr   func(error) bool
	}{
		{name: "no resourceVersion serves the most recent state", rv: "", want: []string{"ns/a:2", "other/z:1"}, wantRV: rv3},
		{name: "resourceVersion 0 serves any state, the current one", rv: "0", want: []string{"ns/a:2", "other/z:1"}, wantRV: rv3},
		{name: "NotOlderThan 0 serves any state", rv: "0", match: metav1.ResourceVersionMatchNotOlderThan, want: []string{"ns/a:2", "other/z:1"}, wantRV: rv3},
		{name: "NotOlderThan an older version serves the current state", rv: rv1, match: metav1.ResourceVersionMatchNotOlderThan, want: []string{"ns/a:2", "other/z:1"}, wantRV: rv3},
		{name: "a version without match or limit means NotOlderThan", rv: rv1, want: []string{"ns/a:2", "other/z:1"}, wantRV: rv3},
		{name: "NotOlderThan accepts another replica's version the Store covers", rv: foreignEpoch.String(), match: metav1.ResourceVersionMatchNotOlderThan, want: []string{"ns/a:2", "other/z:1"}, wantRV: rv3},
		{name: "Exact at the first version undoes every later change", rv: rv0, match: metav1.ResourceVersionMatchExact, want: []string{"ns/a:1", "other/z:1"}, wantRV: rv0},
		{name: "Exact rebuilds an added object", rv: rv1, match: metav1.ResourceVersionMatchExact, want: []string{"ns/a:1", "ns/b:1", "other/z:1"}, wantRV: rv1},
		{name: "Exact rebuilds a modified and a deleted object", rv: rv2, match: metav1.ResourceVersionMatchExact, want: []string{"ns/a:2", "ns/b:1", "other/z:1"}, wantRV: rv2},
		{name: "Exact in one namespace", namespace: "ns", rv: rv1, match: metav1.ResourceVersionMatchExact, want: []string{"ns/a:1", "ns/b:1"}, wantRV: rv1},
		{name: "Exact at the current version is the current state", rv: rv3, match: metav1.ResourceVersionMatchExact, want: []string{"ns/a:2", "other/z:1"}, wantRV: rv3},
		{name: "a version with a limit and no match means Exact", rv: rv1, limit: 500, want: []string{"ns/a:1", "ns/b:1", "other/z:1"}, wantRV: rv1},
		{name: "Exact refuses another replica's version with 410", rv: foreignEpoch.String(), match: metav1.ResourceVersionMatchExact, wantErr: apierrors.IsResourceExpired},
		{name: "NotOlderThan a version the Store never reaches is 504 too large", rv: future.String(), match: metav1.ResourceVersionMatchNotOlderThan, wantErr: isTooLarge},
		{name: "Exact at a version the Store never reaches is 504 too large", rv: future.String(), match: metav1.ResourceVersionMatchExact, wantErr: isTooLarge},
		{name: "a resourceVersion this server did not issue is 400", rv: "12345", match: metav1.ResourceVersionMatchNotOlderThan, wantErr: apierrors.IsBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			items, rv, err := s.ListWithOptions(context.Background(), ListOptions{
				Namespace: tc.namespace, ResourceVersion: tc.rv, ResourceVersionMatch: tc.match, Limit: tc.limit,
			})
			if tc.wantErr != nil {
				require.Error(t, err)
				assert.True(t, tc.wantErr(err), "unexpected error %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, listed(items.items))
			assert.Empty(t, items.next, "everything fits in one page")
			assert.Equal(t, tc.wantRV, rv)
		})
	}
}

func isTooLarge(err error) bool {
	return apierrors.IsTimeout(err) && apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}

func TestListNotOlderThanWaitsForTheStoreToCatchUp(t *testing.T) {
	blockTimeout = 5 * time.Second
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStore(t, r)
	_, rv, _ := s.ListWithOptions(context.Background(), ListOptions{})
	v, err := ParseVersion(rv)
	require.NoError(t, err)
	v["cluster-b"] = 9 // another replica has already seen cluster-b's change 9

	go func() {
		// The change arrives after the list has begun waiting for it: the
		// delay is the scenario, not a wait.
		time.Sleep(100 * time.Millisecond)
		r.set("ns", "a", nil, "cluster-b")
		notifyPool(s, "cluster-b", "ns", "a", 9)
	}()
	items, got, err := s.ListWithOptions(context.Background(), ListOptions{ResourceVersion: v.String(), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	require.NoError(t, err)
	assert.Equal(t, []string{"ns/a:1"}, listed(items.items), "the list waited for the change the version includes")
	gotV, err := ParseVersion(got)
	require.NoError(t, err)
	assert.True(t, gotV.Covers(v))
}

func TestListExactOlderThanTheHistoryIsGone(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	s := startStore(t, r)
	_, old, _ := s.ListWithOptions(context.Background(), ListOptions{})
	r.set("ns", "a", nil, "cluster-a")
	notifyPool(s, "cluster-a", "ns", "a", 3)
	current := waitForVersion(t, s, "cluster-a", 3)
	// As if the history had been trimmed past old.
	s.mu.Lock()
	s.historyStart, _ = ParseVersion(current)
	s.history = nil
	s.mu.Unlock()

	_, _, err := s.ListWithOptions(context.Background(), ListOptions{ResourceVersion: old, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	assert.True(t, apierrors.IsResourceExpired(err), "%v", err)
	items, _, err := s.ListWithOptions(context.Background(), ListOptions{ResourceVersion: current, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	require.NoError(t, err)
	assert.Equal(t, []string{"ns/a:1"}, listed(items.items))
}

// TestListInPagesIsOneSnapshot lists with a limit while the objects change
// between pages: the pages together are the state of the first page's
// version, and a token that left the history is 410 Gone.
func TestListInPagesIsOneSnapshot(t *testing.T) {
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		r.set("ns", name, nil, "cluster-a")
	}
	r.set("other", "z", nil, "cluster-a")
	s := startStore(t, r)
	notifyPool(s, "cluster-a", "ns", "a", 3)
	waitForVersion(t, s, "cluster-a", 3)

	first, rv, err := s.ListWithOptions(context.Background(), ListOptions{Limit: 2})
	require.NoError(t, err)
	assert.Equal(t, []string{"ns/a:1", "ns/b:1"}, listed(first.items))
	require.NotEmpty(t, first.next)
	assert.Equal(t, int64(4), first.remaining)

	// Changes after the first page: c gains a cluster, d goes, f comes.
	r.set("ns", "c", nil, "cluster-a", "cluster-c")
	r.remove("ns", "d")
	r.set("ns", "f", nil, "cluster-a")
	notifyPool(s, "cluster-a", "ns", "c", 4)
	waitForVersion(t, s, "cluster-a", 4)

	var all []string
	all = append(all, listed(first.items)...)
	next := first.next
	for next != "" {
		pg, pageRV, err := s.ListWithOptions(context.Background(), ListOptions{Limit: 2, Continue: next})
		require.NoError(t, err)
		assert.Equal(t, rv, pageRV, "every page is at the first page's version")
		all = append(all, listed(pg.items)...)
		next = pg.next
	}
	assert.Equal(t, []string{"ns/a:1", "ns/b:1", "ns/c:1", "ns/d:1", "ns/e:1", "other/z:1"}, all)

	everything, _, err := s.ListWithOptions(context.Background(), ListOptions{ResourceVersion: "0", Limit: 2})
	require.NoError(t, err)
	assert.Len(t, everything.items, 6, "resourceVersion 0 ignores the limit, as the watch cache does")
	assert.Empty(t, everything.next)

	_, _, err = s.ListWithOptions(context.Background(), ListOptions{Limit: 2, Continue: "not a token"})
	assert.True(t, apierrors.IsBadRequest(err), "%v", err)

	// As if the history had been trimmed past the first page's version.
	s.mu.Lock()
	s.historyStart, _ = ParseVersion(s.version.String())
	s.history = nil
	s.mu.Unlock()
	_, _, err = s.ListWithOptions(context.Background(), ListOptions{Limit: 2, Continue: first.next})
	assert.True(t, apierrors.IsResourceExpired(err), "%v", err)
}
