package routetable

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ClusterRegionsAnnotation on an HTTPRoute restricts its inference
// backendRefs to the clusters of the regions it lists ("eu-west-1,
// eu-central-1"): a cluster's region is what its exporter states
// (v1alpha1.ExportSettingsAnnotation, carried on the import), and the
// local cluster's is the sidecar's --local-cluster-region. A cluster of no
// known region is outside every region restriction. See ClusterFilter.
const ClusterRegionsAnnotation = "mci.x-k8s.io/cluster-regions"

// ClusterTagsAnnotation on an HTTPRoute restricts its inference
// backendRefs to the clusters whose exporters state every tag it lists
// ("slo=gold, tier=premium"), as tags in v1alpha1.ExportSettingsAnnotation
// carried on the import. The local cluster states no tags, so it is
// outside every tag restriction. See ClusterFilter.
const ClusterTagsAnnotation = "mci.x-k8s.io/cluster-tags"

// ClusterFilter is a backend's hard filter on its clusters: the
// restrictions its route states (ClusterRegionsAnnotation,
// ClusterTagsAnnotation), every one of which a cluster must meet. It is a
// filter, not a preference: the clusters outside are no candidates at all,
// whatever the policy, FailOpen never lets such a request go on without a
// destination, and when no cluster is left the sidecar answers 503 saying
// why. The restrictions are a route's settings rather than words of the
// cluster policy because they are a promise about where the route's
// traffic may go, which holds whatever policy the route, its pool or an
// exporter chooses.
type ClusterFilter struct {
	// Regions are the regions a cluster must be in, sorted; nil when the
	// route states none, or when its annotation cannot be read (Problems).
	Regions []string
	// Tags are the tags a cluster must state, each with its value; nil
	// likewise.
	Tags map[string]string
	// Problems say, by restriction, why the route's annotation cannot be
	// read. With any, no cluster is allowed: a restriction misspelt never
	// widens to every cluster.
	Problems map[Restriction]string
	// LeftOut are the clusters the filter took out of the backend, by
	// name.
	LeftOut []LeftOut
}

// Restriction is one restriction a route may state; a ClusterFilter
// checks them in this order.
type Restriction int

const (
	// RegionRestriction is ClusterRegionsAnnotation's.
	RegionRestriction Restriction = iota
	// TagRestriction is ClusterTagsAnnotation's.
	TagRestriction
)

var restrictions = []Restriction{RegionRestriction, TagRestriction}

// Annotation is the HTTPRoute annotation that states r.
func (r Restriction) Annotation() string {
	if r == RegionRestriction {
		return ClusterRegionsAnnotation
	}
	return ClusterTagsAnnotation
}

// reason is the routing table's report when r leaves a backend no cluster.
func (r Restriction) reason() string {
	if r == RegionRestriction {
		return ReasonNoClustersInRegions
	}
	return ReasonNoClustersWithTags
}

// LeftOut is a cluster a ClusterFilter took out, and why.
type LeftOut struct {
	Cluster string
	// Outside are the restrictions it does not meet, in order.
	Outside []Restriction
	// Why is what of the cluster breaks them, as messages say it: its
	// region ("us-east-1", "no region"), its values of the tags required
	// ("slo=silver", "no tag slo").
	Why string
}

func (l LeftOut) String() string {
	if l.Why == "" {
		return l.Cluster
	}
	return l.Cluster + " (" + l.Why + ")"
}

