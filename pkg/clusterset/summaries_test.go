package clusterset

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/versionvector"
)

// A change of a member's cluster summary is one namespace event per
// namespace that came or went.
func TestNamespacesThatCameOrWent(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []string
		want          []string
	}{
		{name: "first summary", after: []string{"a", "b"}, want: []string{"a", "b"}},
		{name: "summary gone", before: []string{"a", "b"}, want: []string{"a", "b"}},
		{name: "one created", before: []string{"a", "c"}, after: []string{"a", "b", "c"}, want: []string{"b"}},
		{name: "one deleted, one created", before: []string{"a", "b"}, after: []string{"b", "c"}, want: []string{"a", "c"}},
		{name: "unchanged", before: []string{"a", "b"}, after: []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, symmetricDifference(tc.before, tc.after))
		})
	}
}

// A summary's version has one member component, the member's own
// resourceVersion: what full mode would have read on its objects.
func TestSummaryVersionIsTheMembersOwnResourceVersion(t *testing.T) {
	rv := versionvector.Encode(map[string]uint64{"cluster-a": 1234, "~epoch": 99, "~membership": 7})
	got, err := summaryVersion(rv)
	require.NoError(t, err)
	assert.Equal(t, uint64(1234), got)

	got, err = summaryVersion(versionvector.Encode(map[string]uint64{"~epoch": 99}))
	require.NoError(t, err, "a summary listed before the member's first event")
	assert.Zero(t, got)

	for _, bad := range []string{"12345", "v2;a=1,b=2", "v9;a"} {
		_, err := summaryVersion(bad)
		assert.Error(t, err, bad)
	}
}

// What a member publishes is not trusted to be sorted or free of
// duplicates: lookups search it.
func TestClusterSummariesAreSortedOnReceipt(t *testing.T) {
	s := &v1alpha1.InferenceClusterSummary{Status: v1alpha1.InferenceClusterSummaryStatus{Namespaces: []string{"c", "a", "b", "a"}}}
	s.Annotations = map[string]string{"big": "value"}
	out, err := trimSummary(s)
	require.NoError(t, err)
	got := out.(*v1alpha1.InferenceClusterSummary)
	assert.Equal(t, []string{"a", "b", "c"}, got.Status.Namespaces)
	assert.Nil(t, got.Annotations)
}

// A cached export summary keeps its member's resourceVersion, and no uid,
// encoded: what the lister gives back is what was trimmed.
func TestExportSummariesAreTrimmedOnReceipt(t *testing.T) {
	rv := versionvector.Encode(map[string]uint64{"cluster-a": 1234, "~epoch": 99, "~membership": 7})
	s := &v1alpha1.InferencePoolExportSummary{}
	s.Namespace, s.Name = "ns", "pool"
	s.ResourceVersion, s.UID = rv, "uid"
	s.Annotations = map[string]string{"big": "value"}
	s.Labels = map[string]string{"team": "a"}
	s.Status.RoutingMode = v1alpha1.RoutingModeEndpoint
	out, err := trimSummary(s)
	require.NoError(t, err)
	kept := out.(*compactSummary)
	n, err := summaryVersion(kept.GetObjectMeta().GetResourceVersion())
	require.NoError(t, err)
	assert.Equal(t, uint64(1234), n, "the events read the member's version in the clear")
	key, err := cache.MetaNamespaceKeyFunc(kept)
	require.NoError(t, err)
	assert.Equal(t, "ns/pool", key)

	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	require.NoError(t, idx.Add(kept))
	lister := summaryLister{indexer: idx, logger: klog.Background()}
	got, err := lister.InferencePoolExportSummaries("ns").Get("pool")
	require.NoError(t, err)
	assert.Empty(t, got.UID)
	assert.Nil(t, got.Annotations)
	assert.Equal(t, kept.resourceVersion, got.ResourceVersion)
	assert.Equal(t, v1alpha1.RoutingModeEndpoint, got.Status.RoutingMode)
	_, err = lister.InferencePoolExportSummaries("ns").Get("other")
	assert.True(t, apierrors.IsNotFound(err), "%v", err)
	all, err := lister.List(labels.SelectorFromSet(labels.Set{"team": "a"}))
	require.NoError(t, err)
	assert.Len(t, all, 1)
	none, err := lister.InferencePoolExportSummaries("ns").List(labels.SelectorFromSet(labels.Set{"team": "b"}))
	require.NoError(t, err)
	assert.Empty(t, none)

	s = &v1alpha1.InferencePoolExportSummary{}
	s.ResourceVersion = "garbage"
	out, err = trimSummary(s)
	require.NoError(t, err)
	assert.Equal(t, "garbage", out.(*compactSummary).resourceVersion, "kept whole, for summaryRV to report")
}

// A problem reading a member's summaries is counted (and logged) once,
// however often snapshots read them; another problem within a minute is a
// detail (statelog's rule), not counted again.
func TestUnreadableSummariesAreCountedOncePerChange(t *testing.T) {
	var s summaryStream
	for range 5 {
		s.unreadable("cluster-a", assert.AnError)
	}
	assert.Equal(t, uint64(1), s.errorCount())
	s.unreadable("cluster-a", errors.New("another problem"))
	assert.Equal(t, uint64(1), s.errorCount())
}

// An export summary keeps its exporter's cluster policy, which the import
// carries on, and its export scope, which placement applies, and no other
// annotation; an oversized policy is dropped, an oversized scope names no
// cluster (the export reaches fewer members, never more).
func TestExportSummariesKeepTheClusterPolicyAndScopeOnly(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   map[string]string
		want map[string]string
	}{
		{"the policy, without the rest", map[string]string{v1alpha1.ClusterPolicyAnnotation: "Weighted", "big": "value"}, map[string]string{v1alpha1.ClusterPolicyAnnotation: "Weighted"}},
		{"no policy, nothing", map[string]string{"big": "value"}, nil},
		{"an oversized policy, nothing", map[string]string{v1alpha1.ClusterPolicyAnnotation: strings.Repeat("q", maxSummaryPolicy+1)}, nil},
		{"the scope, without the rest", map[string]string{v1alpha1.ExportToAnnotation: `{"clusters":["b"]}`, "big": "value"}, map[string]string{v1alpha1.ExportToAnnotation: `{"clusters":["b"]}`}},
		{"an oversized scope names no cluster", map[string]string{v1alpha1.ExportToAnnotation: strings.Repeat(" ", maxSummaryScope+1)}, map[string]string{v1alpha1.ExportToAnnotation: "{}"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &v1alpha1.InferencePoolExportSummary{}
			s.Namespace, s.Name, s.ResourceVersion = "ns", "pool", "1"
			s.Annotations = tt.in
			out, err := trimSummary(s)
			require.NoError(t, err)
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			require.NoError(t, idx.Add(out))
			got, err := summaryLister{indexer: idx, logger: klog.Background()}.InferencePoolExportSummaries("ns").Get("pool")
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Annotations)
		})
	}
}
