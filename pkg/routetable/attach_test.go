package routetable

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// servedRoute is an HTTPRoute of namespace namespace to the import llm of
// its own namespace, whose parentRefs are parents.
func servedRoute(namespace string, hostnames []string, parents ...gatewayv1.ParentReference) *gatewayv1.HTTPRoute {
	r := route("r", 0, hostnames, rule(nil, importRef("llm", nil)))
	r.Namespace = namespace
	r.Spec.ParentRefs = parents
	return r
}

// toGateway is a parentRef to the Gateway example/inf-gw.
func toGateway(section string, port int32) gatewayv1.ParentReference {
	p := gatewayv1.ParentReference{Name: "inf-gw", Namespace: ptr.To(gatewayv1.Namespace(ns))}
	if section != "" {
		p.SectionName = ptr.To(gatewayv1.SectionName(section))
	}
	if port != 0 {
		p.Port = ptr.To(gatewayv1.PortNumber(port))
	}
	return p
}

func labelled(name string, kv ...string) *corev1.Namespace {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	for i := 0; i < len(kv); i += 2 {
		n.Labels[kv[i]] = kv[i+1]
	}
	return n
}

func matchLabels(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

// Gateway API: a route attaches to a Gateway when at least one listener its
// parentRef selects allows it (allowedRoutes: namespaces and kinds) and,
// when both have hostnames, their hostnames intersect. The sidecar serves
// only the routes attached to its Gateway.
func TestRouteAttachment(t *testing.T) {
	httpsListener := listener("https", 443, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))
	httpsListener.Protocol = gatewayv1.HTTPSProtocolType
	tcpListener := listener("tcp", 9000, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))
	tcpListener.Protocol = gatewayv1.TCPProtocolType

	cases := []struct {
		name       string
		listeners  []gatewayv1.Listener
		noGateway  bool
		namespaces []*corev1.Namespace
		route      *gatewayv1.HTTPRoute
		// wantHosts are the hostnames the route is served for ("" any);
		// nil: not served.
		wantHosts  []string
		wantReason string
	}{
		{
			name:      "a listener without allowedRoutes accepts routes of the Gateway's namespace (from: Same is the default)",
			listeners: []gatewayv1.Listener{listener("http", 80, "", nil)},
			route:     servedRoute(ns, nil, toGateway("", 0)),
			wantHosts: []string{""},
		},
		{
			name:       "a listener without allowedRoutes refuses routes of another namespace",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", nil)},
			route:      servedRoute("team-a", nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:       "from: Same refuses routes of another namespace",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromSame, nil))},
			route:      servedRoute("team-a", nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:      "from: All accepts routes of any namespace",
			listeners: []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))},
			route:     servedRoute("team-a", nil, toGateway("", 0)),
			wantHosts: []string{""},
		},
		{
			name:       "from: Selector accepts routes of the namespaces whose labels match",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromSelector, matchLabels("team", "a")))},
			namespaces: []*corev1.Namespace{labelled("team-a", "team", "a"), labelled("team-b", "team", "b")},
			route:      servedRoute("team-a", nil, toGateway("", 0)),
			wantHosts:  []string{""},
		},
		{
			name:       "from: Selector refuses routes of the namespaces whose labels do not match",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromSelector, matchLabels("team", "a")))},
			namespaces: []*corev1.Namespace{labelled("team-a", "team", "a"), labelled("team-b", "team", "b")},
			route:      servedRoute("team-b", nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:       "from: Selector applies to the Gateway's own namespace too",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromSelector, matchLabels("team", "a")))},
			namespaces: []*corev1.Namespace{labelled(ns)},
			route:      servedRoute(ns, nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:       "from: Selector with match expressions",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromSelector, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}))},
			namespaces: []*corev1.Namespace{labelled("team-b", "team", "b")},
			route:      servedRoute("team-b", nil, toGateway("", 0)),
			wantHosts:  []string{""},
		},
		{
			name:       "from: Selector without a selector accepts no namespace",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromSelector, nil))},
			namespaces: []*corev1.Namespace{labelled("team-a", "team", "a")},
			route:      servedRoute("team-a", nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:       "an invalid selector accepts no namespace",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromSelector, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Bogus"}}}))},
			namespaces: []*corev1.Namespace{labelled("team-a", "team", "a")},
			route:      servedRoute("team-a", nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name: "kinds that list HTTPRoute (group defaulting to Gateway API's) allow it",
			listeners: []gatewayv1.Listener{listener("http", 80, "", &gatewayv1.AllowedRoutes{
				Kinds: []gatewayv1.RouteGroupKind{{Kind: "GRPCRoute"}, {Kind: "HTTPRoute"}},
			})},
			route:     servedRoute(ns, nil, toGateway("", 0)),
			wantHosts: []string{""},
		},
		{
			name: "kinds that do not list HTTPRoute refuse it",
			listeners: []gatewayv1.Listener{listener("http", 80, "", &gatewayv1.AllowedRoutes{
				Kinds: []gatewayv1.RouteGroupKind{{Kind: "GRPCRoute"}, {Group: ptr.To(gatewayv1.Group("example.com")), Kind: "HTTPRoute"}},
			})},
			route:      servedRoute(ns, nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:      "an HTTPS listener without kinds allows HTTPRoutes",
			listeners: []gatewayv1.Listener{httpsListener},
			route:     servedRoute("team-a", nil, toGateway("", 0)),
			wantHosts: []string{""},
		},
		{
			name:       "a TCP listener without kinds does not allow HTTPRoutes",
			listeners:  []gatewayv1.Listener{tcpListener},
			route:      servedRoute("team-a", nil, toGateway("", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:      "a route attaches when one of the listeners its parentRef selects accepts it",
			listeners: []gatewayv1.Listener{listener("same", 80, "", nil), listener("all", 8080, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))},
			route:     servedRoute("team-a", nil, toGateway("", 0)),
			wantHosts: []string{""},
		},
		{
			name:       "sectionName selects the listener of that name only",
			listeners:  []gatewayv1.Listener{listener("same", 80, "", nil), listener("all", 8080, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))},
			route:      servedRoute("team-a", nil, toGateway("same", 0)),
			wantReason: ReasonNotAllowedByListeners,
		},
		{
			name:      "sectionName naming an accepting listener attaches",
			listeners: []gatewayv1.Listener{listener("same", 80, "", nil), listener("all", 8080, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))},
			route:     servedRoute("team-a", nil, toGateway("all", 0)),
			wantHosts: []string{""},
		},
		{
			name:      "port selects the listeners on that port",
			listeners: []gatewayv1.Listener{listener("same", 80, "", nil), listener("all", 8080, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))},
			route:     servedRoute("team-a", nil, toGateway("", 8080)),
			wantHosts: []string{""},
		},
		{
			name:       "sectionName and port must both match the listener",
			listeners:  []gatewayv1.Listener{listener("same", 80, "", nil), listener("all", 8080, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil))},
			route:      servedRoute("team-a", nil, toGateway("all", 80)),
			wantReason: ReasonNoMatchingParent,
		},
		{
			name:       "a sectionName that names no listener matches no parent",
			listeners:  []gatewayv1.Listener{listener("http", 80, "", nil)},
			route:      servedRoute(ns, nil, toGateway("https", 0)),
			wantReason: ReasonNoMatchingParent,
		},
		{
			name:       "a served Gateway that does not exist accepts nothing",
			noGateway:  true,
			route:      servedRoute(ns, nil, toGateway("", 0)),
			wantReason: ReasonNoMatchingParent,
		},
		{
			name:      "a route that names another Gateway is not served, and not reported",
			listeners: []gatewayv1.Listener{listener("http", 80, "", nil)},
			route:     servedRoute(ns, nil, gatewayv1.ParentReference{Name: "other-gw"}),
		},
		{
			name:      "a parentRef of another kind does not name the Gateway",
			listeners: []gatewayv1.Listener{listener("http", 80, "", nil)},
			route:     servedRoute(ns, nil, gatewayv1.ParentReference{Name: "inf-gw", Kind: ptr.To(gatewayv1.Kind("ListenerSet"))}),
		},
		{
			name:      "a listener without hostname serves the route's hostnames",
			listeners: []gatewayv1.Listener{listener("http", 80, "", nil)},
			route:     servedRoute(ns, []string{"a.example.com", "other.com"}, toGateway("", 0)),
			wantHosts: []string{"a.example.com", "other.com"},
		},
		{
			name:      "a route without hostnames is served for the listener's hostname only",
			listeners: []gatewayv1.Listener{listener("http", 80, "*.example.com", nil)},
			route:     servedRoute(ns, nil, toGateway("", 0)),
			wantHosts: []string{"*.example.com"},
		},
		{
			name:      "route hostnames are served where they intersect the listener's",
			listeners: []gatewayv1.Listener{listener("http", 80, "*.example.com", nil)},
			route:     servedRoute(ns, []string{"a.example.com", "other.com", "*.b.example.com"}, toGateway("", 0)),
			wantHosts: []string{"a.example.com", "*.b.example.com"},
		},
		{
			name:      "a wildcard route hostname is narrowed to the listener's exact hostname",
			listeners: []gatewayv1.Listener{listener("http", 80, "a.example.com", nil)},
			route:     servedRoute(ns, []string{"*.example.com"}, toGateway("", 0)),
			wantHosts: []string{"a.example.com"},
		},
		{
			name:       "route hostnames that do not intersect the listener's are refused",
			listeners:  []gatewayv1.Listener{listener("http", 80, "*.example.com", nil)},
			route:      servedRoute(ns, []string{"example.com", "other.com"}, toGateway("", 0)),
			wantReason: ReasonNoMatchingListenerHostname,
		},
		{
			name:      "hostnames of every accepting listener count",
			listeners: []gatewayv1.Listener{listener("a", 80, "a.example.com", nil), listener("b", 80, "b.example.com", nil), listener("c", 80, "c.example.com", fromNamespaces(gatewayv1.NamespacesFromSelector, nil))},
			route:     servedRoute(ns, nil, toGateway("", 0)),
			wantHosts: []string{"a.example.com", "b.example.com"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := Inputs{
				ServedGateways: []types.NamespacedName{{Namespace: ns, Name: "inf-gw"}},
				Routes:         []*gatewayv1.HTTPRoute{c.route},
				Imports:        []*v1alphaImport{importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"})},
				Namespaces:     c.namespaces,
			}
			in.Imports[0].Namespace = c.route.Namespace
			if !c.noGateway {
				in.Gateways = []*gatewayv1.Gateway{gateway("inf-gw", c.listeners...)}
			}
			tbl, errs := Build(in)
			if c.wantReason != "" {
				require.Equal(t, []string{c.wantReason}, reasons(errs), "%v", errs)
			} else {
				require.Empty(t, errs)
			}
			if c.wantHosts == nil {
				assert.Empty(t, tbl.Rules(), "the route is not served")
				return
			}
			require.Len(t, tbl.Rules(), 1)
			assert.ElementsMatch(t, c.wantHosts, hostsOf(tbl))
		})
	}
}

