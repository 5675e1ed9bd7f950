package discovery

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

// PodDiscovery discovers the ready instances among the pods a label selector
// picks in one namespace, as the upstream EPP does for an InferencePool's
// selector. It keeps the ServiceDiscovery contract of EndpointSliceDiscovery
// and is what the local ClusterSet needs: EndpointSlices there cannot carry
// the loopback addresses the simulated pods listen on, while a Pod's
// status.podIP can.
//
// A pod is ready when it is not being deleted, has a status.podIP and its
// Ready condition is True. Its instance ID is the pod name and its address
// status.podIP; Instance.Port is 0.
type PodDiscovery struct {
	client    kubernetes.Interface
	namespace string
	selector  labels.Selector
}

var _ ServiceDiscovery = &PodDiscovery{}

// NewPodDiscovery returns a discovery of the ready pods in namespace whose
// labels include selector. An empty selector selects every pod of the
// namespace.
func NewPodDiscovery(client kubernetes.Interface, namespace string, selector map[string]string) *PodDiscovery {
	return &PodDiscovery{client: client, namespace: namespace, selector: labels.SelectorFromSet(maps.Clone(selector))}
}

func (d *PodDiscovery) String() string {
	return fmt.Sprintf("Pods %s in namespace %s", d.selector, d.namespace)
}

// List reads the selected pods from the API server and returns the ready
// instances in ID order.
func (d *PodDiscovery) List(ctx context.Context) ([]Instance, error) {
	list, err := d.client.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{LabelSelector: d.selector.String()})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", d, err)
	}
	items := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		items[i] = &list.Items[i]
	}
	return sortedInstances(ReadyPods(items)), nil
}

// Watch streams the changes of the ready set through an informer on the
// selected pods, starting with every ready instance as InstanceAdded. It
// fails at once if the pods cannot be listed.
func (d *PodDiscovery) Watch(ctx context.Context) (<-chan Event, error) {
	if _, err := d.client.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{LabelSelector: d.selector.String(), Limit: 1}); err != nil {
		return nil, fmt.Errorf("listing %s: %w", d, err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(d.client, 0,
		informers.WithNamespace(d.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = d.selector.String() }),
	)
	podInformer := factory.Core().V1().Pods()
	return watchReadySet(ctx, d.String(), factory, podInformer.Informer(), func() (map[string]Instance, error) {
		items, err := podInformer.Lister().Pods(d.namespace).List(labels.Everything())
		if err != nil {
			return nil, err
		}
		return ReadyPods(items), nil
	})
}

// ReadyPods maps pods to their ready instances, keyed by pod name.
func ReadyPods(items []*corev1.Pod) map[string]Instance {
	ready := map[string]Instance{}
	for _, p := range items {
		if podReady(p) {
			ready[p.Name] = Instance{ID: p.Name, Namespace: p.Namespace, Address: p.Status.PodIP}
		}
	}
	return ready
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
