// Package gatewayattach holds Gateway API's attachment rules for an
// HTTPRoute: which listeners of a Gateway a parentRef selects, whether a
// listener accepts the route (allowedRoutes kinds and namespaces, hostnames)
// and whether a ReferenceGrant permits a reference across namespaces.
//
// It is pure: callers pass the objects their caches hold. mci-sidecar uses
// it to decide which routes its Gateway serves, mci-apiserver to compute the
// Accepted and ResolvedRefs conditions of an import's parents, so that both
// read the rules alike.
package gatewayattach

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Gateway API's reasons for a route that is not attached to a parent (the
// RouteConditionReason of its Accepted condition).
const (
	ReasonNotAllowedByListeners      = string(gatewayv1.RouteReasonNotAllowedByListeners)
	ReasonNoMatchingListenerHostname = string(gatewayv1.RouteReasonNoMatchingListenerHostname)
	ReasonNoMatchingParent           = string(gatewayv1.RouteReasonNoMatchingParent)
)

// httpRouteKind is the kind of the routes these rules are for, as
// listeners' allowedRoutes.kinds and ReferenceGrants' from name it.
const httpRouteKind = "HTTPRoute"

// NamespaceLabels gives the labels of a namespace of the route's cluster,
// which a listener's allowedRoutes namespace selector is matched against
// (nil for a namespace that is not known: it matches only an empty
// selector).
type NamespaceLabels func(namespace string) map[string]string

// refusalRank orders the reasons of a refusal: when several listeners
// refuse a route, the reason of the one that came closest to accepting it
// is the route's.
var refusalRank = map[string]int{ReasonNoMatchingParent: 0, ReasonNotAllowedByListeners: 1, ReasonNoMatchingListenerHostname: 2}

// Attachment is what a route's parentRefs to Gateways give it.
type Attachment struct {
	// Accepted is true when at least one selected listener accepts it.
	Accepted bool
	// Hostnames are those the route is served for: the intersections of
	// its hostnames with those of the listeners that accept it, without
	// duplicates; "" stands for any hostname, and is then the only one.
	Hostnames []string
	// Reason is the refusal of the listener that came closest to
	// accepting the route; Why says, per refusal, what refused it.
	Reason string
	Why    []string
}

// Refuse records a refusal.
func (a *Attachment) Refuse(reason, why string) {
	if a.Reason == "" || refusalRank[reason] > refusalRank[a.Reason] {
		a.Reason = reason
	}
	a.Why = append(a.Why, why)
}

// Attach adds what the parentRef ref of route to gw gives, as Gateway API
// defines it: ref selects the listeners whose name is its sectionName and
// whose port is its port (each when set); a selected listener accepts the
// route when its allowedRoutes allow the route's kind and namespace and,
// when both have hostnames, they intersect. A route attaches when one
// listener accepts it. Refusals are prefixed with the Gateway's name.
func (a *Attachment) Attach(gw *gatewayv1.Gateway, ref gatewayv1.ParentReference, route *gatewayv1.HTTPRoute, nsLabels NamespaceLabels) {
	gwName := gw.Namespace + "/" + gw.Name
	selected := 0
	for _, l := range gw.Spec.Listeners {
		if !selects(ref, l) {
			continue
		}
		selected++
		hosts, reason, why := listenerAccepts(gw, l, route, nsLabels)
		if reason != "" {
			a.Refuse(reason, fmt.Sprintf("Gateway %s listener %s: %s", gwName, l.Name, why))
			continue
		}
		a.Accepted = true
		for _, h := range hosts {
			if !slices.Contains(a.Hostnames, h) {
				a.Hostnames = append(a.Hostnames, h)
			}
		}
	}
	if selected == 0 {
		a.Refuse(ReasonNoMatchingParent, fmt.Sprintf("Gateway %s has no listener%s", gwName, parentSelector(ref)))
	}
	if slices.Contains(a.Hostnames, "") {
		// One listener serves the route for any hostname: the others'
		// narrower hostnames add nothing.
		a.Hostnames = []string{""}
	}
}

// selects reports whether parentRef ref selects listener l: by its
// sectionName and its port, each when set.
func selects(ref gatewayv1.ParentReference, l gatewayv1.Listener) bool {
	return (ref.SectionName == nil || *ref.SectionName == l.Name) && (ref.Port == nil || *ref.Port == l.Port)
}

// parentSelector renders the listeners a parentRef selects.
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

