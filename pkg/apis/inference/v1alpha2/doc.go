// +k8s:deepcopy-gen=package
// +kubebuilder:object:generate=false
// +groupName=inference.networking.x-k8s.io

// Package v1alpha2 holds the member-cluster types that mci-epp and
// mci-sidecar read for the requests of a pool: InferenceModel (criticality
// and weighted target models, GIE before v1), and its successors
// InferenceObjective (priority) and InferenceModelRewrite (weighted
// model-name rewrites), as GIE served them up to v1.5. mci-apiserver does not
// serve them: they are CRDs in the member clusters, defined here from the
// published Gateway API Inference Extension schemas because that module
// cannot be used. Package llmd/v1alpha2 serves the same InferenceObjective
// and InferenceModelRewrite shapes in the llm-d.ai group (GIE v1.6 on).
package v1alpha2
