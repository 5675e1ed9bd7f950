package imports

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/gatewayattach"
)

// An import's status.controllers[].parents lists the local cluster's parents
// (Gateways) of the HTTPRoutes that use the import as a backendRef, as the
// upstream multi-cluster proposal (GIE 1374) asks of the importing side,
// with the two conditions of the upstream InferencePool ParentStatus:
//
//   - Accepted: the route's parentRef names a Gateway that this cluster has
//     and that takes the route by Gateway API's attachment rules
//     (pkg/gatewayattach, which mci-sidecar applies too): some listener
//     that the parentRef selects (by sectionName and port, when set)
//     allows HTTPRoutes from the route's namespace (allowedRoutes: kinds,
//     and namespaces Same, the default, All, or a Selector matched against
//     the labels of the route's namespace) and shares a hostname with the
//     route; and the route's status does not report that the parent's
//     controller rejected it.
//   - ResolvedRefs: the backendRef is permitted (same namespace as the
//     import, or a ReferenceGrant in the import's namespace allows
//     HTTPRoutes of the route's namespace to refer to InferencePoolImports)
//     and names this import, which exists (it is being served).
//
// Several routes may reach an import through one parent: the parent is
// listed once, Accepted when at least one of them is accepted there, and
// ResolvedRefs only when every one of them resolves, so that a broken route
// is never hidden behind a working one.

// importBackendGroup and importBackendKind are how an HTTPRoute backendRef
// names an InferencePoolImport.
const (
	importBackendGroup = v1alpha1.GroupName
	importBackendKind  = "InferencePoolImport"
	gatewayKind        = "Gateway"
)

// RouteIndex finds the local cluster's HTTPRoutes that use an import as a
// backendRef (see ImportBackendRefs). Routes returned are shared with the
// cache: read them, never change them.
type RouteIndex interface {
	RoutesToImport(namespace, name string) ([]*gatewayv1.HTTPRoute, error)
}

// RoutesByImportIndex names the HTTPRoute informer index that NewRouteIndex
// reads: ImportBackendRefs of each route.
const RoutesByImportIndex = "importBackendRef"

// RoutesByImport is the index function of RoutesByImportIndex.
func RoutesByImport(obj any) ([]string, error) {
	route, ok := obj.(*gatewayv1.HTTPRoute)
	if !ok {
		return nil, nil
	}
	return ImportBackendRefs(route), nil
}

// NewRouteIndex reads the routes of an import from an indexer of HTTPRoutes
// that has the RoutesByImportIndex index.
func NewRouteIndex(indexer cache.Indexer) RouteIndex { return indexedRoutes{indexer: indexer} }

type indexedRoutes struct{ indexer cache.Indexer }

func (r indexedRoutes) RoutesToImport(namespace, name string) ([]*gatewayv1.HTTPRoute, error) {
	objs, err := r.indexer.ByIndex(RoutesByImportIndex, namespace+"/"+name)
	if err != nil {
		return nil, fmt.Errorf("listing the HTTPRoutes of InferencePoolImport %s/%s: %w", namespace, name, err)
	}
	out := make([]*gatewayv1.HTTPRoute, 0, len(objs))
	for _, o := range objs {
		if route, ok := o.(*gatewayv1.HTTPRoute); ok {
			out = append(out, route)
		}
	}
	return out, nil
}

// ImportBackendRefs returns the namespace/name keys of the InferencePoolImports
// that route names as backendRefs (a backendRef without namespace refers to
// the route's own), without duplicates, in order of appearance. Any group or
// kind other than inference.networking.x-k8s.io/InferencePoolImport is not
// an import: Gateway API defaults an omitted group to the core group and an
// omitted kind to Service.
func ImportBackendRefs(route *gatewayv1.HTTPRoute) []string {
	if route == nil {
		return nil
	}
	var out []string
	for _, rule := range route.Spec.Rules {
		for _, ref := range rule.BackendRefs {
			if !IsImportBackendRef(ref.BackendObjectReference) {
				continue
			}
			key := refNamespace(ref.Namespace, route.Namespace) + "/" + string(ref.Name)
			if !slices.Contains(out, key) {
				out = append(out, key)
			}
		}
	}
	return out
}

// IsImportBackendRef says whether a backendRef names an InferencePoolImport.
func IsImportBackendRef(ref gatewayv1.BackendObjectReference) bool {
	return ref.Group != nil && string(*ref.Group) == importBackendGroup &&
		ref.Kind != nil && string(*ref.Kind) == importBackendKind && ref.Name != ""
}

func refNamespace(ns *gatewayv1.Namespace, defaultNamespace string) string {
	if ns == nil || *ns == "" {
		return defaultNamespace
	}
	return string(*ns)
}

// parentKey identifies a parent of a route, defaults applied.
type parentKey struct {
	group, kind, namespace, name string
}

