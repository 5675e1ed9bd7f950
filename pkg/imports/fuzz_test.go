package imports

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// fuzzBytes hands out the fuzzer's bytes as small choices; once they run
// out every choice is the first option, so any input builds a ClusterSet.
type fuzzBytes struct{ data []byte }

func (f *fuzzBytes) byte() byte {
	if len(f.data) == 0 {
		return 0
	}
	b := f.data[0]
	f.data = f.data[1:]
	return b
}

func (f *fuzzBytes) intn(n int) int { return int(f.byte()) % n }

func (f *fuzzBytes) bool() bool { return f.byte()&1 == 1 }

func pick[T any](f *fuzzBytes, options ...T) T { return options[f.intn(len(options))] }

// string is one of a few meaningful values, or a short arbitrary one.
func (f *fuzzBytes) string(meaningful ...string) string {
	if i := f.intn(len(meaningful) + 1); i < len(meaningful) {
		return meaningful[i]
	}
	n := f.intn(8)
	b := make([]byte, 0, n)
	for range n {
		b = append(b, f.byte())
	}
	return string(b)
}

func (f *fuzzBytes) port() int32 {
	return pick(f, int32(0), 80, 9002, 9003, 9090, 8000, -1, 65536, int32(f.byte())<<8|int32(f.byte()))
}

var (
	fuzzClusters = []string{"cluster-a", "cluster-b", "cluster-c"}
	// "" is a namespace no object should have; an informer still holds it.
	fuzzNamespaces = []string{"ns0", "ns1", "ns0", "ns1", ""}
	fuzzNames      = []string{"p0", "p1", "epp", "gw"}
)

func (f *fuzzBytes) pool() *poolv1.InferencePool {
	p := &poolv1.InferencePool{ObjectMeta: metav1.ObjectMeta{
		Namespace:         pick(f, fuzzNamespaces...),
		Name:              pick(f, fuzzNames...),
		Generation:        int64(f.intn(4)) - 1,
		CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(f.intn(4)-1) * time.Hour)),
	}}
	// Mostly exported, so that imports are computed more often than not.
	if f.intn(4) != 0 {
		p.Annotations = map[string]string{}
		if f.intn(4) != 0 {
			p.Annotations[v1alpha1.ExportAnnotation] = f.string(v1alpha1.ExportScopeClusterSet, v1alpha1.ExportScopeClusterSet)
		}
		if f.intn(4) == 0 {
			p.Annotations[v1alpha1.ExportModeAnnotation] = f.string(string(inference.RoutingModeEndpoint), string(inference.RoutingModeParent))
		}
	}
	if f.bool() {
		p.Labels = map[string]string{f.string("app"): f.string("x")}
	}
	for range f.intn(3) {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, poolv1.Port{Number: f.port()})
	}
	p.Spec.EndpointPickerRef.Name = f.string("epp", "")
	p.Spec.EndpointPickerRef.Kind = f.string("", "Service")
	if f.bool() {
		p.Spec.EndpointPickerRef.Port = &poolv1.Port{Number: f.port()}
	}
	if f.bool() {
		p.Spec.EndpointPickerRef.Group = ptr(f.string("", "core"))
	}
	for range f.intn(3) {
		ref := poolv1.ParentReference{Name: f.string("gw", ""), Namespace: f.string("", "ns0", "ns1"), Kind: f.string("", "Gateway")}
		if f.bool() {
			ref.Group = ptr(f.string("gateway.networking.k8s.io", ""))
		}
		p.Status.Parents = append(p.Status.Parents, poolv1.ParentStatus{ParentRef: ref})
	}
	return p
}

func (f *fuzzBytes) service() *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: pick(f, fuzzNamespaces...), Name: pick(f, fuzzNames...)}}
	s.Spec.Type = corev1.ServiceType(f.string("", string(corev1.ServiceTypeClusterIP), string(corev1.ServiceTypeLoadBalancer), string(corev1.ServiceTypeExternalName), string(corev1.ServiceTypeNodePort)))
	s.Spec.ClusterIP = f.string("", "None", "10.0.0.1")
	for range f.intn(3) {
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, f.string("", "10.0.0.1", "fd00::1"))
	}
	s.Spec.ExternalName = f.string("", "epp.example.com")
	for range f.intn(3) {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: f.string("", "127.0.0.1"), Hostname: f.string("", "localhost")})
	}
	for range f.intn(4) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: f.string("", "ext-proc", "health", "grpc-health", "metrics", "http-metrics"), Port: f.port()})
	}
	return s
}

