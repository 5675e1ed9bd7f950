// +k8s:deepcopy-gen=package
// +kubebuilder:object:generate=false
// +groupName=multicluster.x-k8s.io
// +groupGoName=ClusterInventory

// Package v1alpha1 holds ClusterProfile (multicluster.x-k8s.io/v1alpha1),
// SIG-Multicluster's cluster inventory API, as far as mci reads it: a hub
// cluster's fleet manager publishes one ClusterProfile per cluster, and
// mci-apiserver takes the profiles of its ClusterSet as members, reached
// through their access providers (KEP-5339). The upstream module is not
// available to this project, so the types are written here after its
// published schema, with the same JSON field names. mci only reads
// ClusterProfiles; the CRD belongs to whoever runs the hub, and the one
// generated from these types serves tests (test/e2e/testdata/crds).
package v1alpha1
