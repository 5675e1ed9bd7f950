// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/mci-dev/mci/pkg/apis/inference
// +k8s:defaulter-gen=TypeMeta
// +k8s:openapi-gen=true
// +k8s:openapi-model-package=io.x-k8s.networking.inference.v1alpha1
// +groupName=inference.networking.x-k8s.io

// Package v1alpha1 is the version of the mci API that clients see:
// InferencePoolImport (with both the proposal's status.clusters[] and the
// upstream status.controllers[] shapes) and InferencePoolExport.
package v1alpha1
