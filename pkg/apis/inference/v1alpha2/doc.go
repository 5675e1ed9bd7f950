// +k8s:deepcopy-gen=package
// +kubebuilder:object:generate=false
// +groupName=inference.networking.x-k8s.io

// Package v1alpha2 holds InferenceModel, a member-cluster type that mci-epp
// reads (criticality and model-name rewrites). mci-apiserver does not serve
// it: it is a CRD in the member clusters, defined here from the published
// Gateway API Inference Extension schema because that module cannot be used.
package v1alpha2
