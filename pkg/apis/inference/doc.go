// +k8s:deepcopy-gen=package
// +groupName=inference.networking.x-k8s.io

// Package inference is the internal version of the API that mci-apiserver
// serves: InferencePoolImport and InferencePoolExport, both computed on
// demand from the exported InferencePools of a ClusterSet.
package inference
