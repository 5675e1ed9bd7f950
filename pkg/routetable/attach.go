package routetable

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/gatewayattach"
)

// Gateway API's reasons for a route that is not attached to a parent
// (RouteConditionReason of the Accepted condition).
const (
	ReasonNotAllowedByListeners      = gatewayattach.ReasonNotAllowedByListeners
	ReasonNoMatchingListenerHostname = gatewayattach.ReasonNoMatchingListenerHostname
	ReasonNoMatchingParent           = gatewayattach.ReasonNoMatchingParent
)

// servedParents returns the served Gateways that the route's parentRefs
// name (a parentRef's group and kind default to Gateway, its namespace to
// the route's), each with the parentRefs that name it, in the route's
// order.
func servedParents(r *gatewayv1.HTTPRoute, served []types.NamespacedName) ([]types.NamespacedName, map[types.NamespacedName][]gatewayv1.ParentReference) {
	var keys []types.NamespacedName
	refs := map[types.NamespacedName][]gatewayv1.ParentReference{}
	for _, p := range r.Spec.ParentRefs {
		if p.Group != nil && string(*p.Group) != gatewayv1.GroupName {
			continue
		}
		if p.Kind != nil && string(*p.Kind) != "Gateway" {
			continue
		}
		ns := r.Namespace
		if p.Namespace != nil && *p.Namespace != "" {
			ns = string(*p.Namespace)
		}
		k := types.NamespacedName{Namespace: ns, Name: string(p.Name)}
		if !slices.Contains(served, k) {
			continue
		}
		if _, ok := refs[k]; !ok {
			keys = append(keys, k)
		}
		refs[k] = append(refs[k], p)
	}
	return keys, refs
}

// attach decides whether a route attaches to the sidecar's Gateways, by
// Gateway API's rules (pkg/gatewayattach); named is true when the route
// names a served Gateway at all: routes that do not are none of the
// sidecar's business and are not reported.
func (b *builder) attach(r *gatewayv1.HTTPRoute) (a gatewayattach.Attachment, named bool) {
	keys, refs := servedParents(r, b.in.ServedGateways)
	for _, k := range keys {
		gw := b.gateways[k]
		if gw == nil {
			a.Refuse(ReasonNoMatchingParent, fmt.Sprintf("Gateway %s does not exist", k))
			continue
		}
		for _, p := range refs[k] {
			a.Attach(gw, p, r, b.namespaceLabels)
		}
	}
	return a, len(keys) > 0
}

// namespaceLabels are the labels of a namespace of the sidecar's cluster.
func (b *builder) namespaceLabels(namespace string) map[string]string { return b.nsLabels[namespace] }

// referenceGranted reports whether a ReferenceGrant of the target's
// namespace allows HTTPRoutes of namespace from to refer to the target
// (group, kind, name).
func (b *builder) referenceGranted(from, group, kind string, target types.NamespacedName) bool {
	for _, g := range b.grants[target.Namespace] {
		if gatewayattach.GrantAllows(g.Spec, from, group, kind, target.Name) {
			return true
		}
	}
	return false
}