// listenerAccepts decides whether listener l of gw accepts route and, if it
// does, for which hostnames; otherwise it returns the reason and why.
func listenerAccepts(gw *gatewayv1.Gateway, l gatewayv1.Listener, route *gatewayv1.HTTPRoute, nsLabels NamespaceLabels) (hostnames []string, reason, why string) {
	allowed := l.AllowedRoutes
	if !allowsHTTPRoutes(l) {
		return nil, ReasonNotAllowedByListeners, fmt.Sprintf("HTTPRoutes are not among its allowed kinds (protocol %s)", l.Protocol)
	}
	from := gatewayv1.NamespacesFromSame
	var selector *metav1.LabelSelector
	if allowed != nil && allowed.Namespaces != nil {
		if allowed.Namespaces.From != nil {
			from = *allowed.Namespaces.From
		}
		selector = allowed.Namespaces.Selector
	}
	switch from {
	case gatewayv1.NamespacesFromAll:
	case gatewayv1.NamespacesFromSame:
		if route.Namespace != gw.Namespace {
			return nil, ReasonNotAllowedByListeners, fmt.Sprintf("routes of namespace %s are not allowed (allowedRoutes.namespaces.from is Same: only namespace %s)", route.Namespace, gw.Namespace)
		}
	case gatewayv1.NamespacesFromSelector:
		if selector == nil {
			return nil, ReasonNotAllowedByListeners, "allowedRoutes.namespaces.from is Selector without a selector: no namespace is allowed"
		}
		sel, err := metav1.LabelSelectorAsSelector(selector)
		if err != nil {
			return nil, ReasonNotAllowedByListeners, fmt.Sprintf("allowedRoutes.namespaces.selector is invalid (%v): no namespace is allowed", err)
		}
		var nsl map[string]string
		if nsLabels != nil {
			nsl = nsLabels(route.Namespace)
		}
		if !sel.Matches(labels.Set(nsl)) {
			return nil, ReasonNotAllowedByListeners, fmt.Sprintf("the labels of namespace %s do not match allowedRoutes.namespaces.selector %q", route.Namespace, sel)
		}
	default:
		return nil, ReasonNotAllowedByListeners, fmt.Sprintf("routes of namespace %s are not allowed (allowedRoutes.namespaces.from is %s)", route.Namespace, from)
	}
	hostnames = intersectHostnames(l.Hostname, route.Spec.Hostnames)
	if len(hostnames) == 0 {
		return nil, ReasonNoMatchingListenerHostname, fmt.Sprintf("none of the route's hostnames %v is within the listener's hostname %s", route.Spec.Hostnames, *l.Hostname)
	}
	return hostnames, "", ""
}

// allowsHTTPRoutes reports whether a listener allows HTTPRoutes: those of
// its allowedRoutes.kinds (a kind's group defaulting to Gateway API's), or,
// when it lists none, those its protocol carries (HTTP and HTTPS).
func allowsHTTPRoutes(l gatewayv1.Listener) bool {
	if l.AllowedRoutes == nil || len(l.AllowedRoutes.Kinds) == 0 {
		return l.Protocol == gatewayv1.HTTPProtocolType || l.Protocol == gatewayv1.HTTPSProtocolType
	}
	return slices.ContainsFunc(l.AllowedRoutes.Kinds, func(k gatewayv1.RouteGroupKind) bool {
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
// specific of the two (a wildcard "*.example.com" covers "a.example.com"
// and "*.a.example.com", never "example.com"). Hostnames compare without
// regard to case.
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

// GrantAllows reports whether a ReferenceGrant (its spec; the grant lives
// in the target's namespace) allows HTTPRoutes of namespace from to refer
// to the target of group, kind and name: a To without a name allows every
// object of its group and kind.
func GrantAllows(g gatewayv1.ReferenceGrantSpec, from, group, kind, name string) bool {
	fromOK := slices.ContainsFunc(g.From, func(f gatewayv1.ReferenceGrantFrom) bool {
		return string(f.Group) == gatewayv1.GroupName && string(f.Kind) == httpRouteKind && string(f.Namespace) == from
	})
	return fromOK && slices.ContainsFunc(g.To, func(t gatewayv1.ReferenceGrantTo) bool {
		return string(t.Group) == group && string(t.Kind) == kind && (t.Name == nil || *t.Name == "" || string(*t.Name) == name)
	})
}
