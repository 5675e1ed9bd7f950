package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/test/localclusterset"
)

// The regional route: a second HTTPRoute of the gateway cluster to the
// data path's import, for requests to regionalHost, restricted by
// routetable.ClusterRegionsAnnotation to the region that the first
// exporter states (regionOf), where it is the only cluster.
const (
	regionalHost  = "regional.soak.test"
	regionalRoute = "llm-pool-regional"
	// regionalEvery: one request in regionalEvery goes to the regional
	// route.
	regionalEvery = 4
)

// regionOf is the region each exporter states of itself in its export of
// the data path pool.
func regionOf(exporter string) string { return "soak-" + exporter }

// setUpRegionalRoute states each exporter's region on its export of the
// data path pool and creates the regional route, restricted to the
// region of inRegion.
func setUpRegionalRoute(ctx context.Context, dp *localclusterset.DataPath, mci map[string]mciclient.Interface, gateway gatewayclient.Interface, exporters []string, inRegion string) error {
	for _, e := range exporters {
		settings, err := json.Marshal(v1alpha1.ExportSettings{Weight: 1, Region: regionOf(e)})
		if err != nil {
			return err
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.ExportSettingsAnnotation: string(settings)}}})
		if err != nil {
			return err
		}
		if _, err := mci[e].InferencePoolV1().InferencePools(dp.Namespace).Patch(ctx, dp.Pool, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("stating %s's region: %w", e, err)
		}
	}
	routes := gateway.GatewayV1().HTTPRoutes(dp.Namespace)
	main, err := routes.Get(ctx, dp.Pool, metav1.GetOptions{})
	if err != nil {
		return err
	}
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: regionalRoute, Namespace: dp.Namespace, Annotations: map[string]string{routetable.ClusterRegionsAnnotation: regionOf(inRegion)}},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: main.Spec.ParentRefs},
			Hostnames:       []gatewayv1.Hostname{regionalHost},
			Rules: []gatewayv1.HTTPRouteRule{{
				Matches:     []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/v1")}}},
				BackendRefs: main.Spec.Rules[0].BackendRefs,
			}},
		},
	}
	_, err = routes.Create(ctx, route, metav1.CreateOptions{})
	return err
}

// regionalResult is what the regional route's requests were answered.
type regionalResult struct {
	Region string `json:"region"`
	Sent   int    `json:"sent"`
	// InRegion were answered 200 by the region's cluster, FailedInRegion
	// failed by it (its model server faults); Outside were answered by
	// another (target 0).
	InRegion       int `json:"in_region"`
	FailedInRegion int `json:"failed_in_region"`
	Outside        int `json:"outside"`
	// Refused were answered 503 by mci-sidecar saying no cluster of the
	// region is left: what the route promises while its cluster is out.
	Refused      int      `json:"refused"`
	OutsideFirst []string `json:"outside_first,omitempty"`
}

// refusedForRegion reports whether q is mci-sidecar's 503 for a route
// whose regions hold no cluster.
func refusedForRegion(q request) bool {
	return q.Route == regionalRoute && q.Code == http.StatusServiceUnavailable && strings.Contains(q.Body, "in region(s) ")
}

// judgeRegional counts the regional route's requests by who answered.
func judgeRegional(requests []request, inRegion string, begin time.Time) regionalResult {
	res := regionalResult{Region: regionOf(inRegion)}
	for _, q := range requests {
		if q.Route != regionalRoute {
			continue
		}
		res.Sent++
		switch {
		case refusedForRegion(q):
			res.Refused++
		case q.Cluster == "":
		case q.Cluster == inRegion && q.failed():
			res.FailedInRegion++
		case q.Cluster == inRegion:
			res.InRegion++
		default:
			res.Outside++
			if len(res.OutsideFirst) < 10 {
				res.OutsideFirst = append(res.OutsideFirst, fmt.Sprintf("sent +%.1fs, answered HTTP %d by %s", q.Sent.Sub(begin).Seconds(), q.Code, q.Cluster))
			}
		}
	}
	return res
}
