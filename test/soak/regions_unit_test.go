package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRegionalRouteCountsAnswersOutsideItsRegionAndRefusalsApart(t *testing.T) {
	begin := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return begin.Add(time.Duration(s * float64(time.Second))) }
	refusal := `{"error":{"code":503,"message":"demo/llm-pool: no cluster in region(s) soak-cluster-a (annotation mci.x-k8s.io/cluster-regions) can take the request"}}`
	reqs := []request{
		{Sent: at(1), Code: 200, Cluster: "cluster-a", Route: regionalRoute, Model: "m"},
		{Sent: at(2), Code: 200, Cluster: "cluster-c", Model: "m"}, // the data path's own route
		{Sent: at(3), Code: 503, Body: refusal, Route: regionalRoute},
		{Sent: at(4), Code: 200, Cluster: "cluster-c", Route: regionalRoute, Model: "m"},
		{Sent: at(5), Code: 503, Body: "no healthy upstream", Route: regionalRoute},
		{Sent: at(6), Code: 500, Cluster: "cluster-a", Route: regionalRoute},
	}
	res := judgeRegional(reqs, "cluster-a", begin)
	assert.Equal(t, regionalResult{Region: "soak-cluster-a", Sent: 5, InRegion: 1, FailedInRegion: 1, Outside: 1, Refused: 1, OutsideFirst: []string{"sent +4.0s, answered HTTP 200 by cluster-c"}}, res)

	// In the report: the answer outside the region is a missed target, the
	// refusal no failure, the other 503 a lost request.
	topo := testTopology
	topo.Regional = "cluster-a"
	cfg := config{Seed: 1, Duration: 75 * time.Second, Warmup: 10 * time.Second, HealTarget: 5 * time.Second}
	r := buildReport(cfg, begin, at(75), nil, nil, nil, reqs, 0, nil, 0, watcherResult{}, nil, topo, "m")
	assert.Equal(t, 1, r.Requests.Refused)
	assert.Equal(t, 2, r.Requests.Failed)
	assert.Equal(t, 2, r.Requests.Unexplained, "no fault explains them here")
	assert.Len(t, r.Failures, 2, "%v", r.Failures)
	assert.Contains(t, r.Failures[1], "1 requests of the route restricted to soak-cluster-a answered by a cluster outside it")
}
