package routetable

import (
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// universe generates random objects from a small set of names, so that
// random changes keep hitting the same objects and the references between
// them.
type universe struct {
	r *rand.Rand
}

var (
	uNamespaces = []string{"example", "other"}
	uNames      = []string{"llm", "chat", "code"}
)

func (u universe) pick(xs ...string) string { return xs[u.r.IntN(len(xs))] }

func (u universe) created() metav1.Time {
	return metav1.NewTime(epoch.Add(time.Duration(u.r.IntN(3)) * time.Minute))
}

func (u universe) route() *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{
		Namespace: u.pick(uNamespaces...), Name: u.pick("r0", "r1", "r2", "r3"), CreationTimestamp: u.created(),
	}}
	if u.r.IntN(3) == 0 {
		r.Annotations = map[string]string{}
		switch u.r.IntN(4) {
		case 0:
			r.Annotations[PolicyAnnotation] = u.pick("Weighted", "LocalFirst", "Fastest")
		case 1:
			r.Annotations[ClusterWeightsAnnotation] = u.pick("cluster-a=3", "cluster-c=0,cluster-b=2", "bad")
		case 2:
			r.Annotations[FailureModeAnnotation] = u.pick("FailOpen", "FailClose", "Sometimes")
		}
	}
	for range 1 + u.r.IntN(2) {
		p := gatewayv1.ParentReference{Name: gatewayv1.ObjectName(u.pick("gw", "gw", "other-gw"))}
		if u.r.IntN(3) == 0 {
			p.Namespace = ptr.To(gatewayv1.Namespace(u.pick(uNamespaces...)))
		}
		if u.r.IntN(3) == 0 {
			p.SectionName = ptr.To(gatewayv1.SectionName(u.pick("http", "https", "tcp")))
		}
		if u.r.IntN(4) == 0 {
			p.Port = ptr.To(gatewayv1.PortNumber(u.pick2(80, 443)))
		}
		r.Spec.ParentRefs = append(r.Spec.ParentRefs, p)
	}
	for range u.r.IntN(3) {
		r.Spec.Hostnames = append(r.Spec.Hostnames, gatewayv1.Hostname(u.pick("a.example.com", "*.example.com", "B.example.com", "*.a.example.com")))
	}
	for range 1 + u.r.IntN(3) {
		var rl gatewayv1.HTTPRouteRule
		for range u.r.IntN(3) {
			var m gatewayv1.HTTPRouteMatch
			switch u.r.IntN(6) {
			case 0:
				m = prefix(u.pick("/", "/v1", "/v1/"))
			case 1:
				m = exact(u.pick("/v1/completions", "/v1/chat"))
			case 2:
				m = regex(u.pick("/v[0-9]+/.*", "("))
			case 3:
				m = withHeaders(prefix("/v1"), "x-model", u.pick("chat", "code"))
			case 4:
				m = withMethod(m, "POST")
			}
			rl.Matches = append(rl.Matches, m)
		}
		for range u.r.IntN(4) {
			var ref gatewayv1.HTTPBackendRef
			weight := []*int32{nil, ptr.To[int32](0), ptr.To[int32](1), ptr.To[int32](3)}[u.r.IntN(4)]
			switch u.r.IntN(6) {
			case 0, 1:
				ref = importRef(u.pick(uNames...), weight)
			case 2, 3:
				ref = poolRef(u.pick(uNames...), weight)
			case 4:
				ref = backendRef("", "Service", u.pick(uNames...), weight)
			}
			if u.r.IntN(4) == 0 {
				ref.Namespace = ptr.To(gatewayv1.Namespace(u.pick(uNamespaces...)))
			}
			if u.r.IntN(10) == 0 {
				ref.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier}}
			}
			rl.BackendRefs = append(rl.BackendRefs, ref)
		}
		r.Spec.Rules = append(r.Spec.Rules, rl)
	}
	return r
}

func (u universe) pick2(xs ...int32) int32 { return xs[u.r.IntN(len(xs))] }

// gateway generates a Gateway with listeners of the kinds of allowedRoutes
// Gateway API has: namespaces from Same (also by default), All, Selector
// (matching the labels namespace generates, or invalid), kinds, hostnames.
func (u universe) gateway() *gatewayv1.Gateway {
	g := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: u.pick(uNamespaces...), Name: u.pick("gw", "other-gw")}}
	g.Spec.GatewayClassName = "inference"
	for i := range u.r.IntN(4) {
		l := gatewayv1.Listener{
			Name:     gatewayv1.SectionName(u.pick("http", "https", "tcp")),
			Port:     gatewayv1.PortNumber(u.pick2(80, 443)),
			Protocol: gatewayv1.ProtocolType(u.pick("HTTP", "HTTP", "HTTPS", "TCP")),
		}
		if i > 0 && l.Name == g.Spec.Listeners[0].Name {
			l.Name += "-2"
		}
		if u.r.IntN(2) == 0 {
			l.Hostname = ptr.To(gatewayv1.Hostname(u.pick("*.example.com", "a.example.com", "other.com", "*.a.example.com")))
		}
		switch u.r.IntN(7) {
		case 0:
			// The API's default: from Same.
		case 1:
			l.AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromSame, nil)
		case 2:
			l.AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromAll, nil)
		case 3:
			l.AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromSelector, &metav1.LabelSelector{MatchLabels: map[string]string{"team": u.pick("a", "b")}})
		case 4:
			l.AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromSelector, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "team", Operator: metav1.LabelSelectorOperator(u.pick("Exists", "DoesNotExist", "Bogus"))}}})
		case 5:
			l.AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromSelector, nil)
		case 6:
			l.AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromAll, nil)
			l.AllowedRoutes.Kinds = []gatewayv1.RouteGroupKind{{Kind: gatewayv1.Kind(u.pick("HTTPRoute", "GRPCRoute"))}}
		}
		g.Spec.Listeners = append(g.Spec.Listeners, l)
	}
	return g
}

