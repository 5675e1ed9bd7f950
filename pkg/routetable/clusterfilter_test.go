package routetable

import (
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// The exporters' settings and a route's hard filter on clusters (its
// regions and tags): the clusters a backend keeps, the weight each
// carries, and why none is left.
func TestClusterFilterAndExportWeights(t *testing.T) {
	tests := []struct {
		name        string
		annotations []string // of the route
		localRegion string
		// wantClusters are the import backend's clusters with their
		// weights, "name=weight"; wantLocal whether its local pool stays
		// (LocalFirst).
		wantClusters []string
		wantLocal    bool
		// wantUnavailable lists substrings of the 503's message when no
		// cluster is left; wantReasons the reports.
		wantUnavailable []string
		wantReasons     []string
	}{
		{name: "without a restriction every cluster stays, weighted by what its exporter states",
			wantClusters: []string{"cluster-a=3", "cluster-b=1", "cluster-c=1"}, wantLocal: true},
		{name: "the route's weights multiply the exporters'", annotations: []string{ClusterWeightsAnnotation, "cluster-a=2,cluster-b=5"},
			wantClusters: []string{"cluster-a=6", "cluster-b=5", "cluster-c=1"}, wantLocal: true},

		// Regions.
		{name: "a region keeps its clusters only, and a local cluster of no region is out", annotations: []string{ClusterRegionsAnnotation, "eu-west-1"},
			wantClusters: []string{"cluster-a=3"}},
		{name: "the local pool stays when the sidecar's region is allowed", annotations: []string{ClusterRegionsAnnotation, "eu-west-1"}, localRegion: "eu-west-1",
			wantClusters: []string{"cluster-a=3"}, wantLocal: true},
		{name: "several regions add up", annotations: []string{ClusterRegionsAnnotation, " us-east-1 , eu-west-1"},
			wantClusters: []string{"cluster-a=3", "cluster-b=1"}},
		{name: "a region no cluster is in leaves none, and the 503 lists who is outside", annotations: []string{ClusterRegionsAnnotation, "ap-south-1"}, localRegion: "us-east-1",
			wantUnavailable: []string{"no cluster in region(s) ap-south-1 (annotation mci.x-k8s.io/cluster-regions) can take the request",
				"left out: cluster-a (eu-west-1), cluster-b (us-east-1), cluster-c (no region), cluster-z (us-east-1)"},
			wantReasons: []string{ReasonNoClustersInRegions}},
		{name: "a region restriction that cannot be read allows no cluster rather than every one", annotations: []string{ClusterRegionsAnnotation, "EU West"}, localRegion: "eu-west-1",
			wantUnavailable: []string{"cannot be read", `"EU West"`}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a region restriction that lists nothing allows no cluster", annotations: []string{ClusterRegionsAnnotation, " , "},
			wantUnavailable: []string{"lists no region"}, wantReasons: []string{ReasonInvalidAnnotation}},

		// Tags.
		{name: "a tag keeps the clusters that state it with that value, and the local cluster states none", annotations: []string{ClusterTagsAnnotation, "slo=gold"},
			wantClusters: []string{"cluster-a=3", "cluster-b=1"}},
		{name: "every listed tag must be stated", annotations: []string{ClusterTagsAnnotation, " slo = gold , tier=premium"},
			wantClusters: []string{"cluster-a=3"}},
		{name: "a value no cluster states leaves none, and the 503 lists who is out and what it states", annotations: []string{ClusterTagsAnnotation, "slo=platinum"},
			wantUnavailable: []string{"no cluster stating the tags slo=platinum (annotation mci.x-k8s.io/cluster-tags) can take the request",
				"left out: cluster-a (slo=gold), cluster-b (slo=gold), cluster-c (slo=silver), cluster-z (no tag slo)"},
			wantReasons: []string{ReasonNoClustersWithTags}},
		{name: "a pair without a value cannot be read and allows no cluster", annotations: []string{ClusterTagsAnnotation, "slo"},
			wantUnavailable: []string{"cannot be read", `"slo" is not key=value`}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a key that is no label key allows no cluster", annotations: []string{ClusterTagsAnnotation, "s lo=gold"},
			wantUnavailable: []string{"is not a label key"}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a key listed twice allows no cluster", annotations: []string{ClusterTagsAnnotation, "slo=gold,slo=silver"},
			wantUnavailable: []string{"listed twice"}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a tag restriction that lists nothing allows no cluster", annotations: []string{ClusterTagsAnnotation, " , "},
			wantUnavailable: []string{"lists no tag"}, wantReasons: []string{ReasonInvalidAnnotation}},

		// Both.
		{name: "regions and tags compose: both must hold", annotations: []string{ClusterTagsAnnotation, "slo=gold", ClusterRegionsAnnotation, "us-east-1"},
			wantClusters: []string{"cluster-b=1"}},
		{name: "regions no cluster is in are what leaves none, whatever the tags", annotations: []string{ClusterRegionsAnnotation, "ap-south-1", ClusterTagsAnnotation, "slo=gold"},
			wantUnavailable: []string{"no cluster in region(s) ap-south-1 (annotation mci.x-k8s.io/cluster-regions) and stating the tags slo=gold (annotation mci.x-k8s.io/cluster-tags) can take the request",
				"cluster-b (us-east-1), cluster-c (no region; slo=silver)"},
			wantReasons: []string{ReasonNoClustersInRegions}},
		{name: "tags that none of the region's clusters states are what leaves none", annotations: []string{ClusterRegionsAnnotation, "us-east-1", ClusterTagsAnnotation, "slo=silver"},
			wantUnavailable: []string{"left out: cluster-a (eu-west-1; slo=gold), cluster-b (slo=gold), cluster-c (no region), cluster-z (no region; no tag slo)"},
			wantReasons:     []string{ReasonNoClustersWithTags}},
		{name: "one restriction that cannot be read allows no cluster whatever the other allows", annotations: []string{ClusterRegionsAnnotation, "eu-west-1", ClusterTagsAnnotation, "slo"},
			localRegion: "eu-west-1", wantUnavailable: []string{`"slo" is not key=value`}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "two restrictions that cannot be read are both reported", annotations: []string{ClusterRegionsAnnotation, "EU West", ClusterTagsAnnotation, "slo"},
			wantUnavailable: []string{`"EU West"`, `"slo" is not key=value`}, wantReasons: []string{ReasonInvalidAnnotation, ReasonInvalidAnnotation}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imp := importOf("llm-pool",
				imported{name: "cluster-a", addr: "127.0.2.1"},
				imported{name: "cluster-b", addr: "127.0.2.2"},
				imported{name: "cluster-c", addr: "127.0.2.3"})
			imp.Status.Clusters[0].ExportSettings = &v1alpha1.ExportSettings{Weight: 3, Region: "eu-west-1", Tags: map[string]string{"slo": "gold", "tier": "premium"}}
			imp.Status.Clusters[1].ExportSettings = &v1alpha1.ExportSettings{Weight: 1, Region: "us-east-1", Tags: map[string]string{"slo": "gold"}}
			imp.Status.Clusters[2].ExportSettings = &v1alpha1.ExportSettings{Weight: 1, Tags: map[string]string{"slo": "silver", "tier": "premium"}}
			r := route("llm-route", 0, nil, rule(nil, importRef("llm-pool", nil)))
			if tt.annotations != nil {
				r = annotate(r, tt.annotations...)
			}
			tbl, errs := Build(Inputs{
				Routes:       []*gatewayv1.HTTPRoute{r},
				Pools:        []*poolv1.InferencePool{pool("llm-pool", poolv1.FailOpen)},
				Services:     []*corev1.Service{eppService("llm-pool", "127.0.1.1")},
				Imports:      []*v1alphaImport{imp},
				LocalCluster: "cluster-z",
				LocalRegion:  tt.localRegion,
			})
			assert.Equal(t, tt.wantReasons, reasons(errs), "%v", errs)
			rl, _ := tbl.Match(&RequestAttrs{Path: "/"})
			require.NotNil(t, rl)
			be := rl.PickBackend()
			require.NotNil(t, be)
			var got []string
			for _, c := range be.Clusters {
				got = append(got, c.Name+"="+strconv.FormatInt(c.Weight, 10))
				if be.ClusterFilter != nil {
					outside, _ := be.ClusterFilter.check(c)
					assert.Empty(t, outside, "%s is kept, so the filter allows it", c.Name)
				}
			}
			assert.Equal(t, tt.wantClusters, got)
			assert.Equal(t, tt.wantLocal, be.Local != nil, "local pool")
			if !slices.Contains(tt.annotations, ClusterRegionsAnnotation) && !slices.Contains(tt.annotations, ClusterTagsAnnotation) {
				assert.Nil(t, be.ClusterFilter)
				return
			}
			require.NotNil(t, be.ClusterFilter)
			for _, s := range tt.wantUnavailable {
				assert.Contains(t, be.ClusterFilter.Unavailable(), s)
			}
		})
	}
}

