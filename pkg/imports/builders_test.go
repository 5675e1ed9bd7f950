package imports

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	gatewaylisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	gatewaylistersv1beta1 "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	poollisters "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
)

// Test fixtures: small builders so each case says only what matters to it.

const (
	testClusterSet = "test-set"
	testNamespace  = "example"
	testPool       = "llm-pool"
	testEPP        = "epp"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func newIndexer() cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// member builds a Member whose listers are backed by real client-go
// indexers holding objs (Namespaces, InferencePools, Services,
// EndpointSlices, Gateways and BackendTLSPolicies, in any order).
func member(tb testing.TB, name string, objs ...runtime.Object) Member {
	tb.Helper()
	nss, pools, svcs, eps, gws, grants, btls, pods := newIndexer(), newIndexer(), newIndexer(), newIndexer(), newIndexer(), newIndexer(), newIndexer(), newIndexer()
	routes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{RoutesByImportIndex: RoutesByImport})
	for _, o := range objs {
		var err error
		switch o.(type) {
		case *corev1.Namespace:
			err = nss.Add(o)
		case *poolv1.InferencePool:
			err = pools.Add(o)
		case *corev1.Service:
			err = svcs.Add(o)
		case *discoveryv1.EndpointSlice:
			err = eps.Add(o)
		case *gatewayv1.Gateway:
			err = gws.Add(o)
		case *gatewayv1.HTTPRoute:
			err = routes.Add(o)
		case *gatewayv1beta1.ReferenceGrant:
			err = grants.Add(o)
		case *gatewayv1.BackendTLSPolicy:
			err = btls.Add(o)
		case *corev1.Pod:
			err = pods.Add(o)
		default:
			tb.Fatalf("member %s: unexpected object %T", name, o)
		}
		require.NoError(tb, err)
	}
	return Member{
		Name:            name,
		Namespaces:      corev1listers.NewNamespaceLister(nss),
		Pools:           poollisters.NewInferencePoolLister(pools),
		Services:        corev1listers.NewServiceLister(svcs),
		EndpointSlices:  discoverylisters.NewEndpointSliceLister(eps),
		Pods:            corev1listers.NewPodLister(pods),
		Gateways:        gatewaylisters.NewGatewayLister(gws),
		Routes:          NewRouteIndex(routes),
		ReferenceGrants: gatewaylistersv1beta1.NewReferenceGrantLister(grants),

		BackendTLSPolicies: gatewaylisters.NewBackendTLSPolicyLister(btls),
	}
}

func unreachable(m Member, since time.Time, msg string) Member {
	m.Unreachable = &Unreachable{Since: since, Message: msg}
	return m
}

// rejecting flags m as refusing mci-apiserver's credentials since since.
func rejecting(m Member, since time.Time, msg string) Member {
	m.Unreachable = &Unreachable{Since: since, Message: msg, CredentialsRejected: true}
	return m
}

// clusterSet builds the ClusterSet seen from local, members sorted by name.
func clusterSet(local string, members ...Member) ClusterSet {
	slices.SortFunc(members, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return ClusterSet{Name: testClusterSet, Local: local, Members: members}
}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// terminating marks ns as being deleted, as `kubectl delete namespace` does
// until the namespace controller has emptied it.
func terminating(ns *corev1.Namespace) *corev1.Namespace {
	now := metav1.NewTime(t0)
	ns.DeletionTimestamp = &now
	ns.Status.Phase = corev1.NamespaceTerminating
	return ns
}

type poolOption func(*poolv1.InferencePool)

// pool is an InferencePool exported to the ClusterSet in the default mode,
// with an EPP Service "epp" on port 9002 and model servers on 8000.
func pool(ns, name string, opts ...poolOption) *poolv1.InferencePool {
	p := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         ns,
			Name:              name,
			Generation:        1,
			CreationTimestamp: metav1.NewTime(t0),
			Annotations:       map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet},
		},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: testEPP, Port: &poolv1.Port{Number: 9002}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func annotations(a map[string]string) poolOption {
	return func(p *poolv1.InferencePool) { p.Annotations = a }
}

func mode(m inference.RoutingMode) poolOption {
	return func(p *poolv1.InferencePool) { p.Annotations[v1alpha1.ExportModeAnnotation] = string(m) }
}

func parentMode(parents ...poolv1.ParentReference) poolOption {
	return func(p *poolv1.InferencePool) {
		p.Annotations[v1alpha1.ExportModeAnnotation] = string(inference.RoutingModeParent)
		for _, ref := range parents {
			p.Status.Parents = append(p.Status.Parents, poolv1.ParentStatus{ParentRef: ref})
		}
	}
}

func gatewayRef(ns, name string) poolv1.ParentReference {
	return poolv1.ParentReference{Namespace: ns, Name: name}
}

func eppRef(ref poolv1.EndpointPickerRef) poolOption {
	return func(p *poolv1.InferencePool) { p.Spec.EndpointPickerRef = ref }
}

func targetPorts(ports ...int32) poolOption {
	return func(p *poolv1.InferencePool) {
		p.Spec.TargetPorts = nil
		for _, n := range ports {
			p.Spec.TargetPorts = append(p.Spec.TargetPorts, poolv1.Port{Number: n})
		}
	}
}

func created(t time.Time) poolOption {
	return func(p *poolv1.InferencePool) { p.CreationTimestamp = metav1.NewTime(t) }
}