// hostsOf lists the hostname groups of a table ("" for any).
func hostsOf(tbl *Table) []string {
	var out []string
	for h := range tbl.index.exact {
		out = append(out, h)
	}
	for _, g := range tbl.index.wildcards {
		out = append(out, "*"+g.suffix)
	}
	if len(tbl.index.any) > 0 {
		out = append(out, "")
	}
	return out
}

func TestRefusedRouteIsReportedWithEveryListenersReason(t *testing.T) {
	_, errs := Build(Inputs{
		ServedGateways: []types.NamespacedName{{Namespace: ns, Name: "inf-gw"}},
		Gateways:       []*gatewayv1.Gateway{gateway("inf-gw", listener("http", 80, "", nil), listener("api", 80, "api.example.com", fromNamespaces(gatewayv1.NamespacesFromAll, nil)))},
		Routes:         []*gatewayv1.HTTPRoute{servedRoute("team-a", []string{"other.com"}, toGateway("", 0))},
	})
	require.Len(t, errs, 1)
	be := errs[0].(*BuildError)
	assert.Equal(t, ReasonNoMatchingListenerHostname, be.Reason, "the reason of the listener that came closest")
	assert.Equal(t, "HTTPRoute", be.Kind)
	assert.Equal(t, "team-a", be.Namespace)
	assert.Contains(t, be.Message, "listener http: routes of namespace team-a are not allowed (allowedRoutes.namespaces.from is Same: only namespace example)")
	assert.Contains(t, be.Message, "listener api: none of the route's hostnames [other.com] is within the listener's hostname api.example.com")
}

