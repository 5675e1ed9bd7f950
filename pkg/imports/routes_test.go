package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

const (
	testGateway = "inference-gateway"
	testRoute   = "llm-route"
)

type routeOption func(*gatewayv1.HTTPRoute)

// route is an HTTPRoute in ns whose one rule sends everything to the
// InferencePoolImport testNamespace/testPool, attached to the Gateways named.
func route(ns, name string, opts ...routeOption) *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	r.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{importBackend(testNamespace, testPool)}}}
	for _, o := range opts {
		o(r)
	}
	return r
}

func importBackend(ns, name string) gatewayv1.HTTPBackendRef {
	ref := gatewayv1.HTTPBackendRef{}
	ref.Group = ptr(gatewayv1.Group(v1alpha1.GroupName))
	ref.Kind = ptr(gatewayv1.Kind("InferencePoolImport"))
	ref.Name = gatewayv1.ObjectName(name)
	ref.Namespace = ptr(gatewayv1.Namespace(ns))
	return ref
}

func backends(refs ...gatewayv1.HTTPBackendRef) routeOption {
	return func(r *gatewayv1.HTTPRoute) {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: refs}}
	}
}

func parents(refs ...gatewayv1.ParentReference) routeOption {
	return func(r *gatewayv1.HTTPRoute) { r.Spec.ParentRefs = append(r.Spec.ParentRefs, refs...) }
}

// gw is a parentRef to a Gateway, namespace unset (the route's).
func gw(name string) gatewayv1.ParentReference {
	return gatewayv1.ParentReference{Name: gatewayv1.ObjectName(name)}
}

func gwIn(ns, name string) gatewayv1.ParentReference {
	ref := gw(name)
	ref.Namespace = ptr(gatewayv1.Namespace(ns))
	return ref
}

func rejectedBy(ref gatewayv1.ParentReference, reason string) routeOption {
	return func(r *gatewayv1.HTTPRoute) {
		r.Status.Parents = append(r.Status.Parents, gatewayv1.RouteParentStatus{
			ParentRef:      ref,
			ControllerName: "example.net/gateway-controller",
			Conditions:     []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse, Reason: reason, Message: "refused"}},
		})
	}
}

func allowedRoutes(from gatewayv1.FromNamespaces, kinds ...gatewayv1.RouteGroupKind) gatewayOption {
	return func(g *gatewayv1.Gateway) {
		for i := range g.Spec.Listeners {
			g.Spec.Listeners[i].AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr(from)}, Kinds: kinds}
		}
	}
}

// allowedFromSelector makes every listener take routes of the namespaces
// labelled key=value.
func allowedFromSelector(key, value string) gatewayOption {
	return func(g *gatewayv1.Gateway) {
		for i := range g.Spec.Listeners {
			g.Spec.Listeners[i].AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{
				From:     ptr(gatewayv1.NamespacesFromSelector),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{key: value}},
			}}
		}
	}
}

func listenerHostname(h string) gatewayOption {
	return func(g *gatewayv1.Gateway) {
		for i := range g.Spec.Listeners {
			g.Spec.Listeners[i].Hostname = ptr(gatewayv1.Hostname(h))
		}
	}
}

func hostnames(h ...gatewayv1.Hostname) routeOption {
	return func(r *gatewayv1.HTTPRoute) { r.Spec.Hostnames = h }
}

func grant(ns string, fromNamespace string, toName *string) *gatewayv1beta1.ReferenceGrant {
	g := &gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-" + fromNamespace}}
	g.Spec.From = []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: gatewayv1.Namespace(fromNamespace)}}
	to := gatewayv1.ReferenceGrantTo{Group: v1alpha1.GroupName, Kind: "InferencePoolImport"}
	if toName != nil {
		to.Name = ptr(gatewayv1.ObjectName(*toName))
	}
	g.Spec.To = []gatewayv1.ReferenceGrantTo{to}
	return g
}

// wantParent is a parent as a test expects it: which Gateway, and the
// status and reason of its two conditions.
type wantParent struct {
	namespace, name, kind   string
	accepted, resolved      metav1.ConditionStatus
	acceptedR, resolvedR    string
	acceptedMessageContains string
}

