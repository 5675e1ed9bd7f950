// Package inferenceclustersummary serves the InferenceClusterSummary of
// this cluster: its namespaces, which the servers of other clusters read
// (instead of watching its Namespaces) to report whether it imports their
// pools.
package inferenceclustersummary

import (
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

// Resource derives the local cluster's InferenceClusterSummary.
type Resource struct {
	LocalName string
}

var _ virtual.Resource = Resource{}

// Compute implements virtual.Resource: there is one object, named after
// the local cluster.
func (r Resource) Compute(cs imports.ClusterSet, namespace, name string) (virtual.Object, bool) {
	s := imports.ClusterSummary(cs)
	if s == nil || namespace != "" || name != s.Name {
		return nil, false
	}
	return s, true
}

// ComputeNamespace implements virtual.Resource.
func (r Resource) ComputeNamespace(cs imports.ClusterSet, namespace string) []virtual.Object {
	s := imports.ClusterSummary(cs)
	if s == nil || namespace != "" {
		return nil
	}
	return []virtual.Object{s}
}

// Affected implements virtual.Resource: only a local namespace change
// moves the summary.
func (r Resource) Affected(ev clusterset.Event) virtual.Dirty {
	if ev.Member != r.LocalName {
		return virtual.Dirty{}
	}
	switch ev.Kind {
	case clusterset.KindNamespace, clusterset.KindMember:
		return virtual.Dirty{Keys: []string{"/" + r.LocalName}}
	}
	return virtual.Dirty{}
}

// CarryTransitionTimes implements virtual.Resource: the summary has no
// conditions.
func (Resource) CarryTransitionTimes(_, _ virtual.Object, _ metav1.Time) {}

// Describe names the resource for the API machinery.
func Describe() virtual.Describe {
	return virtual.Describe{
		Resource:       inference.Resource("inferenceclustersummaries"),
		Kind:           "InferenceClusterSummary",
		SingularName:   "inferenceclustersummary",
		ShortNames:     []string{"icsum"},
		ReadOnlyReason: "computed from this cluster's Namespaces",
		New:            func() virtual.Object { return &inference.InferenceClusterSummary{} },
		NewList:        func() runtime.Object { return &inference.InferenceClusterSummaryList{} },
		SetItems: func(list runtime.Object, items []virtual.Object) {
			l := list.(*inference.InferenceClusterSummaryList)
			l.Items = make([]inference.InferenceClusterSummary, len(items))
			for i, o := range items {
				l.Items[i] = *o.(*inference.InferenceClusterSummary)
			}
		},
		Table:         table,
		ClusterScoped: true,
	}
}

var columns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "Name of the cluster."},
	{Name: "Namespaces", Type: "string", Description: "How many namespaces the cluster has."},
}

// table is the resource's `kubectl get` table.
var table = virtual.Table{Columns: columns, Row: func(obj runtime.Object, name, _ string) []interface{} {
	s := obj.(*inference.InferenceClusterSummary)
	return []interface{}{name, strconv.Itoa(len(s.Status.Namespaces))}
}}
