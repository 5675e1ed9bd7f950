package routetable

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// ClusterRegionsAnnotation on an HTTPRoute restricts its inference
// backendRefs to the clusters of the regions it lists ("eu-west-1,
// eu-central-1"): a cluster's region is what its exporter states
// (v1alpha1.ExportSettingsAnnotation, carried on the import), and the
// local cluster's is the sidecar's --local-cluster-region. A cluster of no
// known region is outside every restriction. It is a hard filter, not a
// preference: the clusters outside are no candidates at all, whatever the
// policy, FailOpen never lets such a request go on without a destination,
// and when no cluster is left the sidecar answers 503 saying why. It is a
// route's setting rather than a word of the cluster policy because it is a
// promise about where the route's traffic may go, which holds whatever
// policy the route, its pool or an exporter chooses.
const ClusterRegionsAnnotation = "mci.x-k8s.io/cluster-regions"

// Regions is a backend's hard locality filter (ClusterRegionsAnnotation).
type Regions struct {
	// Allowed are the regions the route allows, sorted. Empty when the
	// annotation could not be read: then no cluster is allowed (Problem).
	Allowed []string
	// Problem says why the annotation could not be read: a restriction
	// misspelt never widens to every cluster.
	Problem string
	// LeftOut are the clusters the filter took out, as "name (region)".
	LeftOut []string
}

// parseClusterRegions reads the annotation: regions (DNS labels)
// separated by commas, spaces allowed, at least one.
func parseClusterRegions(s string) ([]string, error) {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(item); len(errs) > 0 {
			return nil, fmt.Errorf("region %q is not a DNS label: %s", item, strings.Join(errs, "; "))
		}
		out = append(out, item)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("it lists no region")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// routeRegions is the restriction a route's annotation gives; nil when it
// has none.
func (b *builder) routeRegions(annotations map[string]string, report func(format string, args ...any)) *Regions {
	v, ok := annotations[ClusterRegionsAnnotation]
	if !ok {
		return nil
	}
	allowed, err := parseClusterRegions(v)
	if err != nil {
		r := &Regions{Problem: fmt.Sprintf("annotation %s %q cannot be read (%v), and a locality restriction that cannot be read allows no cluster", ClusterRegionsAnnotation, v, err)}
		report("%s; its inference backendRefs answer 503", r.Problem)
		return r
	}
	return &Regions{Allowed: allowed}
}

// restrict keeps only be's clusters (and local pool) of the allowed
// regions, noting those it takes out, and reports a backend with none
// left. A nil restriction keeps every cluster.
func (r *Regions) restrict(be *Backend, report func(format string, args ...any)) {
	if r == nil {
		return
	}
	out := &Regions{Allowed: r.Allowed, Problem: r.Problem}
	inside := func(c *Cluster) bool {
		if r.Problem == "" && c.Region != "" && slices.Contains(r.Allowed, c.Region) {
			return true
		}
		if !slices.Contains(out.LeftOut, c.describeRegion()) {
			out.LeftOut = append(out.LeftOut, c.describeRegion())
		}
		return false
	}
	be.Clusters = slices.DeleteFunc(be.Clusters, func(c *Cluster) bool { return !inside(c) })
	if be.Local != nil && !inside(be.Local) {
		be.Local = nil
	}
	be.Regions = out
	if len(be.Clusters) == 0 && be.Local == nil && r.Problem == "" {
		report("%s: %s; its requests get 503", be, out.Unavailable())
	}
}

// Unavailable says why no cluster of a region-restricted backend can take
// a request: the 503's message.
func (r *Regions) Unavailable() string {
	if r.Problem != "" {
		return r.Problem
	}
	msg := fmt.Sprintf("no cluster in region(s) %s (annotation %s) can take the request", strings.Join(r.Allowed, ", "), ClusterRegionsAnnotation)
	if len(r.LeftOut) > 0 {
		msg += "; outside them: " + strings.Join(r.LeftOut, ", ")
	}
	return msg
}

// describeRegion is the cluster's name and region, as messages list it.
func (c *Cluster) describeRegion() string {
	if c.Region == "" {
		return c.Name + " (no region)"
	}
	return c.Name + " (" + c.Region + ")"
}

// exportSettings reads what an imported cluster's exporter states: its
// weight (1 when it states none) and region.
func exportSettings(ic v1alpha1.ImportedCluster) (weight int64, region string) {
	s := ic.ExportSettings
	if s == nil {
		return 1, ""
	}
	// mci-apiserver serves 1 to 1000; another server's import is held to
	// the same bounds rather than trusted with the route's arithmetic.
	return min(max(int64(s.Weight), 1), 1000), s.Region
}
