// +k8s:deepcopy-gen=package
// +kubebuilder:object:generate=false
// +groupName=llm-d.ai
// +groupGoName=LLMD

// Package v1alpha2 holds InferenceObjective and InferenceModelRewrite in the
// llm-d.ai group, where the llm-d router has served them since GIE v1.6 moved
// them out of inference.networking.x-k8s.io. The shape is the same as in that
// group, so the spec and status types are the ones of package
// inference/v1alpha2: only the group differs. mci-epp and mci-sidecar read
// both groups; mci-apiserver serves neither.
package v1alpha2
