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

// A route's filter on the exporters' tags: the clusters a backend keeps,
// and why none is left.
func TestClusterTags(t *testing.T) {
	tests := []struct {
		name        string
		annotations []string // of the route
		// wantClusters are the import backend's clusters; wantLocal
		// whether its local pool stays.
		wantClusters    []string
		wantLocal       bool
		wantUnavailable []string
		wantReasons     []string
	}{
		{name: "without a restriction every cluster stays", wantClusters: []string{"cluster-a", "cluster-b", "cluster-c"}, wantLocal: true},
		{name: "a tag keeps the clusters that state it with that value, and the local cluster states none", annotations: []string{ClusterTagsAnnotation, "slo=gold"},
			wantClusters: []string{"cluster-a", "cluster-b"}},
		{name: "every listed tag must be stated", annotations: []string{ClusterTagsAnnotation, " slo = gold , tier=premium"},
			wantClusters: []string{"cluster-a"}},
		{name: "it composes with the regions: both must hold", annotations: []string{ClusterTagsAnnotation, "slo=gold", ClusterRegionsAnnotation, "us-east-1"},
			wantClusters: []string{"cluster-b"}},
		{name: "a value no cluster states leaves none, and the 503 lists who is out", annotations: []string{ClusterTagsAnnotation, "slo=platinum"},
			wantUnavailable: []string{"no cluster states the tags slo=platinum", "left out: cluster-a, cluster-b, cluster-c, cluster-z"},
			wantReasons:     []string{ReasonNoClustersWithTags}},
		{name: "a pair without a value cannot be read and allows no cluster", annotations: []string{ClusterTagsAnnotation, "slo"},
			wantUnavailable: []string{"cannot be read", `"slo" is not key=value`}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a key that is no label key allows no cluster", annotations: []string{ClusterTagsAnnotation, "s lo=gold"},
			wantUnavailable: []string{"is not a label key"}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a key listed twice allows no cluster", annotations: []string{ClusterTagsAnnotation, "slo=gold,slo=silver"},
			wantUnavailable: []string{"listed twice"}, wantReasons: []string{ReasonInvalidAnnotation}},
		{name: "a restriction that lists nothing allows no cluster", annotations: []string{ClusterTagsAnnotation, " , "},
			wantUnavailable: []string{"lists no tag"}, wantReasons: []string{ReasonInvalidAnnotation}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imp := importOf("llm-pool",
				imported{name: "cluster-a", addr: "127.0.2.1"},
				imported{name: "cluster-b", addr: "127.0.2.2"},
				imported{name: "cluster-c", addr: "127.0.2.3"})
			imp.Status.Clusters[0].ExportSettings = &v1alpha1.ExportSettings{Weight: 1, Region: "eu-west-1", Tags: map[string]string{"slo": "gold", "tier": "premium"}}
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
			})
			assert.Equal(t, tt.wantReasons, reasons(errs), "%v", errs)
			rl, _ := tbl.Match(&RequestAttrs{Path: "/"})
			require.NotNil(t, rl)
			be := rl.PickBackend()
			require.NotNil(t, be)
			var got []string
			for _, c := range be.Clusters {
				got = append(got, c.Name)
			}
			assert.Equal(t, tt.wantClusters, got)
			assert.Equal(t, tt.wantLocal, be.Local != nil, "local pool")
			if tt.annotations == nil {
				assert.Nil(t, be.Tags)
				return
			}
			require.NotNil(t, be.Tags)
			for _, s := range tt.wantUnavailable {
				assert.Contains(t, be.Tags.Unavailable(), s)
			}
		})
	}
}