// A filter over a backend that has no cluster to begin with (its import's
// exporters are not Ready) reports, whichever restriction it states, as
// the sidecar counts the 503 under it; the import reports the cause.
func TestClusterFilterOfABackendWithoutClusters(t *testing.T) {
	for _, tc := range []struct {
		annotation, value, reason, unavailable string
	}{
		{ClusterRegionsAnnotation, "eu-west-1", ReasonNoClustersInRegions, "no cluster in region(s) eu-west-1"},
		{ClusterTagsAnnotation, "slo=gold", ReasonNoClustersWithTags, "no cluster stating the tags slo=gold"},
	} {
		t.Run(tc.annotation, func(t *testing.T) {
			r := annotate(route("r", 0, nil, rule(nil, importRef("llm", nil))), tc.annotation, tc.value)
			tbl, errs := Build(Inputs{
				Routes:  []*gatewayv1.HTTPRoute{r},
				Imports: []*v1alphaImport{importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1", ready: metav1.ConditionFalse})},
			})
			assert.ElementsMatch(t, []string{ReasonNoReadyClusters, tc.reason}, reasons(errs), "%v", errs)
			be := only(t, tbl)
			require.NotNil(t, be.ClusterFilter)
			assert.Empty(t, be.ClusterFilter.LeftOut)
			assert.Contains(t, be.ClusterFilter.Unavailable(), tc.unavailable)
		})
	}
}

// An import served by another implementation is held to mci-apiserver's
// bounds of a weight.
func TestExportWeightIsBounded(t *testing.T) {
	for _, tc := range []struct {
		weight int32
		want   int64
	}{{0, 1}, {-5, 1}, {7, 7}, {1 << 30, 1000}} {
		w, _, _ := exportSettings(v1alpha1.ImportedCluster{ExportSettings: &v1alpha1.ExportSettings{Weight: tc.weight}})
		assert.Equal(t, tc.want, w, "weight %d", tc.weight)
	}
}