func (f *fuzzBytes) slice(seq int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: pick(f, fuzzNamespaces...), Name: fmt.Sprintf("s%d", seq)}}
	if f.bool() {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: f.string("epp", "")}
	}
	for range f.intn(3) {
		var e discoveryv1.Endpoint
		if f.bool() {
			e.Conditions.Ready = ptr(f.bool())
		}
		if f.bool() {
			e.Conditions.Serving = ptr(f.bool())
		}
		if f.bool() {
			e.Addresses = []string{f.string("192.0.2.1")}
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	return s
}

func (f *fuzzBytes) gateway() *gatewayv1.Gateway {
	g := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: pick(f, fuzzNamespaces...), Name: pick(f, fuzzNames...)}}
	for i := range f.intn(3) {
		g.Spec.Listeners = append(g.Spec.Listeners, gatewayv1.Listener{Name: gatewayv1.SectionName(fmt.Sprintf("l%d", i)), Port: f.port()})
	}
	for range f.intn(3) {
		g.Status.Addresses = append(g.Status.Addresses, gatewayv1.GatewayStatusAddress{Value: f.string("", "127.0.0.1")})
	}
	for range f.intn(3) {
		g.Status.Conditions = append(g.Status.Conditions, metav1.Condition{
			Type:   f.string("Programmed", "Accepted"),
			Status: metav1.ConditionStatus(f.string("True", "False", "Unknown")),
		})
	}
	return g
}

func (f *fuzzBytes) route() *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: pick(f, fuzzNamespaces...), Name: pick(f, fuzzNames...)}}
	for range f.intn(3) {
		ref := gatewayv1.ParentReference{Name: gatewayv1.ObjectName(f.string("gw", ""))}
		if f.bool() {
			ref.Namespace = ptr(gatewayv1.Namespace(f.string("ns0", "ns1", "")))
		}
		if f.bool() {
			ref.Kind = ptr(gatewayv1.Kind(f.string("Gateway", "Service")))
		}
		if f.bool() {
			ref.SectionName = ptr(gatewayv1.SectionName(f.string("l0", "l1")))
		}
		if f.bool() {
			ref.Port = ptr(f.port())
		}
		r.Spec.ParentRefs = append(r.Spec.ParentRefs, ref)
		if f.bool() {
			r.Status.Parents = append(r.Status.Parents, gatewayv1.RouteParentStatus{ParentRef: ref, Conditions: []metav1.Condition{{
				Type: "Accepted", Status: metav1.ConditionStatus(f.string("True", "False")), Reason: f.string("Accepted", "NotAllowedByListeners"),
			}}})
		}
	}
	for range f.intn(3) {
		ref := gatewayv1.HTTPBackendRef{}
		ref.Name = gatewayv1.ObjectName(pick(f, fuzzNames...))
		if f.intn(4) != 0 {
			ref.Group = ptr(gatewayv1.Group(f.string(v1alpha1.GroupName, "")))
			ref.Kind = ptr(gatewayv1.Kind(f.string("InferencePoolImport", "InferencePool")))
		}
		if f.bool() {
			ref.Namespace = ptr(gatewayv1.Namespace(f.string("ns0", "ns1", "")))
		}
		r.Spec.Rules = append(r.Spec.Rules, gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref}})
	}
	return r
}

func (f *fuzzBytes) referenceGrant() *gatewayv1beta1.ReferenceGrant {
	g := &gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: pick(f, fuzzNamespaces...), Name: pick(f, fuzzNames...)}}
	g.Spec.From = []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: gatewayv1.Kind(f.string("HTTPRoute", "GRPCRoute")), Namespace: gatewayv1.Namespace(f.string("ns0", "ns1"))}}
	to := gatewayv1.ReferenceGrantTo{Group: v1alpha1.GroupName, Kind: gatewayv1.Kind(f.string("InferencePoolImport", "Service"))}
	if f.bool() {
		to.Name = ptr(gatewayv1.ObjectName(pick(f, fuzzNames...)))
	}
	g.Spec.To = []gatewayv1.ReferenceGrantTo{to}
	return g
}

// fuzzClusterSet builds a ClusterSet of up to three members from data.
func fuzzClusterSet(tb testing.TB, data []byte) ClusterSet {
	f := &fuzzBytes{data: data}
	local := pick(f, fuzzClusters...)
	var members []Member
	seq := 0
	for _, name := range fuzzClusters {
		if f.intn(4) == 0 && name != local {
			continue
		}
		var objs []runtime.Object
		seen := map[string]bool{}
		add := func(o runtime.Object, kind, ns, name string) {
			// An informer holds one object per key.
			if k := kind + "/" + ns + "/" + name; !seen[k] {
				seen[k] = true
				objs = append(objs, o)
			}
		}
		for _, ns := range fuzzNamespaces[:2] {
			if f.intn(4) != 0 {
				add(namespace(ns), "ns", "", ns)
			}
		}
		for range 1 + f.intn(6) {
			switch f.intn(6) {
			case 0:
				p := f.pool()
				add(p, "pool", p.Namespace, p.Name)
			case 1:
				s := f.service()
				add(s, "svc", s.Namespace, s.Name)
			case 2:
				seq++
				s := f.slice(seq)
				add(s, "slice", s.Namespace, s.Name)
			case 3:
				g := f.gateway()
				add(g, "gw", g.Namespace, g.Name)
			case 4:
				r := f.route()
				add(r, "route", r.Namespace, r.Name)
			case 5:
				g := f.referenceGrant()
				add(g, "grant", g.Namespace, g.Name)
			}
		}
		m := member(tb, name, objs...)
		if f.intn(4) == 0 {
			m = unreachable(m, t0, f.string("connection refused"))
		}
		members = append(members, m)
	}
	return clusterSet(local, members...)
}