// parseClusterRegions reads ClusterRegionsAnnotation: regions (DNS
// labels) separated by commas, spaces allowed, at least one.
func parseClusterRegions(s string) ([]string, error) {
	var out []string
	for item := range listItems(s) {
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

// parseClusterTags reads ClusterTagsAnnotation: key=value pairs separated
// by commas, spaces allowed, at least one; keys are label keys and values
// label values, as the exporters' tags are, and a key is listed once.
func parseClusterTags(s string) (map[string]string, error) {
	out := map[string]string{}
	for item := range listItems(s) {
		key, value, ok := strings.Cut(item, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		switch {
		case !ok:
			return nil, fmt.Errorf("%q is not key=value", item)
		case len(validation.IsQualifiedName(key)) > 0:
			return nil, fmt.Errorf("tag %q is not a label key: %s", key, strings.Join(validation.IsQualifiedName(key), "; "))
		case len(validation.IsValidLabelValue(value)) > 0:
			return nil, fmt.Errorf("the value %q of tag %q is not a label value: %s", value, key, strings.Join(validation.IsValidLabelValue(value), "; "))
		}
		if _, twice := out[key]; twice {
			return nil, fmt.Errorf("tag %q is listed twice", key)
		}
		out[key] = value
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("it lists no tag")
	}
	return out, nil
}

// routeClusterFilter is the filter a route's annotations state; nil when
// they state no restriction. An annotation that cannot be read is
// reported, and its restriction allows no cluster.
func routeClusterFilter(annotations map[string]string, report func(format string, args ...any)) *ClusterFilter {
	f := &ClusterFilter{}
	stated := false
	read := func(r Restriction, parse func(string) error) {
		v, ok := annotations[r.Annotation()]
		if !ok {
			return
		}
		stated = true
		if err := parse(v); err != nil {
			if f.Problems == nil {
				f.Problems = map[Restriction]string{}
			}
			f.Problems[r] = fmt.Sprintf("annotation %s %q cannot be read (%v), and a restriction that cannot be read allows no cluster", r.Annotation(), v, err)
			report("%s; its inference backendRefs answer 503", f.Problems[r])
		}
	}
	read(RegionRestriction, func(v string) (err error) { f.Regions, err = parseClusterRegions(v); return err })
	read(TagRestriction, func(v string) (err error) { f.Tags, err = parseClusterTags(v); return err })
	if !stated {
		return nil
	}
	return f
}

// holds says whether the route states r, readable or not.
func (f *ClusterFilter) holds(r Restriction) bool {
	if _, unreadable := f.Problems[r]; unreadable {
		return true
	}
	if r == RegionRestriction {
		return f.Regions != nil
	}
	return f.Tags != nil
}

// check returns the restrictions c does not meet, and what of c breaks
// each, as messages say it.
func (f *ClusterFilter) check(c *Cluster) (outside []Restriction, why []string) {
	if f.holds(RegionRestriction) && !slices.Contains(f.Regions, c.Region) {
		outside = append(outside, RegionRestriction)
		why = append(why, cmp.Or(c.Region, "no region"))
	}
	if f.holds(TagRestriction) {
		var off []string
		for _, k := range slices.Sorted(maps.Keys(f.Tags)) {
			if v, ok := c.Tags[k]; !ok {
				off = append(off, "no tag "+k)
			} else if v != f.Tags[k] {
				off = append(off, k+"="+v)
			}
		}
		if _, unreadable := f.Problems[TagRestriction]; unreadable || len(off) > 0 {
			outside = append(outside, TagRestriction)
			why = append(why, off...)
		}
	}
	return outside, why
}

// apply keeps only the clusters of be (and its local pool) that f allows,
// and gives be a copy of f that lists the clusters it took out. When none
// is left it reports why under the reason of the Decisive restriction, as
// the sidecar counts its 503s, even when be had no cluster to begin with
// (its import reports that too); not when a restriction cannot be read,
// which was reported with the annotation. A nil filter keeps every
// cluster.
func (f *ClusterFilter) apply(be *Backend, report func(reason, format string, args ...any)) {
	if f == nil {
		return
	}
	out := &ClusterFilter{Regions: f.Regions, Tags: f.Tags, Problems: f.Problems}
	keep := func(c *Cluster) bool {
		outside, why := f.check(c)
		if len(outside) == 0 {
			return true
		}
		out.LeftOut = append(out.LeftOut, LeftOut{Cluster: c.Name, Outside: outside, Why: strings.Join(why, "; ")})
		return false
	}
	be.Clusters = slices.DeleteFunc(be.Clusters, func(c *Cluster) bool { return !keep(c) })
	if be.Local != nil && !keep(be.Local) {
		be.Local = nil
	}
	// A shim pool's local EPP is both a cluster and the local pool.
	slices.SortStableFunc(out.LeftOut, func(a, b LeftOut) int { return strings.Compare(a.Cluster, b.Cluster) })
	out.LeftOut = slices.CompactFunc(out.LeftOut, func(a, b LeftOut) bool { return a.Cluster == b.Cluster })
	be.ClusterFilter = out
	if len(be.Clusters) == 0 && be.Local == nil && len(f.Problems) == 0 {
		report(out.Decisive().reason(), "%s: %s; its requests get 503", be, out.Unavailable())
	}
}

// Decisive is the restriction that left the backend no cluster, when none
// is left: the regions when none of its clusters is in them (or they
// cannot be read), else the tags. The regions come first so that a route
// whose regions rule out every cluster is told so whatever its tags.
func (f *ClusterFilter) Decisive() Restriction {
	if !f.holds(RegionRestriction) {
		return TagRestriction
	}
	for _, l := range f.LeftOut {
		if !slices.Contains(l.Outside, RegionRestriction) {
			return TagRestriction
		}
	}
	return RegionRestriction
}

// Allowed says which clusters f allows, as messages say it: "in region(s)
// eu-west-1 (annotation ...) and stating the tags slo=gold (annotation
// ...)".
func (f *ClusterFilter) Allowed() string {
	var parts []string
	for _, r := range restrictions {
		if !f.holds(r) {
			continue
		}
		if _, unreadable := f.Problems[r]; unreadable {
			parts = append(parts, "allowed by annotation "+r.Annotation()+", which cannot be read")
			continue
		}
		what := "in region(s) " + strings.Join(f.Regions, ", ")
		if r == TagRestriction {
			var pairs []string
			for _, k := range slices.Sorted(maps.Keys(f.Tags)) {
				pairs = append(pairs, k+"="+f.Tags[k])
			}
			what = "stating the tags " + strings.Join(pairs, ", ")
		}
		parts = append(parts, what+" (annotation "+r.Annotation()+")")
	}
	return strings.Join(parts, " and ")
}

// Unavailable says why no cluster of the backend can take a request: the
// 503's message, with the restrictions that hold and the clusters they
// left out, or why they cannot be read.
func (f *ClusterFilter) Unavailable() string {
	var problems []string
	for _, r := range restrictions {
		if p, ok := f.Problems[r]; ok {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return strings.Join(problems, "; ")
	}
	msg := "no cluster " + f.Allowed() + " can take the request"
	if len(f.LeftOut) > 0 {
		left := make([]string, len(f.LeftOut))
		for i, l := range f.LeftOut {
			left[i] = l.String()
		}
		msg += "; left out: " + strings.Join(left, ", ")
	}
	return msg
}
