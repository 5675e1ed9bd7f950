package clusterset

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// unrelatedObjects returns a Service and its EndpointSlice as a member's
// apiserver would send them: full objects, with metadata a real cluster
// carries.
func unrelatedObjects(i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("svc-%05d", i)
	meta := func(n string, labels map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Name: n, Namespace: "unrelated", UID: types.UID(fmt.Sprintf("0b5e1c2a-0000-4000-8000-%012d", i)),
			ResourceVersion: fmt.Sprint(100000 + i), CreationTimestamp: metav1.Now(),
			Labels: labels, Annotations: map[string]string{"owner": "team-" + name},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}},
		}
	}
	svc := &corev1.Service{
		ObjectMeta: meta(name, map[string]string{"app": name, "tier": "backend"}),
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.1.1", ClusterIPs: []string{"10.96.1.1"},
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}, {Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  meta(name+"-abcde", map[string]string{discoveryv1.LabelServiceName: name, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}),
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name + "-a", Namespace: "unrelated"}, NodeName: ptr.To("node-1")},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name + "-b", Namespace: "unrelated"}, NodeName: ptr.To("node-2")},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	return svc, slice
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkCacheBytesPerUnrelatedObject measures what one unrelated Service
// and its EndpointSlice cost in a member's cache once trimmed: the object
// and the informer store's index entries. This is the worst case: Services
// of namespaces without InferencePools are not watched at all, so only
// those beside a pool cost this. The bound is 20 MiB for 10,000 of
// each, about 2 KiB per pair.
func BenchmarkCacheBytesPerUnrelatedObject(b *testing.B) {
	const n = 10000
	for i := 0; i < b.N; i++ {
		services := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		slices := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		before := liveHeap()
		for j := 0; j < n; j++ {
			svc, slice := unrelatedObjects(j)
			s, _ := trim(svc)
			e, _ := trim(slice)
			_ = services.Add(s)
			_ = slices.Add(e)
		}
		after := liveHeap()
		b.ReportMetric(float64(after-before)/n, "bytes/pair")
		b.ReportMetric(float64(after-before)/(1<<20), "MiB/10k-pairs")
		runtime.KeepAlive(services)
		runtime.KeepAlive(slices)
	}
}

// routeObject is an HTTPRoute as the local apiserver sends it, with the
// metadata a real cluster carries: to an InferencePoolImport when toImport,
// else to a Service.
func routeObject(i int, toImport bool) *gatewayv1.HTTPRoute {
	name := fmt.Sprintf("route-%05d", i)
	r := &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "apps", UID: types.UID(fmt.Sprintf("0b5e1c2a-0000-4000-8000-%012d", i)),
		ResourceVersion: fmt.Sprint(100000 + i), CreationTimestamp: metav1.Now(),
		Labels: map[string]string{"app": name}, Annotations: map[string]string{"owner": "team-" + name},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}},
	}}
	r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inference-gateway", SectionName: ptr.To(gatewayv1.SectionName("http"))}}
	r.Spec.Hostnames = []gatewayv1.Hostname{"app.example.com"}
	ref := gatewayv1.HTTPBackendRef{}
	ref.Name = gatewayv1.ObjectName(name)
	ref.Port = ptr.To(gatewayv1.PortNumber(8080))
	if toImport {
		ref.Group = ptr.To(gatewayv1.Group("inference.networking.x-k8s.io"))
		ref.Kind = ptr.To(gatewayv1.Kind("InferencePoolImport"))
		ref.Port = nil
	}
	r.Spec.Rules = []gatewayv1.HTTPRouteRule{{
		Matches:     []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/v1")}}},
		BackendRefs: []gatewayv1.HTTPBackendRef{ref},
	}}
	r.Status.Parents = []gatewayv1.RouteParentStatus{{
		ParentRef: r.Spec.ParentRefs[0], ControllerName: "example.net/gateway-controller",
		Conditions: []metav1.Condition{
			{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", Message: "Route is accepted", LastTransitionTime: metav1.Now()},
			{Type: "ResolvedRefs", Status: metav1.ConditionTrue, Reason: "ResolvedRefs", Message: "Resolved all the Object references for the Route", LastTransitionTime: metav1.Now()},
		},
	}}
	return r
}

// BenchmarkCacheBytesPerLocalHTTPRoute measures what one HTTPRoute of the
// local cluster costs in its cache once trimmed, with the route indexes:
// routes to imports keep their parentRefs, import backendRefs and Accepted
// conditions; every other route keeps only its name.
func BenchmarkCacheBytesPerLocalHTTPRoute(b *testing.B) {
	const n = 10000
	for _, toImport := range []bool{false, true} {
		b.Run(fmt.Sprintf("toImport=%v", toImport), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				routes := newNamespacedIndexer(routeIndexers())
				before := liveHeap()
				for j := 0; j < n; j++ {
					r, _ := trim(routeObject(j, toImport))
					_ = routes.Add(r)
				}
				after := liveHeap()
				b.ReportMetric(float64(after-before)/n, "bytes/route")
				runtime.KeepAlive(routes)
			}
		})
	}
}
