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

// A route restricted to a region never reaches a cluster outside it, not
// through its policy, not through FailOpen; with none left the answer is
// the sidecar's own 503 saying why.
func TestServerRegionRestrictedRoutes(t *testing.T) {
	tests := []struct {
		name string
		// regions is the route's ClusterRegionsAnnotation; failOpen its
		// failure mode; breakEU makes the EU cluster's EPP fail.
		regions  string
		failOpen bool
		breakEU  bool
		// wantDestination is where the request goes; "" for the 503.
		wantDestination string
		wantDetails     string
		wantOutcome     string
	}{
		{name: "the cluster of the allowed region takes every request, whatever the weights say", regions: "eu-west-1", wantDestination: "10.1.0.1:8000", wantOutcome: OutcomeRouted},
		{name: "a region no cluster is in gets the sidecar's 503 saying why", regions: "ap-south-1",
			wantDetails: "no cluster in region(s) ap-south-1", wantOutcome: OutcomeOutsideRegions},
		{name: "FailOpen does not let a request leave the region when its cluster fails", regions: "eu-west-1", failOpen: true, breakEU: true,
			wantDetails: "locality filter (eu-west-1) lets the request go nowhere else", wantOutcome: OutcomeUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eu := startFakeEPP(t, "epp-eu", "10.1.0.1:8000")
			us := startFakeEPP(t, "epp-us", "10.3.0.1:8000")
			imp := twoClusterImport(t, eu, us)
			imp.Status.Clusters[0].ExportSettings = &v1alpha1.ExportSettings{Weight: 1, Region: "eu-west-1"}
			// The US cluster weighs 1000 times more: only the filter keeps
			// requests from it.
			imp.Status.Clusters[1].ExportSettings = &v1alpha1.ExportSettings{Weight: 1000, Region: "us-east-1"}
			annotations := []string{routetable.ClusterRegionsAnnotation, tt.regions, routetable.PolicyAnnotation, "Weighted"}
			if tt.failOpen {
				annotations = append(annotations, routetable.FailureModeAnnotation, "FailOpen")
			}
			h := startServer(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Annotate(sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil))), annotations...)},
				Imports: []*v1alpha1.InferencePoolImport{imp},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing, "cluster-c": HealthServing}})
			if tt.breakEU {
				eu.mode.Store(eppFail)
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
			assert.EqualValues(t, 0, us.calls.Load(), "the cluster outside the region was never asked")
			cluster, code := "", "503"
			if tt.wantDestination != "" {
				cluster, code = "cluster-a", "200"
			}
			assert.Equal(t, 20.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues(cluster, tt.wantOutcome, code)))
		})
	}
}
