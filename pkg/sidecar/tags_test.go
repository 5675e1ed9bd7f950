package sidecar

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// A route restricted to the clusters stating a tag never reaches another,
// not through its policy, not through FailOpen; with none left the answer
// is the sidecar's own 503 saying why.
func TestServerTagRestrictedRoutes(t *testing.T) {
	tests := []struct {
		name string
		// tags is the route's ClusterTagsAnnotation; failOpen its failure
		// mode; breakGold makes the gold cluster's EPP fail.
		tags      string
		failOpen  bool
		breakGold bool
		// wantDestination is where the request goes; "" for the 503.
		wantDestination string
		wantDetails     string
		wantOutcome     string
	}{
		{name: "the cluster stating the tag takes every request, whatever the weights say", tags: "slo=gold", wantDestination: "10.1.0.1:8000", wantOutcome: OutcomeRouted},
		{name: "a tag no cluster states gets the sidecar's 503 saying why", tags: "slo=platinum",
			wantDetails: "no cluster states the tags slo=platinum", wantOutcome: OutcomeOutsideTags},
		{name: "FailOpen does not let a request leave the tagged clusters when theirs fails", tags: "slo=gold", failOpen: true, breakGold: true,
			wantDetails: "tag filter (mci.x-k8s.io/cluster-tags) lets the request go nowhere else", wantOutcome: OutcomeUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gold := startFakeEPP(t, "epp-gold", "10.1.0.1:8000")
			other := startFakeEPP(t, "epp-other", "10.3.0.1:8000")
			imp := twoClusterImport(t, gold, other)
			imp.Status.Clusters[0].ExportSettings = &v1alpha1.ExportSettings{Weight: 1, Tags: map[string]string{"slo": "gold"}}
			// The other cluster weighs 1000 times more: only the filter
			// keeps requests from it.
			imp.Status.Clusters[1].ExportSettings = &v1alpha1.ExportSettings{Weight: 1000, Tags: map[string]string{"slo": "silver"}}
			annotations := []string{routetable.ClusterTagsAnnotation, tt.tags, routetable.PolicyAnnotation, "Weighted"}
			if tt.failOpen {
				annotations = append(annotations, routetable.FailureModeAnnotation, "FailOpen")
			}
			h := startServer(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), annotations...)},
				Imports: []*v1alpha1.InferencePoolImport{imp},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing, "cluster-c": HealthServing}})
			if tt.breakGold {
				gold.mode.Store(eppFail)
			}
			for range 20 {
				res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})
				if tt.wantDestination != "" {
					require.Nil(t, res.Immediate, "%+v", res.Immediate)
					assert.Equal(t, tt.wantDestination, res.Destination)
					continue
				}
				require.NotNil(t, res.Immediate)
				assert.Equal(t, http.StatusServiceUnavailable, res.Immediate.StatusCode)
				assert.Contains(t, res.Immediate.Details, tt.wantDetails)
			}
			assert.EqualValues(t, 0, other.calls.Load(), "the cluster without the tag was never asked")
			cluster, code := "", "503"
			if tt.wantDestination != "" {
				cluster, code = "cluster-a", "200"
			}
			assert.Equal(t, 20.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues(cluster, tt.wantOutcome, code)))
		})
	}
}
