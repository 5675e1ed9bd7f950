package inferencepoolimport

import (
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

var columns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "Name of the imported InferencePool."},
	{Name: "Clusters", Type: "string", Description: "Exporting clusters, sorted by name."},
	{Name: "Mode", Type: "string", Description: "Routing modes of the exporting clusters."},
	{Name: "Ready", Type: "string", Description: "Whether at least one exporting cluster can take traffic."},
	{Name: "Age", Type: "string", Description: "Age of the oldest exported InferencePool."},
}

// table is the resource's `kubectl get` table.
var table = virtual.Table{Columns: columns, Row: func(obj runtime.Object, name, age string) []interface{} {
	imp := obj.(*inference.InferencePoolImport)
	names := make([]string, 0, len(imp.Status.Clusters))
	var modes []string
	for _, c := range imp.Status.Clusters {
		names = append(names, c.Name)
		if !slices.Contains(modes, string(c.RoutingMode)) {
			modes = append(modes, string(c.RoutingMode))
		}
	}
	return []interface{}{name, strings.Join(names, ","), strings.Join(modes, ","), virtual.ConditionStatus(imp.Status.Conditions, "Ready"), age}
}}
