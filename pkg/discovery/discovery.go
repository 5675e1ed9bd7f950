// Package discovery finds the model-server instances behind a Service or an
// InferencePool without any store of its own: Kubernetes' EndpointSlices
// (or Pods) are the registry, as seed 002 describes, and each instance
// serves its own metadata at /metadata.
package discovery

import "context"

// Instance is one ready model-server instance.
type Instance struct {
	// ID is the instance's unique identifier: its pod name.
	ID string
	// Namespace of the pod.
	Namespace string
	// Address is the instance's IP address.
	Address string
	// Port is the instance's port when the source knows it (an
	// EndpointSlice's port), 0 otherwise (Pods: the port is the caller's
	// knowledge, an InferencePool's targetPorts for instance).
	Port int32
}

// EventType says whether an instance became available or went away.
type EventType int

const (
	// InstanceAdded: a new instance is ready, or an existing one became ready.
	InstanceAdded EventType = iota
	// InstanceRemoved: an instance stopped being ready or was removed.
	InstanceRemoved
)

// Event is one change in the set of ready instances.
type Event struct {
	Type     EventType
	Instance Instance
}

// ServiceDiscovery lists and watches the ready instances of a target (a
// Service, or the pods an InferencePool selects, depending on the
// implementation).
type ServiceDiscovery interface {
	// List returns the ready instances now.
	List(ctx context.Context) ([]Instance, error)
	// Watch streams changes until ctx ends; the first events describe the
	// instances already ready (as InstanceAdded). The channel is closed when
	// ctx ends.
	Watch(ctx context.Context) (<-chan Event, error)
}
