package inferencepoolexport

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

var columns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "Name of the exported InferencePool."},
	{Name: "Valid", Type: "string", Description: "Whether the export annotations are valid."},
	{Name: "Mode", Type: "string", Description: "Routing mode the export asks for."},
	{Name: "Imported-By", Type: "string", Description: "Clusters that import the pool."},
	{Name: "Not-Imported", Type: "string", Description: "Clusters that do not import the pool, with the reason.", Priority: 1},
	{Name: "Age", Type: "string", Description: "Age of the InferencePool."},
}

// table is the resource's `kubectl get` table.
var table = virtual.Table{Columns: columns, Row: func(obj runtime.Object, name, age string) []interface{} {
	exp := obj.(*inference.InferencePoolExport)
	var in, out []string
	for _, c := range exp.Status.Clusters {
		if c.Imported {
			in = append(in, c.Name)
		} else {
			out = append(out, c.Name+"("+c.Reason+")")
		}
	}
	return []interface{}{name, virtual.ConditionStatus(exp.Status.Conditions, "Valid"), string(exp.Status.RoutingMode), strings.Join(in, ","), strings.Join(out, ","), age}
}}
