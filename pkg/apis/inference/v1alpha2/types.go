package v1alpha2

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=infmodel
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.modelName`
// +kubebuilder:printcolumn:name="Criticality",type=string,JSONPath=`.spec.criticality`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`

// InferenceModel maps a user-facing model name to the backend models of an
// InferencePool, with a criticality and traffic-split weights.
type InferenceModel struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferenceModelSpec   `json:"spec,omitempty"`
	Status InferenceModelStatus `json:"status,omitempty"`
}

// InferenceModelSpec is the desired state of an InferenceModel.
type InferenceModelSpec struct {
	// ModelName is the name of the model as users set it in the "model"
	// field of a request body.
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Required
	ModelName string `json:"modelName"`

	// Criticality of requests for this model.
	// +optional
	Criticality *Criticality `json:"criticality,omitempty"`

	// TargetModels are the backend models (or LoRA adapters) requests are
	// rewritten to, split by weight. Empty means the model name is used as is.
	// +optional
	// +kubebuilder:validation:MaxItems=10
	TargetModels []TargetModel `json:"targetModels,omitempty"`

	// PoolRef is the InferencePool whose model servers serve this model.
	// +kubebuilder:validation:Required
	PoolRef PoolObjectReference `json:"poolRef"`
}

// Criticality is how important requests for a model are.
// +kubebuilder:validation:Enum=Critical;Standard;Sheddable
type Criticality string

const (
	// Critical requests are served before any other.
	Critical Criticality = "Critical"
	// Standard requests are served when capacity allows.
	Standard Criticality = "Standard"
	// Sheddable requests are dropped when no model server has capacity.
	Sheddable Criticality = "Sheddable"
)

// TargetModel is a backend model and its share of the traffic.
type TargetModel struct {
	// Name of the backend model or adapter.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Required
	Name string `json:"name"`

	// Weight is the relative share of requests rewritten to this model.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Weight *int32 `json:"weight,omitempty"`
}

// PoolObjectReference names an InferencePool in the same namespace.
type PoolObjectReference struct {
	// Group of the pool.
	// +optional
	// +kubebuilder:default="inference.networking.k8s.io"
	Group string `json:"group,omitempty"`

	// Kind of the pool.
	// +optional
	// +kubebuilder:default="InferencePool"
	Kind string `json:"kind,omitempty"`

	// Name of the pool.
	// +kubebuilder:validation:Required
	Name string `json:"name"`
}

// InferenceModelStatus is the observed state of an InferenceModel.
type InferenceModelStatus struct {
	// Conditions of the model.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// InferenceModelList is a list of InferenceModels.
type InferenceModelList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferenceModel `json:"items"`
}
