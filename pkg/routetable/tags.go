package routetable

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// ClusterTagsAnnotation on an HTTPRoute restricts its inference
// backendRefs to the clusters whose exporters state every tag it lists
// ("slo=gold, tier=premium"), as tags in v1alpha1.ExportSettingsAnnotation
// carried on the import. It is a hard filter for the same reason as
// ClusterRegionsAnnotation, and behaves the same way: the clusters outside
// are no candidates whatever the policy, FailOpen never lets such a
// request go on without a destination, a value that cannot be read allows
// no cluster, and when none is left the sidecar answers 503 saying why.
// The local cluster states no tags, so it is outside every tag
// restriction.
const ClusterTagsAnnotation = "mci.x-k8s.io/cluster-tags"

// Tags is a backend's hard filter on its exporters' tags
// (ClusterTagsAnnotation).
type Tags struct {
	// Required are the tags a cluster must state, each with its value.
	// Empty when the annotation could not be read: then no cluster is
	// allowed (Problem).
	Required map[string]string
	// Problem says why the annotation could not be read.
	Problem string
	// LeftOut are the clusters the filter took out.
	LeftOut []string
}

// parseClusterTags reads the annotation: key=value pairs separated by
// commas, spaces allowed, at least one; keys are label keys and values
// label values, as the exporters' tags are, and a key is listed once.
func parseClusterTags(s string) (map[string]string, error) {
	out := map[string]string{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
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

// routeTags is the restriction a route's annotation gives; nil when it has
// none.
func (b *builder) routeTags(annotations map[string]string, report func(format string, args ...any)) *Tags {
	v, ok := annotations[ClusterTagsAnnotation]
	if !ok {
		return nil
	}
	required, err := parseClusterTags(v)
	if err != nil {
		t := &Tags{Problem: fmt.Sprintf("annotation %s %q cannot be read (%v), and a tag restriction that cannot be read allows no cluster", ClusterTagsAnnotation, v, err)}
		report("%s; its inference backendRefs answer 503", t.Problem)
		return t
	}
	return &Tags{Required: required}
}

// restrict keeps only be's clusters (and local pool) that state every
// required tag, noting those it takes out, and reports a backend it left
// with none. A nil restriction keeps every cluster.
func (t *Tags) restrict(be *Backend, report func(format string, args ...any)) {
	if t == nil {
		return
	}
	out := &Tags{Required: t.Required, Problem: t.Problem}
	hadSome := len(be.Clusters) > 0 || be.Local != nil
	inside := func(c *Cluster) bool {
		if t.Problem == "" && hasTags(c.Tags, t.Required) {
			return true
		}
		out.LeftOut = append(out.LeftOut, c.Name)
		return false
	}
	be.Clusters = slices.DeleteFunc(be.Clusters, func(c *Cluster) bool { return !inside(c) })
	if be.Local != nil && !inside(be.Local) {
		be.Local = nil
	}
	slices.Sort(out.LeftOut)
	out.LeftOut = slices.Compact(out.LeftOut)
	be.Tags = out
	if hadSome && len(be.Clusters) == 0 && be.Local == nil && t.Problem == "" {
		report("%s: %s; its requests get 503", be, out.Unavailable())
	}
}

func hasTags(have, required map[string]string) bool {
	for k, v := range required {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Unavailable says why no cluster of a tag-restricted backend can take a
// request: the 503's message.
func (t *Tags) Unavailable() string {
	if t.Problem != "" {
		return t.Problem
	}
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(t.Required)) {
		pairs = append(pairs, k+"="+t.Required[k])
	}
	msg := fmt.Sprintf("no cluster states the tags %s (annotation %s)", strings.Join(pairs, ", "), ClusterTagsAnnotation)
	if len(t.LeftOut) > 0 {
		msg += "; left out: " + strings.Join(t.LeftOut, ", ")
	}
	return msg
}

// exportTags are the tags an imported cluster's exporter states; nil
// when none.
func exportTags(ic v1alpha1.ImportedCluster) map[string]string {
	if ic.ExportSettings == nil {
		return nil
	}
	return ic.ExportSettings.Tags
}
