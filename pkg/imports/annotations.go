package imports

import (
	"fmt"
	"strings"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppaddr"
)

// ParseExport reads a pool's export annotations.
//
//   - No export annotation at all (neither export nor export-mode):
//     exported=false, err=nil. The pool is simply not exported.
//   - A valid export: exported=true, err=nil, and mode is the routing mode
//     (EndpointMode when export-mode is absent).
//   - An invalid export (export-mode without export, or a value that is not
//     allowed, the empty string included, an endpoint-picker-secret that
//     is not a Secret name, or an endpoint-picker-transport that does not
//     parse): exported=false and err says what is wrong,
//     quoting the bad value and the allowed ones. Callers surface err in the
//     InferencePoolExport's Valid condition. A bad Secret name or transport
//     withdraws the export rather than letting importers reach a TLS EPP
//     in plaintext.
//
// Values are matched exactly: "clusterset" is not "ClusterSet".
func ParseExport(annotations map[string]string) (mode inference.RoutingMode, exported bool, err error) {
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
	if _, err := eppaddr.EndpointPickerTransport(annotations); err != nil {
		problems = append(problems, err.Error())
	}

	if len(problems) > 0 {
		return "", false, fmt.Errorf("invalid export: %s", strings.Join(problems, "; "))
	}
	return mode, true, nil
}

// hasExportAnnotation says whether a pool carries either export annotation,
// valid or not: such a pool has an InferencePoolExport.
func hasExportAnnotation(annotations map[string]string) bool {
	_, scope := annotations[v1alpha1.ExportAnnotation]
	_, mode := annotations[v1alpha1.ExportModeAnnotation]
	return scope || mode
}
