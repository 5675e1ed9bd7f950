// Package inferencepoolexportsummary serves InferencePoolExportSummaries:
// what the servers of other clusters read of this cluster's valid exports,
// instead of watching its InferencePools, Services, EndpointSlices and
// Gateways.
package inferencepoolexportsummary

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

// Resource derives InferencePoolExportSummaries from the local cluster.
type Resource struct {
	Index PoolIndex
}

// PoolIndex finds the local pools a Service or Gateway change affects.
type PoolIndex interface {
	LocalName() string
	PoolsUsingService(member, namespace, service string) []string
	PoolsWithParent(member, namespace, gateway string) []string
}

var _ virtual.Resource = Resource{}

// Compute implements virtual.Resource.
func (Resource) Compute(cs imports.ClusterSet, namespace, name string) (virtual.Object, bool) {
	return virtual.One(imports.ExportSummary(cs, namespace, name))
}

// ComputeNamespace implements virtual.Resource.
func (Resource) ComputeNamespace(cs imports.ClusterSet, namespace string) []virtual.Object {
	return virtual.All(imports.ExportSummaries(cs, namespace))
}

// Affected implements virtual.Resource. A summary depends on the local
// cluster alone: its pool, the pool's EPP Service and its EndpointSlices,
// its parent Gateways and the BackendTLSPolicies of its namespace. Events
// of other members change nothing, and Notify must not be given them
// (LocalEvents): they would move the version of objects they cannot change.
func (r Resource) Affected(ev clusterset.Event) virtual.Dirty {
	local := r.Index.LocalName()
	if ev.Member != local {
		return virtual.Dirty{}
	}
	switch ev.Kind {
	case clusterset.KindInferencePool:
		return virtual.Dirty{Keys: []string{ev.Namespace + "/" + ev.Name}}
	case clusterset.KindService:
		return virtual.Dirty{Keys: r.Index.PoolsUsingService(local, ev.Namespace, ev.Name)}
	case clusterset.KindEndpointSlice:
		if ev.Service == "" {
			return virtual.Dirty{}
		}
		return virtual.Dirty{Keys: r.Index.PoolsUsingService(local, ev.Namespace, ev.Service)}
	case clusterset.KindGateway:
		return virtual.Dirty{Keys: r.Index.PoolsWithParent(local, ev.Namespace, ev.Name)}
	case clusterset.KindBackendTLSPolicy, clusterset.KindPod:
		// A pod's address may be one a pool of its namespace publishes.
		return virtual.Dirty{Namespaces: []string{ev.Namespace}}
	case clusterset.KindNamespace, clusterset.KindHTTPRoute, clusterset.KindReferenceGrant:
		return virtual.Dirty{}
	}
	return virtual.Dirty{All: true}
}

// CarryTransitionTimes implements virtual.Resource.
func (Resource) CarryTransitionTimes(prev, next virtual.Object, now metav1.Time) {
	p, _ := prev.(*inference.InferencePoolExportSummary)
	imports.CarrySummaryTransitionTimes(p, next.(*inference.InferencePoolExportSummary), now)
}

// Describe names the resource for the API machinery.
func Describe() virtual.Describe {
	return virtual.Describe{
		Resource:       inference.Resource("inferencepoolexportsummaries"),
		Kind:           "InferencePoolExportSummary",
		SingularName:   "inferencepoolexportsummary",
		ShortNames:     []string{"ipexpsum"},
		ReadOnlyReason: "computed from the exported InferencePool of the same name and its EPP Service or parent Gateways: edit those instead",
		New:            func() virtual.Object { return &inference.InferencePoolExportSummary{} },
		NewList:        func() runtime.Object { return &inference.InferencePoolExportSummaryList{} },
		SetItems: func(list runtime.Object, items []virtual.Object) {
			l := list.(*inference.InferencePoolExportSummaryList)
			l.Items = make([]inference.InferencePoolExportSummary, len(items))
			for i, o := range items {
				l.Items[i] = *o.(*inference.InferencePoolExportSummary)
			}
		},
		Table: table,
	}
}

var columns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "Name of the exported InferencePool."},
	{Name: "Mode", Type: "string", Description: "Routing mode of the export."},
	{Name: "Ready", Type: "string", Description: "Whether the EPP (or a parent Gateway) can take traffic."},
	{Name: "Age", Type: "string", Description: "Age of the InferencePool."},
}

// table is the resource's `kubectl get` table.
var table = virtual.Table{Columns: columns, Row: func(obj runtime.Object, name, age string) []interface{} {
	s := obj.(*inference.InferencePoolExportSummary)
	return []interface{}{name, string(s.Status.RoutingMode), virtual.ConditionStatus(s.Status.Conditions, v1alpha1.ConditionReady), age}
}}