// FuzzImports computes imports and exports from arbitrary member objects:
// it must never panic, must be deterministic and independent of member
// order, must keep the placement and ordering rules, and must serve only
// conditions the API accepts.
func FuzzImports(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 1, 1, 1, 1, 5, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1})
	f.Add([]byte("\x00\x01\x01\x01\x03\x00\x01\x00\x01\x01\x00\x01\x00\x01\x03\x03\x01\x02\x03\x01\x00\x01\x01\x01\x01\x01\x00"))
	f.Add([]byte("a fairly long seed that walks through many of the choices of the builders above, twice over"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cs := fuzzClusterSet(t, data)
		all := Imports(cs, "")
		require.Equal(t, all, Imports(cs, ""), "Imports is not deterministic")

		reversed := cs
		reversed.Members = slices.Clone(cs.Members)
		slices.Reverse(reversed.Members)
		require.Equal(t, all, Imports(reversed, ""), "Imports depends on the order of members")

		require.True(t, slices.IsSortedFunc(all, func(a, b *inference.InferencePoolImport) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		}), "imports are not sorted by namespace and name")
		local := cs.localMember()
		for _, imp := range all {
			require.True(t, local.hasNamespace(imp.Namespace), "import %s/%s placed where the local cluster lacks the namespace", imp.Namespace, imp.Name)
			require.NotEmpty(t, imp.Status.Clusters, "import %s/%s without clusters", imp.Namespace, imp.Name)
			names := clusterNames(imp)
			require.True(t, slices.IsSorted(names), "clusters of %s/%s not sorted: %v", imp.Namespace, imp.Name, names)
			require.NotContains(t, names, cs.Local, "the local cluster imports its own pool")
			require.Len(t, slices.Compact(slices.Clone(names)), len(names), "duplicate clusters in %s/%s: %v", imp.Namespace, imp.Name, names)

			requireValidConditions(t, imp.Status.Conditions)
			for _, c := range imp.Status.Clusters {
				requireValidConditions(t, c.Conditions)
			}
			parents := imp.Status.Controllers[0].Parents
			require.True(t, slices.IsSortedFunc(parents, func(a, b inference.ParentStatus) int {
				return cmp.Or(cmp.Compare(a.ParentRef.Namespace, b.ParentRef.Namespace), cmp.Compare(a.ParentRef.Name, b.ParentRef.Name),
					cmp.Compare(*a.ParentRef.Group, *b.ParentRef.Group), cmp.Compare(a.ParentRef.Kind, b.ParentRef.Kind))
			}), "parents of %s/%s not sorted", imp.Namespace, imp.Name)
			for i, p := range parents {
				require.NotEmpty(t, p.ParentRef.Name, "a parent without a name")
				require.Len(t, p.Conditions, 2, "a parent has Accepted and ResolvedRefs")
				requireValidConditions(t, p.Conditions)
				if i > 0 {
					require.False(t, sameParentRef(parents[i-1].ParentRef, p.ParentRef), "parent %s listed twice", p.ParentRef.Name)
				}
			}

			one, ok := Import(cs, imp.Namespace, imp.Name)
			require.True(t, ok, "Imports serves %s/%s, Import does not", imp.Namespace, imp.Name)
			require.Equal(t, imp, one, "Import and Imports disagree on %s/%s", imp.Namespace, imp.Name)
		}
		for _, ns := range fuzzNamespaces {
			for _, name := range fuzzNames {
				if _, ok := Import(cs, ns, name); ok {
					require.True(t, slices.ContainsFunc(all, func(i *inference.InferencePoolImport) bool {
						return i.Namespace == ns && i.Name == name
					}), "Import serves %s/%s, Imports does not", ns, name)
				}
			}
		}

		requireSummaryModeAgrees(t, cs)

		exports := Exports(cs, "")
		require.Equal(t, exports, Exports(reversed, ""), "Exports depends on the order of members")
		for _, exp := range exports {
			requireValidConditions(t, exp.Status.Conditions)
			one, ok := Export(cs, exp.Namespace, exp.Name)
			require.True(t, ok)
			require.Equal(t, exp, one, "Export and Exports disagree on %s/%s", exp.Namespace, exp.Name)

			// Every pool with an export has an Exported condition, valid
			// for the API, the same whatever the order of members.
			cond, ok := Exported(cs, exp.Namespace, exp.Name)
			require.True(t, ok, "no Exported condition for %s/%s", exp.Namespace, exp.Name)
			requireValidConditions(t, []metav1.Condition{cond})
			again, _ := Exported(reversed, exp.Namespace, exp.Name)
			require.Equal(t, cond, again, "Exported depends on the order of members")
		}
	})
}
