package sidecar

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// describeTable renders everything of a table that routing reads, so that
// two tables route alike iff their descriptions are equal. It also checks
// that every matcher points at a rule of the table itself.
func describeTable(t *testing.T, tbl *Table) string {
	t.Helper()
	var b strings.Builder
	ruleIndex := func(r *Rule) int {
		i := slices.Index(tbl.rules, r)
		require.GreaterOrEqual(t, i, 0, "a matcher of %s#%d points at a rule that is not in the table", r.Route, r.Index)
		return i
	}
	fmt.Fprintf(&b, "shimMode=%v local=%s\n", tbl.shimMode, tbl.local)
	for i, r := range tbl.rules {
		fmt.Fprintf(&b, "rule %d: %s#%d wrr=%s\n", i, r.Route, r.Index, r.wrr.key)
		for _, be := range r.Backends {
			describeBackend(t, &b, be)
		}
	}
	group := func(name string, ms []*matcher) {
		fmt.Fprintf(&b, "host %q:", name)
		for _, m := range ms {
			fmt.Fprintf(&b, " [rule %d match %d %d%q %q h%d q%d]", ruleIndex(m.rule), m.matchIndex, m.pathKind, m.pathValue, m.method, len(m.headers), len(m.query))
		}
		b.WriteString("\n")
	}
	hosts := make([]string, 0, len(tbl.index.exact))
	for h := range tbl.index.exact {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		group(h, tbl.index.exact[h])
	}
	for _, g := range tbl.index.wildcards {
		group("*"+g.suffix, g.matchers)
	}
	group("", tbl.index.any)
	for _, be := range tbl.shimList {
		b.WriteString("shim ")
		describeBackend(t, &b, be)
		require.Same(t, be, tbl.Shim(types.NamespacedName{Namespace: be.Namespace, Name: be.Name}))
	}
	errs := make([]string, len(tbl.Errors))
	for i, e := range tbl.Errors {
		errs[i] = e.Error()
	}
	sort.Strings(errs)
	for _, e := range errs {
		fmt.Fprintf(&b, "error %s\n", e)
	}
	return b.String()
}

func describeBackend(t *testing.T, b *strings.Builder, be *Backend) {
	fmt.Fprintf(b, "  %s w=%d invalid=%q fm=%s policy=%s shim=%v\n", be, be.Weight, be.Invalid, be.FailureMode, be.Policy, be.Shim)
	for _, c := range be.Clusters {
		fmt.Fprintf(b, "    cluster %+v\n", *c)
	}
	if be.Local != nil {
		fmt.Fprintf(b, "    local %+v\n", *be.Local)
		if be.Shim {
			require.Same(t, be.Clusters[0], be.Local, "a shim's local EPP is its first cluster")
		}
	}
	if be.wrr != nil {
		fmt.Fprintf(b, "    wrr %s\n", be.wrr.key)
	}
	if be.models != nil {
		m, o, _ := be.models.Counts()
		fmt.Fprintf(b, "    models %d objectives %d chat=%d code=%d", m, o, be.Criticality("chat", ""), be.Criticality("code", ""))
		for _, obj := range []string{"o0", "o1", "o2"} {
			fmt.Fprintf(b, " chat/%s=%d", obj, be.Criticality("chat", obj))
		}
		fmt.Fprintln(b)
	}
}

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
		c := v1alpha1.ImportedCluster{Name: name, RoutingMode: v1alpha1.RoutingModeEndpoint}
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

// objects is the reference state: what Build is given.
type objects struct {
	routes   map[types.NamespacedName]*gatewayv1.HTTPRoute
	imports  map[types.NamespacedName]*v1alpha1.InferencePoolImport
	pools    map[types.NamespacedName]*poolv1.InferencePool
	services map[types.NamespacedName]*corev1.Service
	models   map[types.NamespacedName]*v1alpha2.InferenceModel
	gateways map[types.NamespacedName]*gatewayv1.Gateway
	nss      map[types.NamespacedName]*corev1.Namespace
	grants   map[types.NamespacedName]*gatewayv1beta1.ReferenceGrant
	// objectives of both groups.
	objectives map[ObjectiveKey]*v1alpha2.InferenceObjective
}

