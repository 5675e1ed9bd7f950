package routetable

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// Gateway API's reasons for a route that is not attached to a parent
// (RouteConditionReason of the Accepted condition).
const (
	ReasonNotAllowedByListeners      = string(gatewayv1.RouteReasonNotAllowedByListeners)
	ReasonNoMatchingListenerHostname = string(gatewayv1.RouteReasonNoMatchingListenerHostname)
	ReasonNoMatchingParent           = string(gatewayv1.RouteReasonNoMatchingParent)
)

// httpRouteKind is the kind of the routes the sidecar serves, as listeners'
// allowedRoutes.kinds and ReferenceGrants' from name it.
const httpRouteKind = "HTTPRoute"

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

// refusalRank orders the reasons of a refused route: when several listeners
// refuse it, the reason of the one that came closest to accepting it wins.
var refusalRank = map[string]int{ReasonNoMatchingParent: 0, ReasonNotAllowedByListeners: 1, ReasonNoMatchingListenerHostname: 2}

// attachment is what a route's parentRefs to the served Gateways give.
type attachment struct {
	// named is true when the route names a served Gateway at all; routes
	// that do not are none of the sidecar's business and are not reported.
	named bool
	// accepted is true when at least one selected listener allows it.
	accepted bool
	// hostnames are the hostnames the route is served for: the
	// intersections of its hostnames with those of the listeners that
	// accept it; "" stands for any hostname.
	hostnames []string
	// reason and why say why the route is not accepted.
	reason string
	why    []string
}

// attach decides whether a route attaches to the sidecar's Gateways, as
// Gateway API defines it: a parentRef selects the listeners of its Gateway
// whose name is its sectionName and whose port is its port (each when
// set); a selected listener accepts the route when its allowedRoutes allow
// the route's kind and namespace and, when both have hostnames, they
// intersect. A route attaches when at least one listener accepts it.
func (b *builder) attach(r *gatewayv1.HTTPRoute) attachment {
	var a attachment
	keys, refs := servedParents(r, b.in.ServedGateways)
	a.named = len(keys) > 0
	refuse := func(reason, format string, args ...any) {
		if a.reason == "" || refusalRank[reason] > refusalRank[a.reason] {
			a.reason = reason
		}
		a.why = append(a.why, fmt.Sprintf(format, args...))
	}
	seen := map[string]bool{}
	for _, k := range keys {
		gw := b.gateways[k]
		if gw == nil {
			refuse(ReasonNoMatchingParent, "Gateway %s does not exist", k)
			continue
		}
		for _, p := range refs[k] {
			selected := 0
			for _, l := range gw.Spec.Listeners {
				if p.SectionName != nil && *p.SectionName != l.Name {
					continue
				}
				if p.Port != nil && *p.Port != l.Port {
					continue
				}
				selected++
				hosts, reason, why := b.listenerAccepts(gw, l, r)
				if reason != "" {
					refuse(reason, "Gateway %s listener %s: %s", k, l.Name, why)
					continue
				}
				a.accepted = true
				for _, h := range hosts {
					if !seen[h] {
						seen[h] = true
						a.hostnames = append(a.hostnames, h)
					}
				}
			}
			if selected == 0 {
				refuse(ReasonNoMatchingParent, "Gateway %s has no listener%s", k, parentSelector(p))
			}
		}
	}
	if seen[""] {
		// One listener serves the route for any hostname: the others'
		// narrower hostnames add nothing.
		a.hostnames = []string{""}
	}
	return a
}

// parentSelector renders the listener a parentRef selects.
func parentSelector(p gatewayv1.ParentReference) string {
	var parts []string
	if p.SectionName != nil {
		parts = append(parts, fmt.Sprintf("named %q", *p.SectionName))
	}
	if p.Port != nil {
		parts = append(parts, fmt.Sprintf("on port %d", *p.Port))
	}
	if len(parts) == 0 {
		return "s"
	}
	return " " + strings.Join(parts, " ")
}