func labelled(l map[string]string) poolOption {
	return func(p *poolv1.InferencePool) { p.Labels = l }
}

func generation(g int64) poolOption {
	return func(p *poolv1.InferencePool) { p.Generation = g }
}

type serviceOption func(*corev1.Service)

// service is a ClusterIP EPP Service with the conventional ports: ext-proc
// 9002, health 9003, metrics 9090.
func service(ns, name string, opts ...serviceOption) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{
				{Name: "ext-proc", Port: 9002},
				{Name: "health", Port: 9003},
				{Name: "metrics", Port: 9090},
			},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func ofType(t corev1.ServiceType) serviceOption {
	return func(s *corev1.Service) { s.Spec.Type = t }
}

func clusterIPs(ips ...string) serviceOption {
	return func(s *corev1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ""
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
	}
}

func ingress(ings ...corev1.LoadBalancerIngress) serviceOption {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = ings
	}
}

func externalName(host string) serviceOption {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeExternalName
		s.Spec.ExternalName = host
		s.Spec.ClusterIP = ""
		s.Spec.ClusterIPs = nil
	}
}

func ports(ps ...corev1.ServicePort) serviceOption {
	return func(s *corev1.Service) { s.Spec.Ports = ps }
}

func port(name string, n int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: n}
}

var sliceSeq int

// slice is an EndpointSlice of Service ns/svc with one endpoint per entry of
// ready (nil: conditions.ready unset), addresses from 192.0.2.0/24.
func slice(ns, svc string, ready ...*bool) *discoveryv1.EndpointSlice {
	sliceSeq++
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns,
			Name:      fmt.Sprintf("%s-%d", svc, sliceSeq),
			Labels:    map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for i, r := range ready {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("192.0.2.%d", i+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: r},
		})
	}
	return s
}

func ptr[T any](v T) *T { return &v }

var (
	isReady    = ptr(true)
	isNotReady = ptr(false)
	readyUnset *bool
)

type gatewayOption func(*gatewayv1.Gateway)

// gateway is a Gateway with the given listener ports, no address and no
// conditions until options add them.
func gateway(ns, name string, listenerPorts []int32, opts ...gatewayOption) *gatewayv1.Gateway {
	g := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for i, p := range listenerPorts {
		g.Spec.Listeners = append(g.Spec.Listeners, gatewayv1.Listener{
			Name:     gatewayv1.SectionName(fmt.Sprintf("l%d", i)),
			Port:     p,
			Protocol: gatewayv1.HTTPProtocolType,
		})
	}
	for _, o := range opts {
		o(g)
	}
	return g
}

func addresses(values ...string) gatewayOption {
	return func(g *gatewayv1.Gateway) {
		for _, v := range values {
			g.Status.Addresses = append(g.Status.Addresses, gatewayv1.GatewayStatusAddress{Value: v})
		}
	}
}

func programmed(status metav1.ConditionStatus) gatewayOption {
	return func(g *gatewayv1.Gateway) {
		g.Status.Conditions = append(g.Status.Conditions,
			metav1.Condition{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.NewTime(t0)},
			metav1.Condition{Type: "Programmed", Status: status, Reason: "Programmed", LastTransitionTime: metav1.NewTime(t0)},
		)
	}
}

// readyEPP is everything an exporting cluster needs for a Ready EndpointMode
// export of ns/name: the namespace, the pool, its Service and a ready slice.
func readyEPP(ns, name string, opts ...poolOption) []runtime.Object {
	return []runtime.Object{
		pool(ns, name, opts...),
		service(ns, testEPP),
		slice(ns, testEPP, isReady),
	}
}

func objects(groups ...[]runtime.Object) []runtime.Object {
	var out []runtime.Object
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

func nsObjects(names ...string) []runtime.Object {
	out := make([]runtime.Object, 0, len(names))
	for _, n := range names {
		out = append(out, namespace(n))
	}
	return out
}

// condition finds a condition by type, failing the test when it is absent.
func condition(tb testing.TB, conds []metav1.Condition, t string) metav1.Condition {
	tb.Helper()
	for _, c := range conds {
		if c.Type == t {
			return c
		}
	}
	require.Failf(tb, "condition not found", "no %s condition in %+v", t, conds)
	return metav1.Condition{}
}

func clusterNames(imp *inference.InferencePoolImport) []string {
	var out []string
	for _, c := range imp.Status.Clusters {
		out = append(out, c.Name)
	}
	return out
}

// importBothWays computes the import through Import and through Imports
// (which reads EndpointSlices differently) and requires the same answer,
// and the same again when the other members publish summaries.
func importBothWays(tb testing.TB, cs ClusterSet, ns, name string) (*inference.InferencePoolImport, bool) {
	tb.Helper()
	one, ok := Import(cs, ns, name)
	var fromList *inference.InferencePoolImport
	for _, imp := range Imports(cs, "") {
		if imp.Namespace == ns && imp.Name == name {
			fromList = imp
		}
	}
	fromSummaries, summaryOK := Import(summaryMode(tb, cs), ns, name)
	require.Equal(tb, ok, summaryOK, "Import of %s/%s in summary mode", ns, name)
	if !ok {
		require.Nil(tb, fromList, "Imports serves %s/%s but Import does not", ns, name)
		return nil, false
	}
	require.Equal(tb, one, fromList, "Import and Imports disagree on %s/%s", ns, name)
	require.Equal(tb, one, fromSummaries, "Import of %s/%s differs in summary mode", ns, name)
	return one, true
}