func (k parentKey) String() string {
	if k.group == gatewayv1.GroupName && k.kind == gatewayKind {
		return k.namespace + "/" + k.name
	}
	kind := k.kind
	if k.group != "" {
		kind += "." + k.group
	}
	return kind + " " + k.namespace + "/" + k.name
}

func parentKeyOf(ref gatewayv1.ParentReference, routeNamespace string) parentKey {
	k := parentKey{group: gatewayv1.GroupName, kind: gatewayKind, namespace: refNamespace(ref.Namespace, routeNamespace), name: string(ref.Name)}
	if ref.Group != nil {
		k.group = string(*ref.Group)
	}
	if ref.Kind != nil {
		k.kind = string(*ref.Kind)
	}
	return k
}

// parentVerdicts collects, for one parent, the verdicts of every route that
// reaches the import through it.
type parentVerdicts struct {
	// accepted and resolved name the routes the parent takes and whose
	// backendRef resolves.
	accepted, resolved []string
	// refusal and unresolved are the first route's reasons against, kept
	// when no route (refusal) or not every route (unresolved) passes.
	refusal, unresolved *verdict
}

// importParents computes the parents entries of import key from the local
// member's routes, sorted by parent namespace, name, group and kind. nil when
// no route uses the import (or the member has no route index).
func importParents(local *Member, key poolKey) []inference.ParentStatus {
	routes := routesToImport(local, key)
	if len(routes) == 0 {
		return nil
	}
	byParent, order := verdictsByParent(local, routes, key)
	if len(order) == 0 {
		return nil
	}
	slices.SortFunc(order, func(a, b parentKey) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name), cmp.Compare(a.group, b.group), cmp.Compare(a.kind, b.kind))
	})
	out := make([]inference.ParentStatus, 0, len(order))
	for _, pk := range order {
		out = append(out, parentStatus(pk, byParent[pk]))
	}
	return out
}

