package v1alpha2

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Inference Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Priority",type=string,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// InferenceObjective gives the requests that name it (header
// x-gateway-inference-objective) a priority in one InferencePool. It replaced
// InferenceModel's criticality in the Gateway API Inference Extension v1;
// since GIE v1.6 the llm-d router owns it as llm-d.ai/v1alpha2 with the same
// shape (package llmd/v1alpha2).
type InferenceObjective struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferenceObjectiveSpec   `json:"spec,omitempty"`
	Status InferenceObjectiveStatus `json:"status,omitempty"`
}

// InferenceObjectiveSpec is the desired state of an InferenceObjective.
type InferenceObjectiveSpec struct {
	// Priority of the requests that name this objective, relative to the
	// other requests of the pool: higher is more important, and negative
	// values are allowed. Endpoint pickers take an unset priority, and a
	// request that names no objective, for 0. A negative priority makes
	// requests sheddable: they are dropped when the pool is saturated.
	// +optional
	Priority *int32 `json:"priority,omitempty"`

	// PoolRef is the InferencePool, in the objective's namespace, whose
	// requests this objective applies to.
	// +kubebuilder:validation:Required
	PoolRef PoolObjectReference `json:"poolRef"`
}

// InferenceObjectiveStatus is the observed state of an InferenceObjective.
type InferenceObjectiveStatus struct {
	// Conditions of the objective ("Accepted").
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// InferenceObjectiveList is a list of InferenceObjectives.
type InferenceObjectiveList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferenceObjective `json:"items"`
}
