package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=infpool
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1173"

// InferencePool is a group of model-server Pods behind an Endpoint Picker.
type InferencePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferencePoolSpec   `json:"spec,omitempty"`
	Status InferencePoolStatus `json:"status,omitempty"`
}

// InferencePoolSpec is the desired state of an InferencePool.
type InferencePoolSpec struct {
	// Selector picks the Pods that are members of the pool.
	// +kubebuilder:validation:Required
	Selector LabelSelector `json:"selector"`

	// TargetPorts are the ports the model servers listen on. The first one
	// is the port traffic is sent to.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	TargetPorts []Port `json:"targetPorts"`

	// AppProtocol is the protocol model servers speak.
	// +optional
	// +kubebuilder:validation:Enum=http;kubernetes.io/h2c
	AppProtocol AppProtocol `json:"appProtocol,omitempty"`

	// EndpointPickerRef is the Endpoint Picker (usually a Service) that
	// chooses a model server for each request.
	// +kubebuilder:validation:Required
	EndpointPickerRef EndpointPickerRef `json:"endpointPickerRef"`
}

// LabelSelector selects Pods by their labels.
type LabelSelector struct {
	// MatchLabels are the labels a member Pod carries.
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	MatchLabels map[string]string `json:"matchLabels"`
}

// Port is a port number.
type Port struct {
	// Number of the port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Number int32 `json:"number"`
}

// AppProtocol is the application protocol of the model servers.
type AppProtocol string

const (
	// AppProtocolHTTP is HTTP/1.1.
	AppProtocolHTTP AppProtocol = "http"
	// AppProtocolH2C is HTTP/2 over cleartext.
	AppProtocolH2C AppProtocol = "kubernetes.io/h2c"
)

// EndpointPickerRef names the Endpoint Picker of a pool.
type EndpointPickerRef struct {
	// Group of the referent; "" is the core group.
	// +optional
	// +kubebuilder:default=""
	Group *string `json:"group,omitempty"`

	// Kind of the referent.
	// +optional
	// +kubebuilder:default=Service
	Kind string `json:"kind,omitempty"`

	// Name of the referent in the pool's namespace.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Port of the Endpoint Picker's ext-proc service. Required when Kind is Service.
	// +optional
	Port *Port `json:"port,omitempty"`

	// FailureMode says what a gateway does when the Endpoint Picker fails.
	// +optional
	// +kubebuilder:default=FailClose
	FailureMode EndpointPickerFailureMode `json:"failureMode,omitempty"`
}

// EndpointPickerFailureMode is what a gateway does when the Endpoint Picker fails.
// +kubebuilder:validation:Enum=FailOpen;FailClose
type EndpointPickerFailureMode string

const (
	// FailOpen sends the request to any model server of the pool.
	FailOpen EndpointPickerFailureMode = "FailOpen"
	// FailClose fails the request.
	FailClose EndpointPickerFailureMode = "FailClose"
)

// InferencePoolStatus is the observed state of an InferencePool.
type InferencePoolStatus struct {
	// Parents are the Gateways that reference the pool, as their controllers report them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Parents []ParentStatus `json:"parents,omitempty"`
}

// ParentStatus is the status of the pool with respect to one parent.
type ParentStatus struct {
	// Conditions of the pool for this parent (Accepted, ResolvedRefs).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ParentRef names the parent, usually a Gateway.
	// +kubebuilder:validation:Required
	ParentRef ParentReference `json:"parentRef"`

	// ControllerName is the controller that wrote this entry.
	// +optional
	ControllerName string `json:"controllerName,omitempty"`
}

// ParentReference names a parent of the pool.
type ParentReference struct {
	// Group of the parent.
	// +optional
	// +kubebuilder:default=gateway.networking.k8s.io
	Group *string `json:"group,omitempty"`

	// Kind of the parent.
	// +optional
	// +kubebuilder:default=Gateway
	Kind string `json:"kind,omitempty"`

	// Name of the parent.
	// +kubebuilder:validation:Required
	Name string `json:"name"`

	// Namespace of the parent; the pool's namespace when empty.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// InferencePoolList is a list of InferencePools.
type InferencePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferencePool `json:"items"`
}