func newObjects() *objects {
	return &objects{
		routes: map[types.NamespacedName]*gatewayv1.HTTPRoute{}, imports: map[types.NamespacedName]*v1alpha1.InferencePoolImport{},
		pools: map[types.NamespacedName]*poolv1.InferencePool{}, services: map[types.NamespacedName]*corev1.Service{},
		models: map[types.NamespacedName]*v1alpha2.InferenceModel{}, gateways: map[types.NamespacedName]*gatewayv1.Gateway{},
		nss: map[types.NamespacedName]*corev1.Namespace{}, grants: map[types.NamespacedName]*gatewayv1beta1.ReferenceGrant{},
		objectives: map[ObjectiveKey]*v1alpha2.InferenceObjective{},
	}
}

func values[K comparable, T any](m map[K]T) []T {
	out := make([]T, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func (o *objects) inputs(settings Inputs) Inputs {
	in := settings
	in.Routes, in.Imports, in.Pools, in.Services, in.Models = values(o.routes), values(o.imports), values(o.pools), values(o.services), values(o.models)
	in.Gateways, in.Namespaces, in.ReferenceGrants = values(o.gateways), values(o.nss), values(o.grants)
	in.Objectives = values(o.objectives)
	return in
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

func TestIncrementalEqualsBuildOverRandomChanges(t *testing.T) {
	settings := []struct {
		name string
		in   Inputs
	}{
		{name: "every route", in: Inputs{LocalCluster: "cluster-b"}},
		{name: "one gateway's routes", in: Inputs{LocalCluster: "cluster-b", DefaultPolicy: PolicyWeighted,
			ServedGateways: []types.NamespacedName{{Namespace: "example", Name: "gw"}}}},
		{name: "two gateways' routes", in: Inputs{LocalCluster: "cluster-b",
			ServedGateways: []types.NamespacedName{{Namespace: "example", Name: "gw"}, {Namespace: "other", Name: "gw"}}}},
		{name: "EPP shim", in: Inputs{LocalCluster: "cluster-b",
			EndpointPickerServices: []types.NamespacedName{{Namespace: "example", Name: "mci-sidecar"}, {Namespace: "other", Name: "mci-sidecar"}}}},
	}
	const seeds, steps = 20, 100
	for _, s := range settings {
		t.Run(s.name, func(t *testing.T) {
			publications := 0
			// How often the tables met each Gateway API rule, so that the
			// generator is known to exercise them.
			seen := map[string]int{}
			for seed := range uint64(seeds) {
				u := universe{r: rand.New(rand.NewPCG(seed, 42))}
				o := newObjects()
				x := NewIncremental(s.in)
				var history []string
				prev := ""
				for step := range steps {
					// Changes come alone or in bursts, as informer events
					// coalesce.
					for range 1 + u.r.IntN(3) {
						history = append(history, u.change(o, x))
					}
					got, changed := x.Table()
					want, _ := Build(o.inputs(s.in))
					gotDesc, wantDesc := describeTable(t, got), describeTable(t, want)
					countGatewayRules(want, o.routes, seen)
					require.Equal(t, wantDesc, gotDesc, "seed %d step %d after: %s", seed, step, strings.Join(history[max(0, len(history)-6):], "; "))
					if !changed {
						require.Equal(t, prev, gotDesc, "seed %d step %d: an unchanged table must route as the previous one", seed, step)
					} else {
						publications++
					}
					prev = gotDesc
				}
			}
			t.Logf("%d seeds x %d steps: %d new tables; Gateway API rules met: %v", seeds, steps, publications, seen)
			require.Positive(t, seen["granted cross-namespace backendRef"])
			require.Positive(t, seen[ReasonRefNotPermitted])
			if len(s.in.ServedGateways) > 0 {
				for _, what := range []string{"route attached from another namespace", "route narrowed to listener hostnames",
					ReasonNotAllowedByListeners, ReasonNoMatchingListenerHostname, ReasonNoMatchingParent} {
					require.Positive(t, seen[what], what)
				}
			}
		})
	}
}

// countGatewayRules counts what a table shows of the Gateway API rules.
func countGatewayRules(tbl *Table, routes map[types.NamespacedName]*gatewayv1.HTTPRoute, seen map[string]int) {
	for _, err := range tbl.Errors {
		if be, ok := err.(*BuildError); ok {
			seen[be.Reason]++
		}
	}
	for _, rl := range tbl.rules {
		if rl.Route.Namespace != "example" {
			seen["route attached from another namespace"]++
		}
		for _, be := range rl.Backends {
			if be.Namespace != rl.Route.Namespace && be.Invalid == "" {
				seen["granted cross-namespace backendRef"]++
			}
		}
	}
	named := func(ms []*matcher) {
		for _, m := range ms {
			if len(routes[m.rule.Route].Spec.Hostnames) == 0 {
				seen["route narrowed to listener hostnames"]++
			}
		}
	}
	for _, ms := range tbl.index.exact {
		named(ms)
	}
	for _, g := range tbl.index.wildcards {
		named(g.matchers)
	}
}

// A Gateway's status, labels of namespaces no route of the Gateway lives
// in, and ReferenceGrants of namespaces no backendRef crosses into change
// nothing; a change that matters recompiles only the routes it affects.
func TestIncrementalRecompilesOnlyTheRoutesAGatewayAPIChangeAffects(t *testing.T) {
	x := NewIncremental(Inputs{LocalCluster: "cluster-b", ServedGateways: []types.NamespacedName{{Namespace: ns, Name: "inf-gw"}}})
	g := gateway("inf-gw", listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil)))
	x.SetGateway(g)
	local := route("local", 0, []string{"local.example.com"}, rule(nil, importRef("llm", nil)))
	local.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw"}}
	x.SetRoute(local)
	team := route("team", 0, []string{"team.example.com"}, rule(nil, gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
		Group: ptr.To(gatewayv1.Group(InferencePoolImportGroup)), Kind: ptr.To(gatewayv1.Kind(InferencePoolImportKind)), Name: "llm", Namespace: ptr.To(gatewayv1.Namespace(ns)),
	}}}))
	team.Namespace = "team-a"
	team.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw", Namespace: ptr.To(gatewayv1.Namespace(ns))}}
	x.SetRoute(team)
	x.SetImport(importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}))
	x.SetNamespace(labelled("team-a"))
	first, changed := x.Table()
	require.True(t, changed)
	require.Len(t, first.Rules(), 2)
	require.NotEmpty(t, first.Rules()[1].Backends[0].Invalid, "no ReferenceGrant yet")

	status := g.DeepCopy()
	status.Status.Conditions = []metav1.Condition{{Type: "Programmed", Status: metav1.ConditionTrue}}
	x.SetGateway(status)
	x.SetGateway(gateway("other-gw"))
	x.SetNamespace(labelled("team-b", "team", "b"))
	x.SetNamespace(labelled("team-a"))
	x.SetReferenceGrant(&gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "g"}})
	same, changed := x.Table()
	require.False(t, changed, "a Gateway's status, another Gateway, unrelated namespaces and ReferenceGrants make no new table")
	require.Same(t, first, same)

	x.SetReferenceGrant(&gatewayv1beta1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"},
		Spec: gatewayv1beta1.ReferenceGrantSpec{
			From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: "team-a"}},
			To:   []gatewayv1beta1.ReferenceGrantTo{{Group: InferencePoolImportGroup, Kind: InferencePoolImportKind}},
		},
	})
	next, changed := x.Table()
	require.True(t, changed)
	require.Same(t, first.Rules()[0], next.Rules()[0], "the route of the Gateway's namespace is not recompiled")
	require.NotSame(t, first.Rules()[1], next.Rules()[1], "the route whose backendRef the grant allows is")
	require.Empty(t, next.Rules()[1].Backends[0].Invalid)

	g = g.DeepCopy()
	g.Spec.Listeners[0].AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromSame, nil)
	x.SetGateway(g)
	last, changed := x.Table()
	require.True(t, changed)
	require.Len(t, last.Rules(), 1, "from: Same drops the route of another namespace")
	require.Equal(t, "local", last.Rules()[0].Route.Name)
	require.Equal(t, []string{ReasonNotAllowedByListeners}, reasons(last.Errors))
}