func TestImportParents(t *testing.T) {
	exporter := member(t, "cluster-a", objects(nsObjects(testNamespace, "team"), readyEPP(testNamespace, testPool))...)
	localGateway := gateway(testNamespace, testGateway, []int32{8080})
	ok := metav1.ConditionTrue
	no := metav1.ConditionFalse
	accepted := func(ns, name string) wantParent {
		return wantParent{namespace: ns, name: name, kind: "Gateway", accepted: ok, acceptedR: "Accepted", resolved: ok, resolvedR: "ResolvedRefs"}
	}

	tests := []struct {
		name  string
		local []runtime.Object
		// exporterObjects are added to the exporting cluster.
		exporterObjects []runtime.Object
		want            []wantParent
	}{
		{
			name:  "an import no route uses has no parents",
			local: []runtime.Object{localGateway},
		},
		{
			name:  "the Gateway of a route in the import's namespace is a parent, Accepted and ResolvedRefs",
			local: []runtime.Object{localGateway, route(testNamespace, testRoute, parents(gw(testGateway)))},
			want:  []wantParent{accepted(testNamespace, testGateway)},
		},
		{
			name: "a Gateway reached by several routes and parentRefs is listed once, parents sorted by namespace and name",
			local: []runtime.Object{
				localGateway, gateway("edge", "b-gw", []int32{80}, allowedRoutes(gatewayv1.NamespacesFromAll)), gateway("edge", "a-gw", []int32{80}, allowedRoutes(gatewayv1.NamespacesFromAll)),
				route(testNamespace, "r1", parents(gw(testGateway), gwIn("edge", "b-gw"))),
				route(testNamespace, "r2", parents(gwIn("edge", "a-gw"), gw(testGateway))),
			},
			want: []wantParent{accepted("edge", "a-gw"), accepted("edge", "b-gw"), accepted(testNamespace, testGateway)},
		},
		{
			name:  "routes of other clusters do not make parents here",
			local: []runtime.Object{localGateway},
			exporterObjects: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}),
				route(testNamespace, testRoute, parents(gw(testGateway))),
			},
		},
		{
			name:  "a missing Gateway is listed, not Accepted",
			local: []runtime.Object{route(testNamespace, testRoute, parents(gw("missing")))},
			want:  []wantParent{{namespace: testNamespace, name: "missing", kind: "Gateway", accepted: no, acceptedR: "NotSupportedByParent", resolved: ok, resolvedR: "ResolvedRefs", acceptedMessageContains: "does not exist"}},
		},
		{
			name: "a parent that is not a Gateway is not supported",
			local: []runtime.Object{route(testNamespace, testRoute, parents(gatewayv1.ParentReference{
				Group: ptr(gatewayv1.Group("")), Kind: ptr(gatewayv1.Kind("Service")), Name: "mesh",
			}))},
			want: []wantParent{{namespace: testNamespace, name: "mesh", kind: "Service", accepted: no, acceptedR: "NotSupportedByParent", resolved: ok, resolvedR: "ResolvedRefs"}},
		},
		{
			name:  "a route its Gateway's controller rejected is not Accepted",
			local: []runtime.Object{localGateway, route(testNamespace, testRoute, parents(gw(testGateway)), rejectedBy(gw(testGateway), "NotAllowedByListeners"))},
			want:  []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: no, acceptedR: "HTTPRouteNotAccepted", resolved: ok, resolvedR: "ResolvedRefs", acceptedMessageContains: "NotAllowedByListeners"}},
		},
		{
			name: "a sectionName no listener has is not Accepted",
			local: []runtime.Object{localGateway, route(testNamespace, testRoute, parents(gatewayv1.ParentReference{
				Name: testGateway, SectionName: ptr(gatewayv1.SectionName("https")),
			}))},
			want: []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: no, acceptedR: "HTTPRouteNotAccepted", resolved: ok, resolvedR: "ResolvedRefs", acceptedMessageContains: `has no listener named "https"`}},
		},
		{
			name: "a listener that allows only other route kinds does not take the route",
			local: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}, allowedRoutes(gatewayv1.NamespacesFromSame, gatewayv1.RouteGroupKind{Kind: "GRPCRoute"})),
				route(testNamespace, testRoute, parents(gw(testGateway))),
			},
			want: []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: no, acceptedR: "HTTPRouteNotAccepted", resolved: ok, resolvedR: "ResolvedRefs"}},
		},
		{
			name: "a route from another namespace needs a ReferenceGrant, and a listener that allows its namespace",
			local: []runtime.Object{
				localGateway,
				route("team", testRoute, parents(gwIn(testNamespace, testGateway))),
			},
			want: []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: no, acceptedR: "HTTPRouteNotAccepted", resolved: no, resolvedR: "RefNotPermitted", acceptedMessageContains: "namespace team"}},
		},
		{
			name: "a ReferenceGrant for every import permits a route from another namespace",
			local: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}, allowedRoutes(gatewayv1.NamespacesFromAll)),
				grant(testNamespace, "team", nil),
				route("team", testRoute, parents(gwIn(testNamespace, testGateway))),
			},
			want: []wantParent{accepted(testNamespace, testGateway)},
		},
		{
			name: "a ReferenceGrant for another import does not permit the route",
			local: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}, allowedRoutes(gatewayv1.NamespacesFromAll)),
				grant(testNamespace, "team", ptr("other-pool")),
				route("team", testRoute, parents(gwIn(testNamespace, testGateway))),
			},
			want: []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: ok, acceptedR: "Accepted", resolved: no, resolvedR: "RefNotPermitted"}},
		},
		{
			name: "a listener's namespace selector takes a route of a namespace whose labels match",
			local: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}, allowedFromSelector("gateway-access", "granted")),
				grant(testNamespace, "team", ptr(testPool)),
				route("team", testRoute, parents(gwIn(testNamespace, testGateway))),
			},
			want: []wantParent{accepted(testNamespace, testGateway)},
		},
		{
			name: "a listener's namespace selector refuses a route of a namespace whose labels do not match",
			local: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}, allowedFromSelector("gateway-access", "denied")),
				grant(testNamespace, "team", ptr(testPool)),
				route("team", testRoute, parents(gwIn(testNamespace, testGateway))),
			},
			want: []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: no, acceptedR: "HTTPRouteNotAccepted", resolved: ok, resolvedR: "ResolvedRefs",
				acceptedMessageContains: "labels of namespace team do not match allowedRoutes.namespaces.selector"}},
		},
		{
			name: "a route whose hostnames no listener's hostname covers is not Accepted",
			local: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}, listenerHostname("*.models.example.com")),
				route(testNamespace, testRoute, parents(gw(testGateway)), hostnames("chat.example.com")),
			},
			want: []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: no, acceptedR: "HTTPRouteNotAccepted", resolved: ok, resolvedR: "ResolvedRefs",
				acceptedMessageContains: "NoMatchingListenerHostname"}},
		},
		{
			name: "a route with a hostname within the listener's wildcard is Accepted",
			local: []runtime.Object{
				gateway(testNamespace, testGateway, []int32{8080}, listenerHostname("*.models.example.com")),
				route(testNamespace, testRoute, parents(gw(testGateway)), hostnames("chat.models.example.com")),
			},
			want: []wantParent{accepted(testNamespace, testGateway)},
		},
		{
			name: "one accepted route makes the parent Accepted; one unpermitted route makes it not ResolvedRefs",
			local: []runtime.Object{
				localGateway,
				route(testNamespace, "good", parents(gw(testGateway))),
				route("team", "cross", parents(gwIn(testNamespace, testGateway))),
			},
			want: []wantParent{{namespace: testNamespace, name: testGateway, kind: "Gateway", accepted: ok, acceptedR: "Accepted", resolved: no, resolvedR: "RefNotPermitted", acceptedMessageContains: "example/good"}},
		},
		{
			name: "backendRefs to an InferencePool or with the group left out are not imports",
			local: []runtime.Object{localGateway, route(testNamespace, testRoute, parents(gw(testGateway)), backends(
				func() gatewayv1.HTTPBackendRef {
					r := importBackend(testNamespace, testPool)
					r.Group = ptr(gatewayv1.Group("inference.networking.k8s.io"))
					r.Kind = ptr(gatewayv1.Kind("InferencePool"))
					return r
				}(),
				func() gatewayv1.HTTPBackendRef {
					r := importBackend(testNamespace, testPool)
					r.Group = nil
					return r
				}(),
			))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp := exporter
			if len(tt.exporterObjects) > 0 {
				exp = member(t, "cluster-a", objects(nsObjects(testNamespace, "team"), readyEPP(testNamespace, testPool), tt.exporterObjects)...)
			}
			team := namespace("team")
			team.Labels = map[string]string{"kubernetes.io/metadata.name": "team", "gateway-access": "granted"}
			local := member(t, "cluster-b", objects(nsObjects(testNamespace, "edge"), []runtime.Object{team}, tt.local)...)
			imp, served := importBothWays(t, clusterSet("cluster-b", exp, local), testNamespace, testPool)
			require.True(t, served)
			require.Len(t, imp.Status.Controllers, 1)
			got := imp.Status.Controllers[0].Parents
			require.Len(t, got, len(tt.want), "parents: %+v", got)
			for i, w := range tt.want {
				p := got[i]
				assert.Equal(t, w.namespace+"/"+w.name, p.ParentRef.Namespace+"/"+p.ParentRef.Name)
				assert.Equal(t, w.kind, p.ParentRef.Kind)
				require.NotNil(t, p.ParentRef.Group)
				assert.Equal(t, v1alpha1.ControllerName, p.ControllerName)
				a := condition(t, p.Conditions, "Accepted")
				r := condition(t, p.Conditions, "ResolvedRefs")
				assert.Equal(t, w.accepted, a.Status, a.Message)
				assert.Equal(t, w.acceptedR, a.Reason, a.Message)
				assert.Equal(t, w.resolved, r.Status, r.Message)
				assert.Equal(t, w.resolvedR, r.Reason, r.Message)
				assert.Contains(t, a.Message, w.acceptedMessageContains)
				assert.NotEmpty(t, a.Message)
				assert.NotEmpty(t, r.Message)
				assert.Equal(t, int64(importGeneration), a.ObservedGeneration)
			}
		})
	}
}

