package routetable

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// The exporters' settings and a route's locality filter: the clusters a
// backend keeps, the weight each carries, and why none is left.
func TestClusterRegionsAndExportWeights(t *testing.T) {
	tests := []struct {
		name        string
		annotations []string // of the route
		localRegion string
		// wantClusters are the import backend's clusters with their weights;
		// wantLocal whether its local pool stays (LocalFirst).
		wantClusters map[string]int64
		wantLocal    bool
		// wantUnavailable lists substrings of the 503's message when no
		// cluster is left; wantReasons the reports.
		wantUnavailable []string
		wantReasons     []string
	}{
		{name: "without a restriction every cluster stays, weighted by what its exporter states",
			wantClusters: map[string]int64{"cluster-a": 3, "cluster-b": 1, "cluster-c": 1}, wantLocal: true},
		{name: "the route's weights multiply the exporters'", annotations: []string{ClusterWeightsAnnotation, "cluster-a=2,cluster-b=5"},
			wantClusters: map[string]int64{"cluster-a": 6, "cluster-b": 5, "cluster-c": 1}, wantLocal: true},
		{name: "a region keeps its clusters only, and a local cluster of no region is out", annotations: []string{ClusterRegionsAnnotation, "eu-west-1"},
			wantClusters: map[string]int64{"cluster-a": 3}},
		{name: "the local pool stays when the sidecar's region is allowed", annotations: []string{ClusterRegionsAnnotation, "eu-west-1"}, localRegion: "eu-west-1",
			wantClusters: map[string]int64{"cluster-a": 3}, wantLocal: true},
		{name: "several regions add up", annotations: []string{ClusterRegionsAnnotation, " us-east-1 , eu-west-1"},
			wantClusters: map[string]int64{"cluster-a": 3, "cluster-b": 1}},
		{name: "a region no cluster is in leaves none, and the 503 lists who is outside", annotations: []string{ClusterRegionsAnnotation, "ap-south-1"}, localRegion: "us-east-1",
			wantUnavailable: []string{"no cluster in region(s) ap-south-1", "cluster-a (eu-west-1)", "cluster-c (no region)", "cluster-z (us-east-1)"},
			wantReasons:     []string{ReasonNoClustersInRegions}},
		{name: "a restriction that cannot be read allows no cluster rather than every one", annotations: []string{ClusterRegionsAnnotation, "EU West"}, localRegion: "eu-west-1",
			wantUnavailable: []string{"cannot be read", `"EU West"`}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a restriction that lists nothing allows no cluster", annotations: []string{ClusterRegionsAnnotation, " , "},
			wantUnavailable: []string{"lists no region"}, wantReasons: []string{ReasonInvalidAnnotation}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imp := importOf("llm-pool",
				imported{name: "cluster-a", addr: "127.0.2.1"},
				imported{name: "cluster-b", addr: "127.0.2.2"},
				imported{name: "cluster-c", addr: "127.0.2.3"})
			imp.Status.Clusters[0].ExportSettings = &v1alpha1.ExportSettings{Weight: 3, Region: "eu-west-1"}
			imp.Status.Clusters[1].ExportSettings = &v1alpha1.ExportSettings{Weight: 1, Region: "us-east-1"}
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
			got := map[string]int64{}
			for _, c := range be.Clusters {
				got[c.Name] = c.Weight
			}
			if tt.wantClusters == nil {
				assert.Empty(t, got)
			} else {
				assert.Equal(t, tt.wantClusters, got)
			}
			assert.Equal(t, tt.wantLocal, be.Local != nil, "local pool")
			if tt.annotations == nil || tt.annotations[0] != ClusterRegionsAnnotation {
				assert.Nil(t, be.Regions)
				return
			}
			require.NotNil(t, be.Regions)
			for _, s := range tt.wantUnavailable {
				assert.Contains(t, be.Regions.Unavailable(), s)
			}
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
		w, _ := exportSettings(v1alpha1.ImportedCluster{ExportSettings: &v1alpha1.ExportSettings{Weight: tc.weight}})
		assert.Equal(t, tc.want, w, "weight %d", tc.weight)
	}
}
