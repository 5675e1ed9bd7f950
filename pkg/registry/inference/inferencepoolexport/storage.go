// Package inferencepoolexport serves InferencePoolExports: read-only
// reports, in the exporting cluster, of what became of each InferencePool
// that carries an export annotation.
package inferencepoolexport

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

// Resource derives InferencePoolExports from the ClusterSet.
type Resource struct {
	LocalName string
}

var _ virtual.Resource = Resource{}

// Compute implements virtual.Resource.
func (Resource) Compute(cs imports.ClusterSet, namespace, name string) (virtual.Object, bool) {
	return virtual.One(imports.Export(cs, namespace, name))
}

// ComputeNamespace implements virtual.Resource.
func (Resource) ComputeNamespace(cs imports.ClusterSet, namespace string) []virtual.Object {
	return virtual.All(imports.Exports(cs, namespace))
}

// Affected implements virtual.Resource. An export depends on the local
// pool and on which other members have its namespace.
func (r Resource) Affected(ev clusterset.Event) virtual.Dirty {
	switch ev.Kind {
	case clusterset.KindInferencePool:
		if ev.Member == r.LocalName {
			return virtual.Dirty{Keys: []string{ev.Namespace + "/" + ev.Name}}
		}
		return virtual.Dirty{}
	case clusterset.KindNamespace:
		if ev.Member != r.LocalName {
			return virtual.Dirty{Namespaces: []string{ev.Namespace}}
		}
		return virtual.Dirty{}
	case clusterset.KindService, clusterset.KindEndpointSlice, clusterset.KindGateway,
		clusterset.KindHTTPRoute, clusterset.KindReferenceGrant, clusterset.KindBackendTLSPolicy,
		clusterset.KindExportSummary, clusterset.KindPod:
		return virtual.Dirty{}
	}
	return virtual.Dirty{All: true}
}

// CarryTransitionTimes implements virtual.Resource.
func (Resource) CarryTransitionTimes(prev, next virtual.Object, now metav1.Time) {
	p, _ := prev.(*inference.InferencePoolExport)
	imports.CarryExportTransitionTimes(p, next.(*inference.InferencePoolExport), now)
}

// Describe names the resource for the API machinery.
func Describe() virtual.Describe {
	return virtual.Describe{
		Resource:       inference.Resource("inferencepoolexports"),
		Kind:           "InferencePoolExport",
		SingularName:   "inferencepoolexport",
		ShortNames:     []string{"ipexp"},
		ReadOnlyReason: "computed from the export annotations of the InferencePool of the same name: edit the InferencePool instead",
		New:            func() virtual.Object { return &inference.InferencePoolExport{} },
		NewList:        func() runtime.Object { return &inference.InferencePoolExportList{} },
		SetItems: func(list runtime.Object, items []virtual.Object) {
			l := list.(*inference.InferencePoolExportList)
			l.Items = make([]inference.InferencePoolExport, len(items))
			for i, o := range items {
				l.Items[i] = *o.(*inference.InferencePoolExport)
			}
		},
		Table: table,
	}
}
