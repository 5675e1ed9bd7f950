package gatewayattach

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

const gatewayNamespace = "infra"

func gateway(listeners ...gatewayv1.Listener) *gatewayv1.Gateway {
	return &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: gatewayNamespace, Name: "gw"},
		Spec:       gatewayv1.GatewaySpec{Listeners: listeners},
	}
}

type listenerOption func(*gatewayv1.Listener)

func listener(name string, port int32, opts ...listenerOption) gatewayv1.Listener {
	l := gatewayv1.Listener{Name: gatewayv1.SectionName(name), Port: gatewayv1.PortNumber(port), Protocol: gatewayv1.HTTPProtocolType}
	for _, o := range opts {
		o(&l)
	}
	return l
}

func from(f gatewayv1.FromNamespaces, selector *metav1.LabelSelector) listenerOption {
	return func(l *gatewayv1.Listener) {
		if l.AllowedRoutes == nil {
			l.AllowedRoutes = &gatewayv1.AllowedRoutes{}
		}
		l.AllowedRoutes.Namespaces = &gatewayv1.RouteNamespaces{From: &f, Selector: selector}
	}
}

func kinds(k ...gatewayv1.RouteGroupKind) listenerOption {
	return func(l *gatewayv1.Listener) {
		if l.AllowedRoutes == nil {
			l.AllowedRoutes = &gatewayv1.AllowedRoutes{}
		}
		l.AllowedRoutes.Kinds = k
	}
}

func hostname(h string) listenerOption {
	return func(l *gatewayv1.Listener) { l.Hostname = ptr.To(gatewayv1.Hostname(h)) }
}

func protocol(p gatewayv1.ProtocolType) listenerOption {
	return func(l *gatewayv1.Listener) { l.Protocol = p }
}

func route(namespace string, hostnames ...gatewayv1.Hostname) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "r"},
		Spec:       gatewayv1.HTTPRouteSpec{Hostnames: hostnames},
	}
}

func parentRef(section string, port int32) gatewayv1.ParentReference {
	p := gatewayv1.ParentReference{Name: "gw", Namespace: ptr.To(gatewayv1.Namespace(gatewayNamespace))}
	if section != "" {
		p.SectionName = ptr.To(gatewayv1.SectionName(section))
	}
	if port != 0 {
		p.Port = ptr.To(gatewayv1.PortNumber(port))
	}
	return p
}

// The namespaces of the cluster, as the caller's namespace cache knows them.
var namespaceLabels = NamespaceLabels(func(ns string) map[string]string {
	return map[string]map[string]string{
		"team-a": {"kubernetes.io/metadata.name": "team-a", "gateway-access": "yes"},
		"team-b": {"kubernetes.io/metadata.name": "team-b"},
	}[ns]
})

