package imports

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// ParseExport reads a pool's export annotations, and checks the cluster
// policy an exported pool names for its importers (its annotation and its
// label).
//
//   - No export annotation at all (neither export nor export-mode):
//     exported=false, err=nil. The pool is simply not exported.
//   - A valid export: exported=true, err=nil, and mode is the routing mode
//     (EndpointMode when export-mode is absent).
//   - An invalid export (export-mode without export, or a value that is not
//     allowed, the empty string included, an endpoint-picker-secret that
//     is not a Secret name, or an endpoint-picker-transport that does not
//     parse, a cluster policy that routingpolicy.Parse refuses, an
//     export-to scope that parseExportScope refuses, a drain annotation
//     other than "true" or "false"):
//     exported=false and err says what is wrong,
//     quoting the bad value and the allowed ones. Callers surface err in the
//     InferencePoolExport's Valid condition. A bad Secret name or transport
//     withdraws the export rather than letting importers reach a TLS EPP
//     in plaintext; a bad cluster policy withdraws it rather than letting
//     importers route by a default the pool did not ask for; a bad scope
//     withdraws it rather than exporting wider than asked. Importers
//     list an invalid export as a cluster that is not Ready, with err.
//
// Values are matched exactly: "clusterset" is not "ClusterSet".
func ParseExport(annotations, labels map[string]string) (mode inference.RoutingMode, exported bool, err error) {
	scope, hasScope := annotations[v1alpha1.ExportAnnotation]
	modeValue, hasMode := annotations[v1alpha1.ExportModeAnnotation]
	if !hasScope && !hasMode {
		return "", false, nil
	}

	var problems []string
	if !hasScope {
		problems = append(problems, fmt.Sprintf("annotation %q is set (to %q) but annotation %q is missing: add %s: %q to export the pool, or remove %s",
			v1alpha1.ExportModeAnnotation, modeValue, v1alpha1.ExportAnnotation,
			v1alpha1.ExportAnnotation, v1alpha1.ExportScopeClusterSet, v1alpha1.ExportModeAnnotation))
	} else if scope != v1alpha1.ExportScopeClusterSet {
		problems = append(problems, fmt.Sprintf("annotation %q has value %q; the only allowed value is %q",
			v1alpha1.ExportAnnotation, scope, v1alpha1.ExportScopeClusterSet))
	}

	mode = inference.RoutingModeEndpoint
	if hasMode {
		switch m := inference.RoutingMode(modeValue); m {
		case inference.RoutingModeEndpoint, inference.RoutingModeParent:
			mode = m
		default:
			problems = append(problems, fmt.Sprintf("annotation %q has value %q; allowed values are %q (the default) and %q",
				v1alpha1.ExportModeAnnotation, modeValue, inference.RoutingModeEndpoint, inference.RoutingModeParent))
		}
	}

	if _, err := eppaddr.EndpointPickerSecret(annotations); err != nil {
		problems = append(problems, err.Error())
	}
	if _, err := eppaddr.EndpointPickerMetricsTokenSecret(annotations); err != nil {
		problems = append(problems, err.Error())
	}
	if _, err := eppaddr.EndpointPickerTransport(annotations); err != nil {
		problems = append(problems, err.Error())
	}
	if _, err := Draining(annotations); err != nil {
		problems = append(problems, err.Error())
	}
	problems = append(problems, clusterPolicyProblems(annotations, labels)...)
	if _, err := parseExportScope(annotations); err != nil {
		problems = append(problems, err.Error())
	}

	if len(problems) > 0 {
		return "", false, fmt.Errorf("invalid export: %s", strings.Join(problems, "; "))
	}
	return mode, true, nil
}

// Draining reads a pool's drain annotation (v1alpha1.DrainAnnotation):
// "true" drains the export, "false" or no annotation does not, and any
// other value is an error, which makes the export invalid (ParseExport):
// a drain misspelt must not leave the cluster taking new work unseen.
func Draining(annotations map[string]string) (bool, error) {
	v, ok := annotations[v1alpha1.DrainAnnotation]
	switch {
	case !ok || v == "false":
		return false, nil
	case v == "true":
		return true, nil
	}
	return false, fmt.Errorf("annotation %q has value %q; allowed values are \"true\" and \"false\"", v1alpha1.DrainAnnotation, v)
}

// clusterPolicyProblems checks the cluster policy a pool names, as an
// annotation and as a label: sidecars read the annotation where the pool
// is local and the label where it is imported (an import carries its
// exporter's labels). An empty value names none, as the sidecars read it.
func clusterPolicyProblems(annotations, labels map[string]string) []string {
	var problems []string
	for _, setting := range []struct {
		kind   string
		values map[string]string
	}{{"annotation", annotations}, {"label", labels}} {
		v := setting.values[v1alpha1.ClusterPolicyAnnotation]
		if v == "" {
			continue
		}
		if _, err := routingpolicy.Parse(v); err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: cluster policy: %v", setting.kind, v1alpha1.ClusterPolicyAnnotation, err))
		}
	}
	return problems
}

// servedPolicy is the cluster policy an exporter asks its importers to
// use, to be served on the import (and on the exporting cluster's
// summary) as annotations: its ClusterPolicyAnnotation annotation, else its
// label of that name (what exporters set while imports carried only
// labels), in routingpolicy's canonical form, so that an inline
// configuration, which no label value can hold, crosses clusters, and
// every sidecar reads it alike. nil when it names none (an empty value
// names none, as sidecars read it) or one that does not parse: a pool's
// makes its export invalid already; a summary, written by another
// cluster's server, is checked again here, and its label still reaches
// the sidecars, which report it.
func servedPolicy(m *metav1.ObjectMeta) map[string]string {
	v := m.Annotations[v1alpha1.ClusterPolicyAnnotation]
	if v == "" {
		v = m.Labels[v1alpha1.ClusterPolicyAnnotation]
	}
	if v == "" {
		return nil
	}
	c, err := routingpolicy.Parse(v)
	if err != nil {
		return nil
	}
	return map[string]string{v1alpha1.ClusterPolicyAnnotation: c.Canonical()}
}

// asksExport says whether a pool asks to be exported: it carries the
// export annotation, whatever its value. Importers list such a pool's
// cluster, not Ready when the export is invalid.
func asksExport(annotations map[string]string) bool {
	_, ok := annotations[v1alpha1.ExportAnnotation]
	return ok
}

// hasExportAnnotation says whether a pool carries either export annotation,
// valid or not: such a pool has an InferencePoolExport.
func hasExportAnnotation(annotations map[string]string) bool {
	_, scope := annotations[v1alpha1.ExportAnnotation]
	_, mode := annotations[v1alpha1.ExportModeAnnotation]
	return scope || mode
}
