// Package inferencepoolimport serves InferencePoolImports: read-only
// objects computed from the InferencePools that other clusters of the
// ClusterSet export.
package inferencepoolimport

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

// PoolIndex finds the pools a Service or Gateway change affects.
type PoolIndex interface {
	LocalName() string
	PoolsUsingService(member, namespace, service string) []string
	PoolsWithParent(member, namespace, gateway string) []string
	// ImportsRoutedThrough: the imports used by local HTTPRoutes whose
	// parent is the local Gateway namespace/gateway.
	ImportsRoutedThrough(namespace, gateway string) []string
	// ImportsRoutedFrom: the imports used by the local HTTPRoutes of
	// namespace.
	ImportsRoutedFrom(namespace string) []string
}

// Resource derives InferencePoolImports from the ClusterSet.
type Resource struct {
	Index PoolIndex
}

var _ virtual.Resource = Resource{}

// Compute implements virtual.Resource.
func (Resource) Compute(cs imports.ClusterSet, namespace, name string) (virtual.Object, bool) {
	return virtual.One(imports.Import(cs, namespace, name))
}

// ComputeNamespace implements virtual.Resource.
func (Resource) ComputeNamespace(cs imports.ClusterSet, namespace string) []virtual.Object {
	return virtual.All(imports.Imports(cs, namespace))
}

// Affected implements virtual.Resource. An import is keyed by its pool's
// namespace/name, so a pool change touches one import, a Service or
// EndpointSlice change the imports of the pools whose EPP it is, a
// Gateway change the pools it parents (and, in the local cluster, the
// imports its routes use), an HTTPRoute change the imports it used before
// and after, a ReferenceGrant or BackendTLSPolicy change every import of its
// namespace, and a local namespace change every import of that namespace
// and those its routes use (its labels decide whether a listener's
// namespace selector takes them).
func (r Resource) Affected(ev clusterset.Event) virtual.Dirty {
	switch ev.Kind {
	case clusterset.KindInferencePool, clusterset.KindExportSummary:
		return virtual.Dirty{Keys: []string{ev.Namespace + "/" + ev.Name}}
	case clusterset.KindService:
		return virtual.Dirty{Keys: r.Index.PoolsUsingService(ev.Member, ev.Namespace, ev.Name)}
	case clusterset.KindEndpointSlice:
		if ev.Service == "" {
			return virtual.Dirty{}
		}
		return virtual.Dirty{Keys: r.Index.PoolsUsingService(ev.Member, ev.Namespace, ev.Service)}
	case clusterset.KindGateway:
		keys := r.Index.PoolsWithParent(ev.Member, ev.Namespace, ev.Name)
		if ev.Member == r.Index.LocalName() {
			keys = append(keys, r.Index.ImportsRoutedThrough(ev.Namespace, ev.Name)...)
		}
		return virtual.Dirty{Keys: keys}
	case clusterset.KindHTTPRoute:
		return virtual.Dirty{Keys: ev.Imports}
	// A BackendTLSPolicy names Services of its own namespace; it changes
	// rarely, so every import of the namespace is recomputed.
	case clusterset.KindReferenceGrant, clusterset.KindBackendTLSPolicy:
		return virtual.Dirty{Namespaces: []string{ev.Namespace}}
	// A pod's address may be one its pool publishes: the events carry
	// no labels to tell which pool selects it, so every import of the
	// namespace is recomputed (an unchanged import sends no event).
	case clusterset.KindPod:
		return virtual.Dirty{Namespaces: []string{ev.Namespace}}
	case clusterset.KindNamespace:
		if ev.Member == r.Index.LocalName() {
			return virtual.Dirty{Namespaces: []string{ev.Namespace}, Keys: r.Index.ImportsRoutedFrom(ev.Namespace)}
		}
		return virtual.Dirty{}
	}
	return virtual.Dirty{All: true}
}

// CarryTransitionTimes implements virtual.Resource.
func (Resource) CarryTransitionTimes(prev, next virtual.Object, now metav1.Time) {
	p, _ := prev.(*inference.InferencePoolImport)
	imports.CarryTransitionTimes(p, next.(*inference.InferencePoolImport), now)
}

// Describe names the resource for the API machinery.
func Describe() virtual.Describe {
	return virtual.Describe{
		Resource:       inference.Resource("inferencepoolimports"),
		Kind:           "InferencePoolImport",
		SingularName:   "inferencepoolimport",
		ShortNames:     []string{"ipimp", "infpimp"},
		ReadOnlyReason: "computed from the InferencePools that other clusters of the ClusterSet export: annotate an InferencePool with inference.networking.x-k8s.io/export=ClusterSet in an exporting cluster instead",
		New:            func() virtual.Object { return &inference.InferencePoolImport{} },
		NewList:        func() runtime.Object { return &inference.InferencePoolImportList{} },
		SetItems: func(list runtime.Object, items []virtual.Object) {
			l := list.(*inference.InferencePoolImportList)
			l.Items = make([]inference.InferencePoolImport, len(items))
			for i, o := range items {
				l.Items[i] = *o.(*inference.InferencePoolImport)
			}
		},
		Table: table,
	}
}
