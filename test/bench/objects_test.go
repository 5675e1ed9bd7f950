package bench

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

var poolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// createEPPService creates a pool's EPP Service (LoadBalancer with
// ingress lbIP when lbIP is set, as a cloud controller would report it)
// and its EndpointSlice with one endpoint of the given readiness, as the
// EndpointSlice controller would write it. The endpoint address is from a
// documentation range: nothing is ever sent to it.
func createEPPService(ctx context.Context, kube kubernetes.Interface, ns, name, lbIP string, ready bool) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{
				{Name: "ext-proc", Port: 9002},
				{Name: "grpc-health", Port: 9003},
				{Name: "http-metrics", Port: 9090},
			},
		},
	}
	if lbIP != "" {
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	}
	created, err := kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Service %s/%s: %w", ns, name, err)
	}
	if lbIP != "" {
		created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
		if _, err := kube.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("writing the status of Service %s/%s: %w", ns, name, err)
		}
	}
	return setEndpointReady(ctx, kube, ns, name, ready)
}

// createModelServerPod creates the pool's model server Pod (labels
// app=pool, matching the pool's selector) and writes its status as a
// kubelet would: Running, Ready, at ip. The sidecar sends the gateway only
// to addresses the exporting cluster publishes for the pool, so the
// simulator's address must be a Pod of it.
func createModelServerPod(ctx context.Context, kube kubernetes.Interface, ns, pool, ip string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pool + "-server-0", Namespace: ns, Labels: map[string]string{"app": pool}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "server", Image: "model-server"}}},
	}
	created, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Pod %s/%s: %w", ns, pod.Name, err)
	}
	created.Status.Phase = corev1.PodRunning
	created.Status.PodIP = ip
	created.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	created.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if _, err := kube.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing the status of Pod %s/%s: %w", ns, pod.Name, err)
	}
	return nil
}

// setEndpointReady writes the EPP Service's EndpointSlice with one endpoint
// of the given readiness: one write, as the EndpointSlice controller does
// on a readiness flap.
func setEndpointReady(ctx context.Context, kube kubernetes.Interface, ns, service string, ready bool) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: service + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("ext-proc"), Port: ptr.To[int32](9002)}},
	}
	api := kube.DiscoveryV1().EndpointSlices(ns)
	existing, err := api.Get(ctx, slice.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, slice, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	existing.Endpoints = slice.Endpoints
	_, err = api.Update(ctx, existing, metav1.UpdateOptions{})
	return err
}
