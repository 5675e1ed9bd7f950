package membermock

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// The objects of one exported pool as a member holds them: the pool, its
// EPP Service (a LoadBalancer with an ingress address, as a cloud
// controller sets it) and the Service's EndpointSlice, whose one endpoint
// is ready or not. The tests apply the same objects to a real member.

// ExportedPool is pool name of namespace, exported to the ClusterSet in
// EndpointMode (exported=false: the same pool without the export
// annotation), whose EPP is Service name+"-epp".
func ExportedPool(namespace, name string, exported bool) *poolv1.InferencePool {
	p := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"pool": name}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: name + "-epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
	if exported {
		p.Annotations = map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
	}
	return p
}

// EPPService is the EPP Service of pool name, reachable at address.
func EPPService(namespace, name, address string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-epp", Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": name + "-epp"},
			Ports: []corev1.ServicePort{
				{Name: "ext-proc", Port: 9002},
				{Name: "grpc-health", Port: 9003},
				{Name: "http-metrics", Port: 9090},
			},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: address}}}},
	}
}

// EPPEndpoints is the EndpointSlice of pool name's EPP Service, with one
// endpoint of the given readiness (an address of a documentation range).
func EPPEndpoints(namespace, name string, ready bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-epp-1", Namespace: namespace, Labels: map[string]string{discoveryv1.LabelServiceName: name + "-epp"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("ext-proc"), Port: ptr.To[int32](9002)}},
	}
}

// Namespace is namespace name.
func Namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// PoolName is the name of a member's i-th pool in a fleet.
func PoolName(i int) string { return fmt.Sprintf("pool-%d", i) }