// routesToImport returns the local routes that the route index files under
// import key, sorted by namespace and name.
func routesToImport(local *Member, key poolKey) []*gatewayv1.HTTPRoute {
	if local == nil || local.Routes == nil {
		return nil
	}
	// An error here means the index is missing, which member start-up
	// logs; parents are then empty rather than wrong.
	routes, err := local.Routes.RoutesToImport(key.namespace, key.name)
	if err != nil || len(routes) == 0 {
		return nil
	}
	routes = slices.Clone(routes)
	slices.SortFunc(routes, func(a, b *gatewayv1.HTTPRoute) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return routes
}

// verdictsByParent gathers, for each parent the routes name, which routes
// it accepts and which resolve the import, in the order the parents are
// first named.
func verdictsByParent(local *Member, routes []*gatewayv1.HTTPRoute, key poolKey) (map[parentKey]*parentVerdicts, []parentKey) {
	byParent := map[parentKey]*parentVerdicts{}
	var order []parentKey
	for _, route := range routes {
		if !slices.Contains(ImportBackendRefs(route), key.namespace+"/"+key.name) {
			continue // an index out of step with the route; the route decides
		}
		resolved := backendRefVerdict(local, route, key)
		routeName := route.Namespace + "/" + route.Name
		for _, ref := range route.Spec.ParentRefs {
			pk := parentKeyOf(ref, route.Namespace)
			if pk.name == "" {
				continue
			}
			pv, ok := byParent[pk]
			if !ok {
				pv = &parentVerdicts{}
				byParent[pk] = pv
				order = append(order, pk)
			}
			if v := acceptedVerdict(local, route, ref, pk); v.ok {
				pv.accepted = appendUnique(pv.accepted, routeName)
			} else if pv.refusal == nil {
				pv.refusal = &v
			}
			if resolved.ok {
				pv.resolved = appendUnique(pv.resolved, routeName)
			} else if pv.unresolved == nil {
				pv.unresolved = &resolved
			}
		}
	}
	return byParent, order
}

// parentStatus is the parents entry of parent pk: Accepted when it accepts
// a route, ResolvedRefs when every route's backendRef resolves, else the
// first route's reason against.
func parentStatus(pk parentKey, pv *parentVerdicts) inference.ParentStatus {
	var accepted, resolved verdict
	if len(pv.accepted) > 0 {
		accepted = verdict{
			ok:      true,
			reason:  v1alpha1.ReasonAccepted,
			message: fmt.Sprintf("%s %s accepts %s %s", pk.kind, pk, pluralRoutes(pv.accepted), strings.Join(pv.accepted, ", ")),
		}
	} else {
		accepted = *pv.refusal
	}
	if pv.unresolved == nil {
		resolved = verdict{
			ok:      true,
			reason:  v1alpha1.ReasonResolvedRefs,
			message: fmt.Sprintf("%s %s refer%s to this InferencePoolImport", pluralRoutes(pv.resolved), strings.Join(pv.resolved, ", "), singularS(len(pv.resolved))),
		}
	} else {
		resolved = *pv.unresolved
	}
	group := pk.group
	return inference.ParentStatus{
		ParentRef:      inference.ParentReference{Group: &group, Kind: pk.kind, Namespace: pk.namespace, Name: pk.name},
		ControllerName: v1alpha1.ControllerName,
		Conditions: []metav1.Condition{
			accepted.condition(v1alpha1.ConditionAccepted, importGeneration),
			resolved.condition(v1alpha1.ConditionResolvedRefs, importGeneration),
		},
	}
}

func pluralRoutes(names []string) string {
	if len(names) == 1 {
		return "HTTPRoute"
	}
	return "HTTPRoutes"
}

func singularS(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}

// acceptedVerdict says whether parent (the parentRef ref of route, defaults
// applied in pk) takes the route, as far as this cluster's caches tell.
func acceptedVerdict(local *Member, route *gatewayv1.HTTPRoute, ref gatewayv1.ParentReference, pk parentKey) verdict {
	routeName := route.Namespace + "/" + route.Name
	if pk.group != gatewayv1.GroupName || pk.kind != gatewayKind {
		return verdict{
			reason:  v1alpha1.ReasonNotSupportedByParent,
			message: fmt.Sprintf("HTTPRoute %s names parent %s: mci routes imports only through Gateways (gateway.networking.k8s.io)", routeName, pk),
		}
	}
	gw := local.gateway(pk.namespace, pk.name)
	if gw == nil {
		return verdict{
			reason:  v1alpha1.ReasonNotSupportedByParent,
			message: fmt.Sprintf("HTTPRoute %s names Gateway %s, which does not exist in cluster %s", routeName, pk, local.Name),
		}
	}
	if c := routeParentAccepted(route, ref, pk); c != nil && c.Status == "False" {
		return verdict{
			reason:  v1alpha1.ReasonHTTPRouteNotAccepted,
			message: fmt.Sprintf("the controller of Gateway %s did not accept HTTPRoute %s: %s: %s", pk, routeName, c.Reason, c.Message),
		}
	}
	var a gatewayattach.Attachment
	a.Attach(gw, ref, route, local.namespaceLabels)
	if !a.Accepted {
		return verdict{
			reason:  v1alpha1.ReasonHTTPRouteNotAccepted,
			message: fmt.Sprintf("HTTPRoute %s does not attach to Gateway %s (%s): %s", routeName, pk, a.Reason, strings.Join(a.Why, "; ")),
		}
	}
	return verdict{ok: true, reason: v1alpha1.ReasonAccepted}
}

// routeParentAccepted is the Accepted condition that the parent's controller
// wrote for ref in the route's status, or nil.
func routeParentAccepted(route *gatewayv1.HTTPRoute, ref gatewayv1.ParentReference, pk parentKey) *metav1.Condition {
	for i := range route.Status.Parents {
		p := &route.Status.Parents[i]
		if parentKeyOf(p.ParentRef, route.Namespace) != pk || !sameSection(p.ParentRef, ref) {
			continue
		}
		return meta.FindStatusCondition(p.Conditions, string(gatewayv1.RouteConditionAccepted))
	}
	return nil
}

func sameSection(a, b gatewayv1.ParentReference) bool {
	return ptrEqual(a.SectionName, b.SectionName) && ptrEqual(a.Port, b.Port)
}

func ptrEqual[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// backendRefVerdict says whether route's backendRef to import key is
// permitted: always within one namespace, across namespaces only with a
// ReferenceGrant in the import's namespace.
func backendRefVerdict(local *Member, route *gatewayv1.HTTPRoute, key poolKey) verdict {
	routeName := route.Namespace + "/" + route.Name
	if route.Namespace == key.namespace || referenceGranted(local, route.Namespace, key) {
		return verdict{ok: true, reason: v1alpha1.ReasonResolvedRefs}
	}
	return verdict{
		reason: v1alpha1.ReasonRefNotPermitted,
		message: fmt.Sprintf("HTTPRoute %s refers to InferencePoolImport %s/%s in another namespace, and no ReferenceGrant in namespace %s allows HTTPRoutes from namespace %s to refer to it",
			routeName, key.namespace, key.name, key.namespace, route.Namespace),
	}
}

// referenceGranted applies Gateway API ReferenceGrants: one in the import's
// namespace must allow HTTPRoutes of fromNamespace to refer to
// InferencePoolImports (all of them, or this one by name).
func referenceGranted(local *Member, fromNamespace string, key poolKey) bool {
	if local.ReferenceGrants == nil {
		return false
	}
	grants, err := local.ReferenceGrants.ReferenceGrants(key.namespace).List(labels.Everything())
	if err != nil {
		return false
	}
	return slices.ContainsFunc(grants, func(g *gatewayv1beta1.ReferenceGrant) bool {
		return gatewayattach.GrantAllows(g.Spec, fromNamespace, importBackendGroup, importBackendKind, key.name)
	})
}