// Gateway API (GEP-1294, the Listener and ParentReference docs): a
// parentRef selects listeners by sectionName and port; a selected listener
// takes a route when allowedRoutes allows its kind and namespace and their
// hostnames intersect; the route attaches when one listener takes it.
func TestAttach(t *testing.T) {
	access := &metav1.LabelSelector{MatchLabels: map[string]string{"gateway-access": "yes"}}
	cases := []struct {
		name      string
		gateway   *gatewayv1.Gateway
		ref       gatewayv1.ParentReference
		route     *gatewayv1.HTTPRoute
		wantHosts []string // nil: not accepted
		reason    string
		why       string
	}{
		{
			name:      "a listener without allowedRoutes takes routes of the Gateway's namespace only (from: Same is the default)",
			gateway:   gateway(listener("http", 80)),
			ref:       parentRef("", 0),
			route:     route(gatewayNamespace),
			wantHosts: []string{""},
		},
		{
			name:    "from: Same refuses a route of another namespace",
			gateway: gateway(listener("http", 80)),
			ref:     parentRef("", 0),
			route:   route("team-a"),
			reason:  ReasonNotAllowedByListeners,
			why:     "Gateway infra/gw listener http: routes of namespace team-a are not allowed (allowedRoutes.namespaces.from is Same: only namespace infra)",
		},
		{
			name:      "from: All takes a route of any namespace",
			gateway:   gateway(listener("http", 80, from(gatewayv1.NamespacesFromAll, nil))),
			ref:       parentRef("", 0),
			route:     route("team-b"),
			wantHosts: []string{""},
		},
		{
			name:      "from: Selector takes a route of a namespace whose labels match",
			gateway:   gateway(listener("http", 80, from(gatewayv1.NamespacesFromSelector, access))),
			ref:       parentRef("", 0),
			route:     route("team-a"),
			wantHosts: []string{""},
		},
		{
			name:    "from: Selector refuses a route of a namespace whose labels do not match",
			gateway: gateway(listener("http", 80, from(gatewayv1.NamespacesFromSelector, access))),
			ref:     parentRef("", 0),
			route:   route("team-b"),
			reason:  ReasonNotAllowedByListeners,
			why:     "the labels of namespace team-b do not match allowedRoutes.namespaces.selector",
		},
		{
			name:    "from: Selector refuses a route of a namespace the cache does not know",
			gateway: gateway(listener("http", 80, from(gatewayv1.NamespacesFromSelector, access))),
			ref:     parentRef("", 0),
			route:   route("team-c"),
			reason:  ReasonNotAllowedByListeners,
		},
		{
			name:    "from: Selector without a selector allows no namespace",
			gateway: gateway(listener("http", 80, from(gatewayv1.NamespacesFromSelector, nil))),
			ref:     parentRef("", 0),
			route:   route(gatewayNamespace),
			reason:  ReasonNotAllowedByListeners,
			why:     "without a selector",
		},
		{
			name: "an invalid selector allows no namespace",
			gateway: gateway(listener("http", 80, from(gatewayv1.NamespacesFromSelector, &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "gateway-access", Operator: "Near"}},
			}))),
			ref:    parentRef("", 0),
			route:  route("team-a"),
			reason: ReasonNotAllowedByListeners,
			why:    "is invalid",
		},
		{
			name:    "a TCP listener without kinds does not take HTTPRoutes",
			gateway: gateway(listener("tcp", 9000, protocol(gatewayv1.TCPProtocolType), from(gatewayv1.NamespacesFromAll, nil))),
			ref:     parentRef("", 0),
			route:   route(gatewayNamespace),
			reason:  ReasonNotAllowedByListeners,
			why:     "not among its allowed kinds",
		},
		{
			name:      "allowedRoutes.kinds with HTTPRoute (group defaulted) takes it",
			gateway:   gateway(listener("http", 80, kinds(gatewayv1.RouteGroupKind{Kind: httpRouteKind}))),
			ref:       parentRef("", 0),
			route:     route(gatewayNamespace),
			wantHosts: []string{""},
		},
		{
			name:    "allowedRoutes.kinds of other kinds refuses it",
			gateway: gateway(listener("http", 80, kinds(gatewayv1.RouteGroupKind{Kind: "GRPCRoute"}))),
			ref:     parentRef("", 0),
			route:   route(gatewayNamespace),
			reason:  ReasonNotAllowedByListeners,
		},
		{
			name:      "sectionName selects one listener",
			gateway:   gateway(listener("a", 80, hostname("a.example.com")), listener("b", 80, hostname("b.example.com"))),
			ref:       parentRef("b", 0),
			route:     route(gatewayNamespace),
			wantHosts: []string{"b.example.com"},
		},
		{
			name:    "a sectionName no listener has matches no parent",
			gateway: gateway(listener("http", 80)),
			ref:     parentRef("https", 0),
			route:   route(gatewayNamespace),
			reason:  ReasonNoMatchingParent,
			why:     `Gateway infra/gw has no listener named "https"`,
		},
		{
			name:    "a port no listener has matches no parent",
			gateway: gateway(listener("http", 80)),
			ref:     parentRef("", 8080),
			route:   route(gatewayNamespace),
			reason:  ReasonNoMatchingParent,
			why:     "on port 8080",
		},
		{
			name:      "without sectionName and port every listener is selected; their hostnames add up",
			gateway:   gateway(listener("a", 80, hostname("a.example.com")), listener("b", 8080, hostname("*.example.com"))),
			ref:       parentRef("", 0),
			route:     route(gatewayNamespace),
			wantHosts: []string{"a.example.com", "*.example.com"},
		},
		{
			name:      "a listener for any hostname serves the route for any",
			gateway:   gateway(listener("a", 80, hostname("a.example.com")), listener("any", 8080)),
			ref:       parentRef("", 0),
			route:     route(gatewayNamespace),
			wantHosts: []string{""},
		},
		{
			name:    "hostnames that do not intersect refuse the route",
			gateway: gateway(listener("http", 80, hostname("api.example.com"))),
			ref:     parentRef("", 0),
			route:   route(gatewayNamespace, "other.com"),
			reason:  ReasonNoMatchingListenerHostname,
			why:     "none of the route's hostnames [other.com] is within the listener's hostname api.example.com",
		},
		{
			name:    "of several refusals the closest one is the reason",
			gateway: gateway(listener("http", 80), listener("api", 81, hostname("api.example.com"), from(gatewayv1.NamespacesFromAll, nil))),
			ref:     parentRef("", 0),
			route:   route("team-a", "other.com"),
			reason:  ReasonNoMatchingListenerHostname,
			why:     "listener http: routes of namespace team-a are not allowed",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var a Attachment
			a.Attach(c.gateway, c.ref, c.route, namespaceLabels)
			assert.Equal(t, c.wantHosts != nil, a.Accepted, "why: %v", a.Why)
			assert.Equal(t, c.wantHosts, a.Hostnames)
			assert.Equal(t, c.reason, a.Reason)
			if c.why != "" {
				assert.True(t, slices.ContainsFunc(a.Why, func(w string) bool { return strings.Contains(w, c.why) }), "no refusal says %q: %v", c.why, a.Why)
			}
		})
	}
}