func (u universe) namespace() *corev1.Namespace {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: u.pick(uNamespaces...)}}
	if u.r.IntN(3) != 0 {
		n.Labels = map[string]string{"team": u.pick("a", "b")}
	}
	return n
}

// referenceGrant generates a ReferenceGrant that allows, or looks like
// it allows, HTTPRoutes of a namespace to refer to pools or imports.
func (u universe) referenceGrant() *gatewayv1beta1.ReferenceGrant {
	g := &gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: u.pick(uNamespaces...), Name: u.pick("g0", "g1")}}
	g.Spec.From = []gatewayv1beta1.ReferenceGrantFrom{{
		Group: gatewayv1.GroupName, Kind: gatewayv1.Kind(u.pick("HTTPRoute", "HTTPRoute", "GRPCRoute")), Namespace: gatewayv1.Namespace(u.pick(uNamespaces...)),
	}}
	for range 1 + u.r.IntN(2) {
		to := gatewayv1beta1.ReferenceGrantTo{Group: InferencePoolImportGroup, Kind: InferencePoolImportKind}
		if u.r.IntN(2) == 0 {
			to.Group, to.Kind = InferencePoolGroup, InferencePoolKind
		}
		if u.r.IntN(2) == 0 {
			to.Name = ptr.To(gatewayv1.ObjectName(u.pick(uNames...)))
		}
		g.Spec.To = append(g.Spec.To, to)
	}
	return g
}

func (u universe) importOf() *v1alpha1.InferencePoolImport {
	imp := &v1alpha1.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Namespace: u.pick(uNamespaces...), Name: u.pick(uNames...), CreationTimestamp: u.created()}}
	if u.r.IntN(4) == 0 {
		imp.Labels = map[string]string{PolicyAnnotation: u.pick("MetricsBased", "Weighted", "nope")}
	}
	for _, name := range []string{"cluster-a", "cluster-b", "cluster-c"} {
		if u.r.IntN(3) == 0 || (name == "cluster-b" && u.r.IntN(3) != 0) {
			continue
		}
		c := v1alpha1.ImportedCluster{Name: name, RoutingMode: v1alpha1.RoutingModeEndpoint, EndpointAddresses: []string{"127.0.0.1"}}
		addr := fmt.Sprintf("127.0.%d.%d", u.r.IntN(2)+1, u.r.IntN(3)+1)
		switch u.r.IntN(6) {
		case 0:
			c.RoutingMode = v1alpha1.RoutingModeParent
			c.Parents = []v1alpha1.ParentImport{{Name: "gw", Service: []v1alpha1.ServiceImport{{Addresses: []string{addr}, Ports: []v1alpha1.Port{{Number: 80}}}}}}
		case 1:
			// No address: the cluster is skipped and reported.
		default:
			c.EndpointPicker.Service = []v1alpha1.ServiceImport{{Addresses: []string{addr}, Ports: []v1alpha1.Port{{Number: 9002}}}}
			c.EndpointPicker.Health = &v1alpha1.HealthEndpoint{Port: 9003}
		}
		c.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionStatus(u.pick("True", "True", "False", "Unknown"))}}
		imp.Status.Clusters = append(imp.Status.Clusters, c)
	}
	return imp
}

func (u universe) pool() *poolv1.InferencePool {
	name := u.pick(uNames...)
	p := pool(name, poolv1.EndpointPickerFailureMode(u.pick("", "FailOpen", "FailClose")))
	p.Namespace = u.pick(uNamespaces...)
	p.Spec.EndpointPickerRef.Name = u.pick(name+"-epp", "mci-sidecar", "mci-sidecar", "missing")
	if u.r.IntN(2) == 0 {
		p.Spec.EndpointPickerRef.Port = nil
	}
	p.Annotations = map[string]string{}
	if u.r.IntN(2) == 0 {
		p.Annotations[LocalEndpointPickerAnnotation] = u.pick(name+"-epp", name+"-epp:9002", "missing", "bad:port")
	}
	if u.r.IntN(4) == 0 {
		p.Annotations[ClusterWeightsAnnotation] = u.pick("cluster-b=2", "x")
	}
	if u.r.IntN(4) == 0 {
		p.Annotations[PolicyAnnotation] = u.pick("LocalFirst", "nope")
	}
	return p
}