// Gateway API: a backendRef to another namespace than its route's is
// allowed only by a ReferenceGrant of the target's namespace whose from
// names HTTPRoutes of the route's namespace and whose to names the target's
// group and kind, and its name when it has one. Otherwise the backend is
// refused (RefNotPermitted) and answers 500 for its share.
func TestCrossNamespaceBackendRefsNeedAReferenceGrant(t *testing.T) {
	grant := func(namespace, fromKind, fromNamespace, group, kind, name string) *gatewayv1beta1.ReferenceGrant {
		g := &gatewayv1beta1.ReferenceGrant{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "g"},
			Spec: gatewayv1beta1.ReferenceGrantSpec{
				From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: gatewayv1.Kind(fromKind), Namespace: gatewayv1.Namespace(fromNamespace)}},
				To:   []gatewayv1beta1.ReferenceGrantTo{{Group: gatewayv1.Group(group), Kind: gatewayv1.Kind(kind)}},
			},
		}
		if name != "" {
			g.Spec.To[0].Name = ptr.To(gatewayv1.ObjectName(name))
		}
		return g
	}
	importGrant := func(name string) *gatewayv1beta1.ReferenceGrant {
		return grant("models", "HTTPRoute", "team-a", InferencePoolImportGroup, InferencePoolImportKind, name)
	}
	cases := []struct {
		name   string
		ref    gatewayv1.HTTPBackendRef
		grants []*gatewayv1beta1.ReferenceGrant
		want   bool
	}{
		{name: "without a ReferenceGrant an import of another namespace is refused", ref: importRef("llm", nil)},
		{name: "a ReferenceGrant for the kind allows every import of its namespace", ref: importRef("llm", nil), grants: []*gatewayv1beta1.ReferenceGrant{importGrant("")}, want: true},
		{name: "a ReferenceGrant naming the import allows it", ref: importRef("llm", nil), grants: []*gatewayv1beta1.ReferenceGrant{importGrant("llm")}, want: true},
		{name: "a ReferenceGrant naming another import does not", ref: importRef("llm", nil), grants: []*gatewayv1beta1.ReferenceGrant{importGrant("chat")}},
		{name: "a ReferenceGrant for InferencePools does not allow imports", ref: importRef("llm", nil),
			grants: []*gatewayv1beta1.ReferenceGrant{grant("models", "HTTPRoute", "team-a", InferencePoolGroup, InferencePoolKind, "")}},
		{name: "a ReferenceGrant for InferencePools allows a pool", ref: poolRef("llm", nil),
			grants: []*gatewayv1beta1.ReferenceGrant{grant("models", "HTTPRoute", "team-a", InferencePoolGroup, InferencePoolKind, "")}, want: true},
		{name: "a ReferenceGrant from another namespace's routes does not", ref: importRef("llm", nil),
			grants: []*gatewayv1beta1.ReferenceGrant{grant("models", "HTTPRoute", "team-b", InferencePoolImportGroup, InferencePoolImportKind, "")}},
		{name: "a ReferenceGrant from GRPCRoutes does not", ref: importRef("llm", nil),
			grants: []*gatewayv1beta1.ReferenceGrant{grant("models", "GRPCRoute", "team-a", InferencePoolImportGroup, InferencePoolImportKind, "")}},
		{name: "a ReferenceGrant in the route's namespace does not", ref: importRef("llm", nil),
			grants: []*gatewayv1beta1.ReferenceGrant{grant("team-a", "HTTPRoute", "team-a", InferencePoolImportGroup, InferencePoolImportKind, "")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.ref.Namespace = ptr.To(gatewayv1.Namespace("models"))
			r := route("r", 0, nil, rule(nil, c.ref))
			r.Namespace = "team-a"
			imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"})
			imp.Namespace = "models"
			p := pool("llm", "")
			p.Namespace = "models"
			svc := eppService("llm", "127.0.1.1")
			svc.Namespace = "models"
			tbl, errs := Build(Inputs{Routes: []*gatewayv1.HTTPRoute{r}, Imports: []*v1alphaImport{imp}, Pools: []*poolv1.InferencePool{p},
				Services: []*corev1.Service{svc}, ReferenceGrants: c.grants})
			be := only(t, tbl)
			if c.want {
				assert.Empty(t, errs)
				assert.Empty(t, be.Invalid)
				assert.NotEmpty(t, be.Clusters)
				return
			}
			require.Equal(t, []string{ReasonRefNotPermitted}, reasons(errs))
			assert.Contains(t, be.Invalid, ReasonRefNotPermitted)
			assert.Contains(t, errs[0].Error(), "no ReferenceGrant of namespace models allows HTTPRoutes of namespace team-a")
		})
	}
}
