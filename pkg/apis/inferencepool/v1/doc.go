// +k8s:deepcopy-gen=package
// +kubebuilder:object:generate=false
// +groupName=inference.networking.k8s.io
// +groupGoName=InferencePool

// Package v1 holds InferencePool (inference.networking.k8s.io/v1), the
// member-cluster type that mci exports and imports. It is defined here from
// the published Gateway API Inference Extension schema, because that module
// cannot be used by this project. The CRD generated from these types is a
// test fixture of the local ClusterSet (test/localclusterset/crds), not an
// install artifact: clusters install the upstream CRD.
package v1
