package discovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// endpoint is a test endpoint: ready nil leaves conditions.ready unset.
func endpoint(pod, address string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{address},
		Conditions: discoveryv1.EndpointConditions{Ready: ready},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: "ns"},
	}
}

func slice(name string, port int32, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ns",
			Labels: map[string]string{discoveryv1.LabelServiceName: "svc"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port)}},
	}
}

// TestEndpointSliceEventMapping drives seed 002's event mapping table
// through sequences of EndpointSlice states, each the whole set of the
// Service's slices after one change, as the watch loop sees them.
func TestEndpointSliceEventMapping(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	inst := func(pod, address string) Instance {
		return Instance{ID: pod, Namespace: "ns", Address: address, Port: 8000}
	}
	added := func(pod, address string) Event { return Event{Type: InstanceAdded, Instance: inst(pod, address)} }
	removed := func(pod, address string) Event { return Event{Type: InstanceRemoved, Instance: inst(pod, address)} }

	type step struct {
		slices []*discoveryv1.EndpointSlice
		want   []Event
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "an endpoint added with ready true is InstanceAdded",
			steps: []step{
				{slices: nil, want: nil},
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes))), want: []Event{added("a", "192.0.2.1")}},
			},
		},
		{
			name: "an endpoint added with ready unset is ready, as the API says",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", nil))), want: []Event{added("a", "192.0.2.1")}},
			},
		},
		{
			name: "an endpoint added not ready is silent until its condition changes to ready",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", no))), want: nil},
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes))), want: []Event{added("a", "192.0.2.1")}},
			},
		},
		{
			name: "a condition changing to ready false is InstanceRemoved, and back to true InstanceAdded",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes), endpoint("b", "192.0.2.2", yes))), want: []Event{added("a", "192.0.2.1"), added("b", "192.0.2.2")}},
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", no), endpoint("b", "192.0.2.2", yes))), want: []Event{removed("a", "192.0.2.1")}},
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes), endpoint("b", "192.0.2.2", yes))), want: []Event{added("a", "192.0.2.1")}},
			},
		},
		{
			name: "an endpoint removed from its slice is InstanceRemoved",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes), endpoint("b", "192.0.2.2", yes))), want: []Event{added("a", "192.0.2.1"), added("b", "192.0.2.2")}},
				{slices: sl(slice("s1", 8000, endpoint("b", "192.0.2.2", yes))), want: []Event{removed("a", "192.0.2.1")}},
			},
		},
		{
			name: "a deleted slice removes its ready endpoints only",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes), endpoint("c", "192.0.2.3", no)), slice("s2", 8000, endpoint("b", "192.0.2.2", yes))), want: []Event{added("a", "192.0.2.1"), added("b", "192.0.2.2")}},
				{slices: sl(slice("s2", 8000, endpoint("b", "192.0.2.2", yes))), want: []Event{removed("a", "192.0.2.1")}},
			},
		},
		{
			name: "an endpoint moving to another slice of the Service is silent",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes), endpoint("b", "192.0.2.2", yes))), want: []Event{added("a", "192.0.2.1"), added("b", "192.0.2.2")}},
				// The controller adds it to s2 first ...
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes), endpoint("b", "192.0.2.2", yes)), slice("s2", 8000, endpoint("b", "192.0.2.2", yes))), want: nil},
				// ... then drops it from s1.
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes)), slice("s2", 8000, endpoint("b", "192.0.2.2", yes))), want: nil},
			},
		},
		{
			name: "an endpoint ready in one slice and not ready in another is ready",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", no)), slice("s2", 8000, endpoint("a", "192.0.2.1", yes))), want: []Event{added("a", "192.0.2.1")}},
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", no)), slice("s2", 8000, endpoint("a", "192.0.2.1", no))), want: []Event{removed("a", "192.0.2.1")}},
			},
		},
		{
			name: "a pod recreated under the same name with a new address is removed then added",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes))), want: []Event{added("a", "192.0.2.1")}},
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.7", yes))), want: []Event{removed("a", "192.0.2.1"), added("a", "192.0.2.7")}},
			},
		},
		{
			name: "an unrelated change to a slice is silent",
			steps: []step{
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes))), want: []Event{added("a", "192.0.2.1")}},
				{slices: sl(slice("s1", 8000, endpoint("a", "192.0.2.1", yes), endpoint("z", "192.0.2.26", no))), want: nil},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			emitted := map[string]Instance{}
			for i, s := range tt.steps {
				current := ReadyEndpoints(s.slices, "")
				assert.Equal(t, s.want, Diff(emitted, current), "step %d", i)
				emitted = current
			}
		})
	}
}

func sl(s ...*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice { return s }

func TestReadyEndpoints(t *testing.T) {
	yes := ptr.To(true)
	tests := []struct {
		name     string
		slices   []*discoveryv1.EndpointSlice
		portName string
		want     map[string]Instance
	}{
		{
			name:   "the instance ID is the target pod and the address the first one",
			slices: sl(slice("s1", 8000, discoveryv1.Endpoint{Addresses: []string{"192.0.2.1", "192.0.2.100"}, TargetRef: &corev1.ObjectReference{Name: "pod-a", Namespace: "other"}})),
			want:   map[string]Instance{"pod-a": {ID: "pod-a", Namespace: "other", Address: "192.0.2.1", Port: 8000}},
		},
		{
			name:   "an endpoint without a target is identified by its address, in the slice's namespace",
			slices: sl(slice("s1", 8000, discoveryv1.Endpoint{Addresses: []string{"192.0.2.1"}, Conditions: discoveryv1.EndpointConditions{Ready: yes}})),
			want:   map[string]Instance{"192.0.2.1": {ID: "192.0.2.1", Namespace: "ns", Address: "192.0.2.1", Port: 8000}},
		},
		{
			name:   "an endpoint without addresses is ignored",
			slices: sl(slice("s1", 8000, discoveryv1.Endpoint{TargetRef: &corev1.ObjectReference{Name: "pod-a"}})),
			want:   map[string]Instance{},
		},
		{
			name: "an instance listed by two slices takes its details from the first slice by name",
			slices: sl(
				slice("s2", 9000, endpoint("a", "192.0.2.2", yes)),
				slice("s1", 8000, endpoint("a", "192.0.2.1", yes)),
			),
			want: map[string]Instance{"a": {ID: "a", Namespace: "ns", Address: "192.0.2.1", Port: 8000}},
		},
		{
			name: "PortName picks the named port",
			slices: func() []*discoveryv1.EndpointSlice {
				s := slice("s1", 8000, endpoint("a", "192.0.2.1", yes))
				s.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To[int32](9000)}, {Name: ptr.To("metrics"), Port: ptr.To[int32](9090)}}
				return sl(s)
			}(),
			portName: "metrics",
			want:     map[string]Instance{"a": {ID: "a", Namespace: "ns", Address: "192.0.2.1", Port: 9090}},
		},
		{
			name: "a slice without ports gives port 0",
			slices: func() []*discoveryv1.EndpointSlice {
				s := slice("s1", 8000, endpoint("a", "192.0.2.1", yes))
				s.Ports = nil
				return sl(s)
			}(),
			want: map[string]Instance{"a": {ID: "a", Namespace: "ns", Address: "192.0.2.1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, ReadyEndpoints(tt.slices, tt.portName))
		})
	}
}