func TestAttachAddsUpParentRefs(t *testing.T) {
	gw := gateway(listener("a", 80, hostname("a.example.com")), listener("b", 81, hostname("b.example.com")))
	var a Attachment
	a.Attach(gw, parentRef("missing", 0), route(gatewayNamespace), namespaceLabels)
	assert.False(t, a.Accepted)
	a.Attach(gw, parentRef("b", 0), route(gatewayNamespace), namespaceLabels)
	a.Attach(gw, parentRef("", 81), route(gatewayNamespace), namespaceLabels)
	assert.True(t, a.Accepted, "one parentRef that attaches is enough")
	assert.Equal(t, []string{"b.example.com"}, a.Hostnames, "without duplicates")
	assert.Equal(t, ReasonNoMatchingParent, a.Reason, "the refusal stays on record")
}

func TestIntersectHostnames(t *testing.T) {
	cases := []struct {
		listener string
		route    []gatewayv1.Hostname
		want     []string
	}{
		{listener: "", route: nil, want: []string{""}},
		{listener: "a.example.com", route: nil, want: []string{"a.example.com"}},
		{listener: "", route: []gatewayv1.Hostname{"a.example.com"}, want: []string{"a.example.com"}},
		{listener: "a.example.com", route: []gatewayv1.Hostname{"A.Example.com"}, want: []string{"a.example.com"}},
		{listener: "*.example.com", route: []gatewayv1.Hostname{"a.example.com", "x.a.example.com"}, want: []string{"a.example.com", "x.a.example.com"}},
		{listener: "*.example.com", route: []gatewayv1.Hostname{"example.com"}, want: nil},
		{listener: "*.example.com", route: []gatewayv1.Hostname{"*.a.example.com", "*.example.com", "*.com"}, want: []string{"*.a.example.com", "*.example.com"}},
		{listener: "a.example.com", route: []gatewayv1.Hostname{"*.example.com", "*.a.example.com"}, want: []string{"a.example.com"}},
		{listener: "a.example.com", route: []gatewayv1.Hostname{"b.example.com"}, want: nil},
	}
	for _, c := range cases {
		var l *gatewayv1.Hostname
		if c.listener != "" {
			l = ptr.To(gatewayv1.Hostname(c.listener))
		}
		assert.Equal(t, c.want, intersectHostnames(l, c.route), "listener %q route %v", c.listener, c.route)
	}
}

// Gateway API's ReferenceGrant: it lives in the target's namespace, names
// the kinds and namespaces it trusts (from) and the objects they may refer
// to (to, all of a kind when unnamed).
func TestGrantAllows(t *testing.T) {
	spec := func(fromNamespace, toName string) gatewayv1.ReferenceGrantSpec {
		s := gatewayv1.ReferenceGrantSpec{
			From: []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: httpRouteKind, Namespace: gatewayv1.Namespace(fromNamespace)}},
			To:   []gatewayv1.ReferenceGrantTo{{Group: "inference.networking.x-k8s.io", Kind: "InferencePoolImport"}},
		}
		if toName != "" {
			s.To[0].Name = ptr.To(gatewayv1.ObjectName(toName))
		}
		return s
	}
	const group, kind = "inference.networking.x-k8s.io", "InferencePoolImport"
	assert.True(t, GrantAllows(spec("team-a", ""), "team-a", group, kind, "llm"), "unnamed to: every object of the kind")
	assert.True(t, GrantAllows(spec("team-a", "llm"), "team-a", group, kind, "llm"))
	assert.False(t, GrantAllows(spec("team-a", "other"), "team-a", group, kind, "llm"), "another object")
	assert.False(t, GrantAllows(spec("team-b", ""), "team-a", group, kind, "llm"), "another namespace")
	assert.False(t, GrantAllows(spec("team-a", ""), "team-a", "inference.networking.k8s.io", "InferencePool", "llm"), "another kind")
	grpc := spec("team-a", "")
	grpc.From[0].Kind = "GRPCRoute"
	assert.False(t, GrantAllows(grpc, "team-a", group, kind, "llm"), "routes of another kind")
}
