package sidecar

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// A route restricted by its cluster filter (regions, tags) never reaches a
// cluster outside it, not through its policy, not through FailOpen; with
// none left the answer is the sidecar's own 503 saying why, counted under
// the restriction that left none.
func TestServerClusterFilteredRoutes(t *testing.T) {
	const (
		regions = routetable.ClusterRegionsAnnotation
		tags    = routetable.ClusterTagsAnnotation
	)
	tests := []struct {
		name string
		// restrictions are the route's filter annotations; failOpen its
		// failure mode; breakInside makes the EPP of the cluster inside
		// (cluster-a: eu-west-1, slo=gold) fail.
		restrictions []string
		failOpen     bool
		breakInside  bool
		// wantDestination is where the request goes; "" for the 503.
		wantDestination string
		wantDetails     string
		wantOutcome     string
	}{
		{name: "the cluster of the allowed region takes every request, whatever the weights say", restrictions: []string{regions, "eu-west-1"},
			wantDestination: "10.1.0.1:8000", wantOutcome: OutcomeRouted},
		{name: "a region no cluster is in gets the sidecar's 503 saying why", restrictions: []string{regions, "ap-south-1"},
			wantDetails: "no cluster in region(s) ap-south-1", wantOutcome: OutcomeOutsideRegions},
		{name: "FailOpen does not let a request leave the region when its cluster fails", restrictions: []string{regions, "eu-west-1"}, failOpen: true, breakInside: true,
			wantDetails: "allows only the clusters in region(s) eu-west-1 (annotation mci.x-k8s.io/cluster-regions): the request goes nowhere else", wantOutcome: OutcomeUnavailable},
		{name: "the cluster stating the tag takes every request, whatever the weights say", restrictions: []string{tags, "slo=gold"},
			wantDestination: "10.1.0.1:8000", wantOutcome: OutcomeRouted},
		{name: "a tag no cluster states gets the sidecar's 503 saying why", restrictions: []string{tags, "slo=platinum"},
			wantDetails: "no cluster stating the tags slo=platinum", wantOutcome: OutcomeOutsideTags},
		{name: "FailOpen does not let a request leave the tagged clusters when theirs fails", restrictions: []string{tags, "slo=gold"}, failOpen: true, breakInside: true,
			wantDetails: "allows only the clusters stating the tags slo=gold (annotation mci.x-k8s.io/cluster-tags): the request goes nowhere else", wantOutcome: OutcomeUnavailable},
		{name: "a region whose clusters lack the tag gets a 503 counted under the tags, naming both", restrictions: []string{regions, "us-east-1", tags, "slo=gold"},
			wantDetails: "no cluster in region(s) us-east-1 (annotation mci.x-k8s.io/cluster-regions) and stating the tags slo=gold", wantOutcome: OutcomeOutsideTags},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inside := startFakeEPP(t, "epp-inside", "10.1.0.1:8000")
			outside := startFakeEPP(t, "epp-outside", "10.3.0.1:8000")
			imp := twoClusterImport(t, inside, outside)
			imp.Status.Clusters[0].ExportSettings = &v1alpha1.ExportSettings{Weight: 1, Region: "eu-west-1", Tags: map[string]string{"slo": "gold"}}
			// The other cluster weighs 1000 times more: only the filter
			// keeps requests from it.
			imp.Status.Clusters[1].ExportSettings = &v1alpha1.ExportSettings{Weight: 1000, Region: "us-east-1", Tags: map[string]string{"slo": "silver"}}
			annotations := append([]string{routetable.PolicyAnnotation, "Weighted"}, tt.restrictions...)
			if tt.failOpen {
				annotations = append(annotations, routetable.FailureModeAnnotation, "FailOpen")
			}
			h := startServer(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), annotations...)},
				Imports: []*v1alpha1.InferencePoolImport{imp},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing, "cluster-c": HealthServing}})
			if tt.breakInside {
				inside.mode.Store(eppFail)
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
			assert.EqualValues(t, 0, outside.calls.Load(), "the cluster outside the filter was never asked")
			cluster, code := "", "503"
			if tt.wantDestination != "" {
				cluster, code = "cluster-a", "200"
			}
			// An answer is counted once it is sent: the last 503 may reach
			// the gateway before its count does.
			assert.EventuallyWithT(t, func(c *assert.CollectT) {
				assert.Equal(c, 20.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues(cluster, tt.wantOutcome, code)))
			}, 5*time.Second, 5*time.Millisecond)
		})
	}
}
