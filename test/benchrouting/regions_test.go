package benchrouting

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/mci-dev/mci/test/promtext"
)

// The locality filter's invariant, checked after the workloads: with the
// HTTPRoute's mci.x-k8s.io/cluster-regions naming one region, no request
// reaches a cluster outside it, whatever the policy; and once every
// cluster of the region is gone from the import, the sidecar answers 503
// itself, logs the reason and counts outcome="outside_regions", rather
// than send the request anywhere else.

const (
	// The annotations, as a user writes them (pkg/routetable's and the
	// API's constants are deliberately not imported: the harness drives
	// the sidecar as a user does).
	regionsAnnotation        = "mci.x-k8s.io/cluster-regions"
	exportSettingsAnnotation = "mci.x-k8s.io/export-settings"
	exportAnnotation         = "inference.networking.x-k8s.io/export"
	// inRegion is cluster-a's region, the one the route allows; cluster-c
	// states another, and the local cluster-b none (its sidecar has no
	// --local-cluster-region), which puts it outside every restriction.
	inRegionCluster = "cluster-a"
	inRegion        = "eu-west-1"
	outRegion       = "us-east-1"
	// regionRequests are sent in each phase: enough that a filter that
	// let through a share of a third or more would show it.
	regionRequests = 30
	// noClustersInRegions is the routing table's reason when the filter
	// leaves no cluster, which the sidecar logs.
	noClustersInRegions  = "NoClustersInRegions"
	outsideRegionsSeries = `mci_sidecar_requests_total{outcome="outside_regions"}`
)

// regionResult is what the check saw, in results.json.
type regionResult struct {
	Regions string `json:"regions"`
	// ByCluster counts the requests each cluster's model servers answered
	// while the region's cluster served.
	ByCluster map[string]int `json:"by_cluster"`
	// Outside counts the requests answered outside the regions, in both
	// phases: the invariant is 0.
	Outside int `json:"outside"`
	// Down is the phase where no cluster of the region is left: every
	// request answered 503 by the sidecar, counted as outside_regions.
	DownStatuses map[int]int `json:"down_statuses"`
	DownMetric   float64     `json:"down_outside_regions_metric"`
	DownLogged   bool        `json:"down_reason_logged"`
	Errors       []string    `json:"errors,omitempty"`
}

// checkRegionFilter runs both phases on the running data path and puts
// the exporters' and the route's annotations back as they were.
func checkRegionFilter(ctx context.Context, e *env) (*regionResult, error) {
	r := &regionResult{Regions: inRegion, ByCluster: map[string]int{}, DownStatuses: map[int]int{}}
	restore, err := e.scopeToRegion(ctx)
	defer restore()
	if err != nil {
		return r, err
	}
	for range regionRequests {
		code, instance, body, err := e.dp.Send(ctx)
		cluster, _, _ := strings.Cut(instance, "/")
		switch {
		case err != nil || code != 200:
			r.Errors = append(r.Errors, fmt.Sprintf("HTTP %d %v: %.120s", code, err, body))
		case cluster != inRegionCluster:
			r.Outside++
		}
		if cluster != "" {
			r.ByCluster[cluster]++
		}
	}
	logf("  region filter %s: answered by %v, %d outside, %d errors", inRegion, r.ByCluster, r.Outside, len(r.Errors))

	// Every cluster of the region goes: cluster-a withdraws its export.
	if err := e.patchExporter(ctx, inRegionCluster, map[string]any{exportAnnotation: nil}); err != nil {
		return r, err
	}
	if err := e.waitImportClusters(ctx, []string{"cluster-c"}); err != nil {
		return r, err
	}
	before, err := e.sidecarMetric(ctx, outsideRegionsSeries)
	if err != nil {
		return r, err
	}
	for range regionRequests {
		code, instance, _, err := e.dp.Send(ctx)
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			continue
		}
		r.DownStatuses[code]++
		if instance != "" {
			r.Outside++
		}
	}
	after, err := e.sidecarMetric(ctx, outsideRegionsSeries)
	if err != nil {
		return r, err
	}
	r.DownMetric = after - before
	log, err := os.ReadFile(filepath.Join(e.cs.Dir, "logs", importingCluster+"-mci-sidecar.log"))
	r.DownLogged = err == nil && strings.Contains(string(log), noClustersInRegions)
	logf("  region filter %s with no cluster of it left: statuses %v, outside_regions +%v, reason logged %t", inRegion, r.DownStatuses, r.DownMetric, r.DownLogged)
	return r, nil
}

// regionErrors checks the invariant on what checkRegionFilter saw.
func regionErrors(r *regionResult) []error {
	if r == nil {
		return nil
	}
	var errs []error
	if r.Outside != 0 {
		errs = append(errs, fmt.Errorf("region filter %s: %d requests answered outside the region in both phases (the first phase by cluster: %v)", r.Regions, r.Outside, r.ByCluster))
	}
	if r.ByCluster[inRegionCluster] == 0 {
		errs = append(errs, fmt.Errorf("region filter %s: no request answered by %s, the region's cluster (errors: %v)", r.Regions, inRegionCluster, r.Errors))
	}
	if r.DownStatuses[503] != regionRequests {
		errs = append(errs, fmt.Errorf("region filter %s with no cluster of it left: statuses %v, want %d × 503", r.Regions, r.DownStatuses, regionRequests))
	}
	if r.DownMetric != regionRequests {
		errs = append(errs, fmt.Errorf("region filter %s with no cluster of it left: %s rose by %v, want %d", r.Regions, outsideRegionsSeries, r.DownMetric, regionRequests))
	}
	if !r.DownLogged {
		errs = append(errs, fmt.Errorf("region filter %s with no cluster of it left: mci-sidecar's log does not say %s", r.Regions, noClustersInRegions))
	}
	return errs
}