func TestImportBackendRefs(t *testing.T) {
	r := route("team", testRoute, backends(
		importBackend(testNamespace, testPool),
		importBackend(testNamespace, testPool),
		func() gatewayv1.HTTPBackendRef {
			ref := importBackend("", "local-pool")
			ref.Namespace = nil
			return ref
		}(),
	))
	assert.Equal(t, []string{testNamespace + "/" + testPool, "team/local-pool"}, ImportBackendRefs(r))
	assert.Nil(t, ImportBackendRefs(nil))
}

func TestCarryTransitionTimesOfImportParents(t *testing.T) {
	t1 := metav1.NewTime(t0.Add(1))
	t2 := metav1.NewTime(t0.Add(2))
	parentEntry := func(status metav1.ConditionStatus, ltt metav1.Time) inference.ParentStatus {
		return inference.ParentStatus{
			ParentRef:  inference.ParentReference{Group: ptr(gatewayv1.GroupName), Kind: "Gateway", Namespace: testNamespace, Name: testGateway},
			Conditions: []metav1.Condition{{Type: "Accepted", Status: status, LastTransitionTime: ltt}},
		}
	}
	withParent := func(p inference.ParentStatus) *inference.InferencePoolImport {
		return &inference.InferencePoolImport{Status: inference.InferencePoolImportStatus{Controllers: []inference.ImportController{{Name: v1alpha1.ControllerName, Parents: []inference.ParentStatus{p}}}}}
	}

	same := withParent(parentEntry(metav1.ConditionTrue, metav1.Time{}))
	CarryTransitionTimes(withParent(parentEntry(metav1.ConditionTrue, t1)), same, t2)
	assert.Equal(t, t1, same.Status.Controllers[0].Parents[0].Conditions[0].LastTransitionTime, "unchanged status keeps its time")

	flipped := withParent(parentEntry(metav1.ConditionFalse, metav1.Time{}))
	CarryTransitionTimes(withParent(parentEntry(metav1.ConditionTrue, t1)), flipped, t2)
	assert.Equal(t, t2, flipped.Status.Controllers[0].Parents[0].Conditions[0].LastTransitionTime, "a changed status moves its time")
}
