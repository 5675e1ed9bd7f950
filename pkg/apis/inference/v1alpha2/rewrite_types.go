package v1alpha2

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Inference Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// InferenceModelRewrite rewrites the model of the requests of one
// InferencePool: a rule matching the model a request names sends it to one
// of the rule's target models, chosen by weight (canary rollouts, A/B tests,
// aliases). It replaced InferenceModel's targetModels in the Gateway API
// Inference Extension v1; since GIE v1.6 the llm-d router owns it as
// llm-d.ai/v1alpha2 with the same shape (package llmd/v1alpha2).
type InferenceModelRewrite struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferenceModelRewriteSpec   `json:"spec,omitempty"`
	Status InferenceModelRewriteStatus `json:"status,omitempty"`
}

// InferenceModelRewriteSpec is the desired state of an
// InferenceModelRewrite.
type InferenceModelRewriteSpec struct {
	// PoolRef is the InferencePool, in the rewrite's namespace, whose
	// requests are rewritten.
	// +kubebuilder:validation:Required
	PoolRef *PoolObjectReference `json:"poolRef"`

	// Rules are tried in order; the first that matches a request is used.
	// Across all the rewrites of a pool, a rule that names the model
	// exactly wins over a rule without matches (which matches every
	// request); among equals the oldest rewrite (creationTimestamp) wins,
	// then the first rule in the list.
	// +kubebuilder:validation:Required
	Rules []InferenceModelRewriteRule `json:"rules"`
}

// InferenceModelRewriteRule is what requests a rule matches and the models
// it sends them to.
type InferenceModelRewriteRule struct {
	// Matches select the requests: a request matches when any of them does.
	// A rule without matches matches every request.
	// +optional
	Matches []Match `json:"matches,omitempty"`

	// Targets are the models matched requests are sent to, split by weight.
	// +optional
	// +kubebuilder:validation:MinItems=1
	Targets []ModelRewriteTarget `json:"targets,omitempty"`
}

// ModelRewriteTarget is a model requests are rewritten to and its share of
// them.
type ModelRewriteTarget struct {
	// Weight is the target's share: weight / sum of the rule's weights. It
	// is not a percentage. Set it on every target of a rule or on none (then
	// the targets share equally).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Weight *int32 `json:"weight,omitempty"`

	// ModelRewrite is the model name the request body is given.
	// +kubebuilder:validation:Required
	ModelRewrite string `json:"modelRewrite"`
}

// Match is one criterion a request can match.
type Match struct {
	// Model matches the "model" field of the request body.
	// +kubebuilder:validation:Required
	Model *ModelMatch `json:"model,omitempty"`
}

// ModelMatch matches a model name.
type ModelMatch struct {
	// Type of the match; only Exact is defined.
	// +optional
	// +kubebuilder:default=Exact
	Type *MatchValidationType `json:"type,omitempty"`

	// Value is the model name to match.
	// +kubebuilder:validation:Required
	// +kubebuilder:validation:MinLength=1
	Value string `json:"value"`
}

// MatchValidationType is how a model name is matched.
// +kubebuilder:validation:Enum=Exact
type MatchValidationType string

// MatchExact matches the model name exactly (case-sensitive).
const MatchExact MatchValidationType = "Exact"

// InferenceModelRewriteStatus is the observed state of an
// InferenceModelRewrite.
type InferenceModelRewriteStatus struct {
	// Conditions of the rewrite ("Accepted").
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// InferenceModelRewriteList is a list of InferenceModelRewrites.
type InferenceModelRewriteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferenceModelRewrite `json:"items"`
}