// scopeToRegion states the exporters' regions, waits until the import
// carries them, then restricts the route to inRegion and waits for the
// sidecar's table; restore undoes it all (cluster-a's export included).
func (e *env) scopeToRegion(ctx context.Context) (restore func(), err error) {
	var undo []func()
	restore = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		_ = e.waitImportClusters(ctx, []string{"cluster-a", "cluster-c"})
	}
	for cluster, region := range map[string]string{"cluster-a": inRegion, "cluster-c": outRegion} {
		settings := fmt.Sprintf(`{"region": %q}`, region)
		if err := e.patchExporter(ctx, cluster, map[string]any{exportSettingsAnnotation: settings}); err != nil {
			return restore, err
		}
		undo = append(undo, func() {
			_ = e.patchExporter(context.Background(), cluster, map[string]any{exportSettingsAnnotation: nil, exportAnnotation: "ClusterSet"})
		})
	}
	if err := e.waitImportRegions(ctx, map[string]string{"cluster-a": inRegion, "cluster-c": outRegion}); err != nil {
		return restore, err
	}
	before, err := e.tableGeneration(ctx)
	if err != nil {
		return restore, err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{regionsAnnotation: inRegion}}})
	if _, err := e.dyn.Resource(httpRouteGVR).Namespace(e.dp.Namespace).Patch(ctx, e.dp.Pool, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return restore, fmt.Errorf("restricting the HTTPRoute to %s: %w", inRegion, err)
	}
	undo = append(undo, func() {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{regionsAnnotation: nil}}})
		_, _ = e.dyn.Resource(httpRouteGVR).Namespace(e.dp.Namespace).Patch(context.Background(), e.dp.Pool, types.MergePatchType, patch, metav1.PatchOptions{})
	})
	return restore, wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		g, err := e.tableGeneration(ctx)
		return err == nil && g > before, nil
	})
}

// patchExporter merges annotations (nil removes one) into the exported
// pool of cluster.
func (e *env) patchExporter(ctx context.Context, cluster string, annotations map[string]any) error {
	c, err := e.cs.Cluster(cluster)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if _, err := dyn.Resource(inferencePoolGVR).Namespace(e.dp.Namespace).Patch(ctx, e.dp.Pool, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotating %s's pool %s/%s: %w", cluster, e.dp.Namespace, e.dp.Pool, err)
	}
	return nil
}

// importEntries polls the importing cluster's import until ok accepts its
// status.clusters[] entries.
func (e *env) importEntries(ctx context.Context, what string, ok func(entries []map[string]any) bool) error {
	var last []map[string]any
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		imp, err := e.dyn.Resource(importGVR).Namespace(e.dp.Namespace).Get(ctx, e.dp.Pool, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		raw, _, _ := unstructured.NestedSlice(imp.Object, "status", "clusters")
		last = last[:0]
		for _, r := range raw {
			if m, ok := r.(map[string]any); ok {
				last = append(last, m)
			}
		}
		return ok(last), nil
	})
	if err != nil {
		return fmt.Errorf("%s's import %s/%s: %s not within 20s (entries %v): %w", importingCluster, e.dp.Namespace, e.dp.Pool, what, last, err)
	}
	return nil
}

func (e *env) waitImportClusters(ctx context.Context, want []string) error {
	return e.importEntries(ctx, fmt.Sprintf("exporting clusters %v", want), func(entries []map[string]any) bool {
		var got []string
		for _, m := range entries {
			got = append(got, fmt.Sprint(m["name"]))
		}
		return strings.Join(got, ",") == strings.Join(want, ",")
	})
}

func (e *env) waitImportRegions(ctx context.Context, want map[string]string) error {
	return e.importEntries(ctx, fmt.Sprintf("regions %v", want), func(entries []map[string]any) bool {
		seen := 0
		for _, m := range entries {
			region, _, _ := unstructured.NestedString(m, "exportSettings", "region")
			if region == want[fmt.Sprint(m["name"])] {
				seen++
			}
		}
		return seen == len(want)
	})
}

// sidecarMetric sums the series of the data path's mci-sidecar that
// selector matches (0 when none has been counted yet).
func (e *env) sidecarMetric(ctx context.Context, selector string) (float64, error) {
	u, err := url.Parse(e.dp.GatewayURL)
	if err != nil {
		return 0, err
	}
	m, err := promtext.Get(ctx, "http://"+net.JoinHostPort(u.Hostname(), "9090")+"/metrics")
	if err != nil {
		return 0, fmt.Errorf("reading mci-sidecar's metrics: %w", err)
	}
	return m.SumMatching(selector)
}