// listenerAccepts decides whether one listener accepts the route and, if
// it does, for which hostnames; otherwise it returns the reason and why.
func (b *builder) listenerAccepts(gw *gatewayv1.Gateway, l gatewayv1.Listener, r *gatewayv1.HTTPRoute) (hostnames []string, reason, why string) {
	allowed := l.AllowedRoutes
	if !allowsHTTPRoutes(l, allowed) {
		return nil, ReasonNotAllowedByListeners, fmt.Sprintf("HTTPRoutes are not among its allowed kinds (protocol %s)", l.Protocol)
	}
	from := gatewayv1.NamespacesFromSame
	var selector *v1.LabelSelector
	if allowed != nil && allowed.Namespaces != nil {
		if allowed.Namespaces.From != nil {
			from = *allowed.Namespaces.From
		}
		selector = allowed.Namespaces.Selector
	}
	switch from {
	case gatewayv1.NamespacesFromAll:
	case gatewayv1.NamespacesFromSame:
		if r.Namespace != gw.Namespace {
			return nil, ReasonNotAllowedByListeners, fmt.Sprintf("routes of namespace %s are not allowed (allowedRoutes.namespaces.from is Same: only namespace %s)", r.Namespace, gw.Namespace)
		}
	case gatewayv1.NamespacesFromSelector:
		if selector == nil {
			return nil, ReasonNotAllowedByListeners, "allowedRoutes.namespaces.from is Selector without a selector: no namespace is allowed"
		}
		sel, err := v1.LabelSelectorAsSelector(selector)
		if err != nil {
			return nil, ReasonNotAllowedByListeners, fmt.Sprintf("allowedRoutes.namespaces.selector is invalid (%v): no namespace is allowed", err)
		}
		if !sel.Matches(labels.Set(b.nsLabels[r.Namespace])) {
			return nil, ReasonNotAllowedByListeners, fmt.Sprintf("the labels of namespace %s do not match allowedRoutes.namespaces.selector %q", r.Namespace, sel)
		}
	default:
		return nil, ReasonNotAllowedByListeners, fmt.Sprintf("routes of namespace %s are not allowed (allowedRoutes.namespaces.from is %s)", r.Namespace, from)
	}
	hostnames = intersectHostnames(l.Hostname, r.Spec.Hostnames)
	if len(hostnames) == 0 {
		return nil, ReasonNoMatchingListenerHostname, fmt.Sprintf("none of the route's hostnames %v is within the listener's hostname %s", r.Spec.Hostnames, *l.Hostname)
	}
	return hostnames, "", ""
}

// allowsHTTPRoutes reports whether a listener allows HTTPRoutes: those of
// its allowedRoutes.kinds (a kind's group defaulting to Gateway API's), or,
// when it lists none, those its protocol carries (HTTP and HTTPS).
func allowsHTTPRoutes(l gatewayv1.Listener, allowed *gatewayv1.AllowedRoutes) bool {
	if allowed == nil || len(allowed.Kinds) == 0 {
		return l.Protocol == gatewayv1.HTTPProtocolType || l.Protocol == gatewayv1.HTTPSProtocolType
	}
	return slices.ContainsFunc(allowed.Kinds, func(k gatewayv1.RouteGroupKind) bool {
		group := gatewayv1.GroupName
		if k.Group != nil {
			group = string(*k.Group)
		}
		return group == gatewayv1.GroupName && k.Kind == httpRouteKind
	})
}

// intersectHostnames returns the hostnames a route is served for through a
// listener: every route hostname when the listener has none ("" when the
// route has none either), the listener's when the route has none, else
// each intersection of a route hostname with the listener's, the more
// specific of the two (a wildcard "*.example.com" covers
// "a.example.com" and "*.a.example.com", never "example.com").
func intersectHostnames(listener *gatewayv1.Hostname, route []gatewayv1.Hostname) []string {
	lh := ""
	if listener != nil {
		lh = strings.ToLower(string(*listener))
	}
	if len(route) == 0 {
		return []string{lh}
	}
	var out []string
	for _, h := range route {
		rh := strings.ToLower(string(h))
		var got string
		switch {
		case lh == "" || rh == lh:
			got = rh
		case covers(lh, rh):
			got = rh
		case covers(rh, lh):
			got = lh
		default:
			continue
		}
		if !slices.Contains(out, got) {
			out = append(out, got)
		}
	}
	return out
}

// covers reports whether wildcard hostname w ("*.suffix") covers h: h is
// a hostname or wildcard of at least one more label ending in ".suffix".
func covers(w, h string) bool {
	suffix, ok := strings.CutPrefix(w, "*")
	if !ok || !strings.HasPrefix(suffix, ".") {
		return false
	}
	return strings.HasSuffix(h, suffix) && len(h) > len(suffix) && h != w
}

// referenceGranted reports whether a ReferenceGrant of the target's
// namespace allows HTTPRoutes of namespace from to refer to the target
// (group, kind, name).
func (b *builder) referenceGranted(from, group, kind string, target types.NamespacedName) bool {
	for _, g := range b.grants[target.Namespace] {
		if grantAllows(g, from, group, kind, target.Name) {
			return true
		}
	}
	return false
}

func grantAllows(g *gatewayv1beta1.ReferenceGrant, from, group, kind, name string) bool {
	fromOK := slices.ContainsFunc(g.Spec.From, func(f gatewayv1beta1.ReferenceGrantFrom) bool {
		return string(f.Group) == gatewayv1.GroupName && string(f.Kind) == httpRouteKind && string(f.Namespace) == from
	})
	return fromOK && slices.ContainsFunc(g.Spec.To, func(t gatewayv1beta1.ReferenceGrantTo) bool {
		return string(t.Group) == group && string(t.Kind) == kind && (t.Name == nil || *t.Name == "" || string(*t.Name) == name)
	})
}