func (u universe) service() *corev1.Service {
	s := eppService(u.pick(uNames...), fmt.Sprintf("127.0.9.%d", u.r.IntN(3)+1))
	s.Namespace = u.pick(uNamespaces...)
	switch u.r.IntN(4) {
	case 0:
		s.Name = "mci-sidecar"
	case 1:
		s.Status.LoadBalancer.Ingress = nil
		if u.r.IntN(2) == 0 {
			s.Spec.ClusterIP = ""
		}
	}
	return s
}

func (u universe) model() *v1alpha2.InferenceModel {
	return &v1alpha2.InferenceModel{
		ObjectMeta: metav1.ObjectMeta{Namespace: u.pick(uNamespaces...), Name: u.pick("m0", "m1", "m2", "m3"), CreationTimestamp: u.created()},
		Spec: v1alpha2.InferenceModelSpec{
			ModelName:   u.pick("chat", "code"),
			Criticality: ptr.To(v1alpha2.Criticality(u.pick("Critical", "Standard", "Sheddable"))),
			PoolRef:     v1alpha2.PoolObjectReference{Name: u.pick(uNames...)},
		},
	}
}

func (u universe) objective() *v1alpha2.InferenceObjective {
	o := &v1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Namespace: u.pick(uNamespaces...), Name: u.pick("o0", "o1", "o2"), CreationTimestamp: u.created()},
		Spec: v1alpha2.InferenceObjectiveSpec{
			Priority: ptr.To(int32(u.r.IntN(3) - 1)),
			PoolRef:  v1alpha2.PoolObjectReference{Name: u.pick(uNames...)},
		},
	}
	if u.r.IntN(2) == 0 {
		o.APIVersion = "llm-d.ai/v1alpha2"
	}
	return o
}

// change makes one random change to both the reference state and x.
func (u universe) change(o *objects, x *Incremental) string {
	del := u.r.IntN(4) == 0
	switch u.r.IntN(9) {
	case 0:
		r := u.route()
		k := keyOf(r.Namespace, r.Name)
		if del {
			delete(o.routes, k)
			x.DeleteRoute(k)
			return "delete route " + k.String()
		}
		o.routes[k] = r
		x.SetRoute(r)
		return "set route " + k.String()
	case 1:
		imp := u.importOf()
		k := keyOf(imp.Namespace, imp.Name)
		if del {
			delete(o.imports, k)
			x.DeleteImport(k)
			return "delete import " + k.String()
		}
		o.imports[k] = imp
		x.SetImport(imp)
		return "set import " + k.String()
	case 2:
		p := u.pool()
		k := keyOf(p.Namespace, p.Name)
		if del {
			delete(o.pools, k)
			x.DeletePool(k)
			return "delete pool " + k.String()
		}
		o.pools[k] = p
		x.SetPool(p)
		return "set pool " + k.String()
	case 3:
		s := u.service()
		k := keyOf(s.Namespace, s.Name)
		if del {
			delete(o.services, k)
			x.DeleteService(k)
			return "delete service " + k.String()
		}
		o.services[k] = s
		x.SetService(s)
		return "set service " + k.String()
	case 5:
		g := u.gateway()
		k := keyOf(g.Namespace, g.Name)
		if del {
			delete(o.gateways, k)
			x.DeleteGateway(k)
			return "delete gateway " + k.String()
		}
		o.gateways[k] = g
		x.SetGateway(g)
		return "set gateway " + k.String()
	case 6:
		n := u.namespace()
		k := keyOf("", n.Name)
		if del {
			delete(o.nss, k)
			x.DeleteNamespace(n.Name)
			return "delete namespace " + n.Name
		}
		o.nss[k] = n
		x.SetNamespace(n)
		return fmt.Sprintf("set namespace %s %v", n.Name, n.Labels)
	case 7:
		g := u.referenceGrant()
		k := keyOf(g.Namespace, g.Name)
		if del {
			delete(o.grants, k)
			x.DeleteReferenceGrant(k)
			return "delete grant " + k.String()
		}
		o.grants[k] = g
		x.SetReferenceGrant(g)
		return "set grant " + k.String()
	case 8:
		ob := u.objective()
		k := KeyOfObjective(ob.APIVersion, keyOf(ob.Namespace, ob.Name))
		if del {
			delete(o.objectives, k)
			x.DeleteObjective(k)
			return "delete objective " + k.String()
		}
		o.objectives[k] = ob
		x.SetObjective(ob)
		return "set objective " + k.String()
	default:
		m := u.model()
		k := keyOf(m.Namespace, m.Name)
		if del {
			delete(o.models, k)
			x.DeleteModel(k)
			return "delete model " + k.String()
		}
		o.models[k] = m
		x.SetModel(m)
		return "set model " + k.String()
	}
}
