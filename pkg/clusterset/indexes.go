package clusterset

import (
	"slices"

	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
)

// indexParentGateway is an index of the InferencePool informer: it lets a
// Gateway change be mapped to the pools whose status names it without
// scanning every pool. A Service change is mapped by a scan of its
// namespace's pools instead (poolsUsingService): an index of
// endpointPickerRefs holds a set per pool, as each pool has its own EPP,
// which cost every member's cache about 330 bytes per pool, a tenth of
// what mci holds per exported pool; namespaces hold few pools.
const indexParentGateway = "parentGateway"

func poolIndexers() cache.Indexers {
	return cache.Indexers{
		indexParentGateway: func(obj interface{}) ([]string, error) {
			p, ok := obj.(*poolv1.InferencePool)
			if !ok {
				return nil, nil
			}
			var keys []string
			for _, parent := range p.Status.Parents {
				// Only Gateways: mci's own Exported entry (kind
				// InferencePoolImport) names the pool, not a Gateway.
				if !isGateway(parent.ParentRef) {
					continue
				}
				ns := parent.ParentRef.Namespace
				if ns == "" {
					ns = p.Namespace
				}
				keys = append(keys, ns+"/"+parent.ParentRef.Name)
			}
			return keys, nil
		},
	}
}

// indexRouteParent indexes the local HTTPRoutes that use an import by the
// Gateways they name as parents, so that a Gateway change finds the imports
// whose parents it may change.
const indexRouteParent = "parentGateway"

func routeIndexers() cache.Indexers {
	return cache.Indexers{
		imports.RoutesByImportIndex: imports.RoutesByImport,
		indexRouteParent: func(obj interface{}) ([]string, error) {
			r, ok := obj.(*gatewayv1.HTTPRoute)
			if !ok || len(imports.ImportBackendRefs(r)) == 0 {
				return nil, nil
			}
			var keys []string
			for _, p := range r.Spec.ParentRefs {
				ns := r.Namespace
				if p.Namespace != nil && *p.Namespace != "" {
					ns = string(*p.Namespace)
				}
				keys = append(keys, ns+"/"+string(p.Name))
			}
			return keys, nil
		},
	}
}

func newNamespacedIndexer(extra cache.Indexers) cache.Indexer {
	indexers := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for k, v := range extra {
		indexers[k] = v
	}
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, indexers)
}

// importsRoutedThrough returns the namespace/name keys of the imports used by
// the member's HTTPRoutes that name Gateway namespace/gateway as a parent
// (only the local member watches routes).
func (m *member) importsRoutedThrough(namespace, gateway string) []string {
	return m.importsOfRoutes(indexRouteParent, namespace+"/"+gateway)
}

// importsRoutedFrom returns the namespace/name keys of the imports used by
// the member's HTTPRoutes of namespace.
func (m *member) importsRoutedFrom(namespace string) []string {
	return m.importsOfRoutes(cache.NamespaceIndex, namespace)
}

// importsOfRoutes returns the imports used by the routes that the route
// index indexName files under key, without duplicates.
func (m *member) importsOfRoutes(indexName, key string) []string {
	if m.routeIndexer == nil {
		return nil
	}
	objs, err := m.routeIndexer.ByIndex(indexName, key)
	if err != nil {
		return nil
	}
	var keys []string
	for _, o := range objs {
		if r, ok := o.(*gatewayv1.HTTPRoute); ok {
			for _, k := range imports.ImportBackendRefs(r) {
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
	}
	return keys
}

// poolsUsingService lists the pools of namespace whose endpointPickerRef
// names service.
func (m *member) poolsUsingService(namespace, service string) []string {
	if m.poolIndexer == nil {
		return nil // summary mode: no pools watched
	}
	objs, err := m.poolIndexer.ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		return nil
	}
	var names []string
	for _, o := range objs {
		if p, ok := o.(*poolv1.InferencePool); ok && p.Spec.EndpointPickerRef.Name == service {
			names = append(names, p.Namespace+"/"+p.Name)
		}
	}
	return names
}

// poolsIndexedBy returns the namespace/name keys of the pools of this
// member whose index value is key.
func (m *member) poolsIndexedBy(index, key string) []string {
	if m.poolIndexer == nil {
		return nil // summary mode: no pools watched
	}
	objs, err := m.poolIndexer.ByIndex(index, key)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*poolv1.InferencePool); ok {
			names = append(names, p.Namespace+"/"+p.Name)
		}
	}
	return names
}
