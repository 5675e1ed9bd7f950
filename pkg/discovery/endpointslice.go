package discovery

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

// EndpointSliceDiscovery discovers the ready instances behind a Service from
// its EndpointSlices, the ones labelled kubernetes.io/service-name=<Service>:
// seed 002's Kubernetes implementation of ServiceDiscovery. Kubernetes keeps
// the slices in step with the pods' readiness probes, so an instance that
// calls InstanceHandle.SetReady shows up here without any store of ours.
//
// An endpoint is ready when its conditions.ready is true or unset (the
// EndpointSlice API says consumers must read unset as ready). Its instance
// ID is targetRef.name, the pod name; an endpoint without a targetRef (a
// slice written by hand or by another controller) is identified by its
// address. An endpoint without addresses is ignored.
//
// The ready set is computed across all the Service's slices, so an endpoint
// that the EndpointSlice controller moves from one slice to another causes
// no event; an endpoint ready in one slice is ready even if another slice
// still lists it as not ready.
type EndpointSliceDiscovery struct {
	client    kubernetes.Interface
	namespace string
	service   string

	// PortName chooses which of a slice's ports becomes Instance.Port; the
	// first port with a number when empty.
	PortName string
}

var _ ServiceDiscovery = &EndpointSliceDiscovery{}

// NewEndpointSliceDiscovery returns a discovery of the ready instances of
// Service namespace/service.
func NewEndpointSliceDiscovery(client kubernetes.Interface, namespace, service string) *EndpointSliceDiscovery {
	return &EndpointSliceDiscovery{client: client, namespace: namespace, service: service}
}

func (d *EndpointSliceDiscovery) selector() string {
	return labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: d.service}).String()
}

func (d *EndpointSliceDiscovery) String() string {
	return fmt.Sprintf("EndpointSlices of Service %s/%s", d.namespace, d.service)
}

// List reads the Service's EndpointSlices from the API server and returns
// the ready instances in ID order.
func (d *EndpointSliceDiscovery) List(ctx context.Context) ([]Instance, error) {
	list, err := d.client.DiscoveryV1().EndpointSlices(d.namespace).List(ctx, metav1.ListOptions{LabelSelector: d.selector()})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", d, err)
	}
	items := make([]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		items[i] = &list.Items[i]
	}
	return sortedInstances(ReadyEndpoints(items, d.PortName)), nil
}

// Watch streams the changes of the ready set through an informer on the
// Service's EndpointSlices, starting with every ready instance as
// InstanceAdded. It fails at once if the slices cannot be listed (no
// permission, say) rather than retrying in the background as an informer
// would.
func (d *EndpointSliceDiscovery) Watch(ctx context.Context) (<-chan Event, error) {
	if _, err := d.client.DiscoveryV1().EndpointSlices(d.namespace).List(ctx, metav1.ListOptions{LabelSelector: d.selector(), Limit: 1}); err != nil {
		return nil, fmt.Errorf("listing %s: %w", d, err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(d.client, 0,
		informers.WithNamespace(d.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = d.selector() }),
	)
	sliceInformer := factory.Discovery().V1().EndpointSlices()
	return watchReadySet(ctx, d.String(), factory, sliceInformer.Informer(), func() (map[string]Instance, error) {
		items, err := sliceInformer.Lister().EndpointSlices(d.namespace).List(labels.Everything())
		if err != nil {
			return nil, err
		}
		return ReadyEndpoints(items, d.PortName), nil
	})
}

// ReadyEndpoints maps EndpointSlices to their ready instances, keyed by ID.
// Slices are read in name order so that an instance listed by several
// slices always takes its address and port from the same one.
func ReadyEndpoints(items []*discoveryv1.EndpointSlice, portName string) map[string]Instance {
	items = slices.SortedFunc(slices.Values(items), func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Compare(a.Name, b.Name)
	})
	ready := map[string]Instance{}
	for _, s := range items {
		port := slicePort(s, portName)
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 || (ep.Conditions.Ready != nil && !*ep.Conditions.Ready) {
				continue
			}
			inst := Instance{ID: ep.Addresses[0], Namespace: s.Namespace, Address: ep.Addresses[0], Port: port}
			if ref := ep.TargetRef; ref != nil && ref.Name != "" {
				inst.ID = ref.Name
				if ref.Namespace != "" {
					inst.Namespace = ref.Namespace
				}
			}
			if _, seen := ready[inst.ID]; !seen {
				ready[inst.ID] = inst
			}
		}
	}
	return ready
}

// slicePort is the number of the slice's port named name, or of its first
// numbered port when name is empty; 0 when there is none.
func slicePort(s *discoveryv1.EndpointSlice, name string) int32 {
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		if name == "" || (p.Name != nil && *p.Name == name) {
			return *p.Port
		}
	}
	return 0
}
