package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
)

// Well-known names of the ClusterProfile API.
const (
	// LabelClusterSet names the ClusterSet a ClusterProfile belongs to.
	LabelClusterSet = "multicluster.x-k8s.io/clusterset"
	// LabelClusterManager names the cluster manager that owns a profile.
	LabelClusterManager = "x-k8s.io/cluster-manager"
	// ConditionControlPlaneHealthy is the cluster manager's view of the
	// health of the cluster's control plane.
	ConditionControlPlaneHealthy = "ControlPlaneHealthy"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:subresource:status

// ClusterProfile describes one cluster of a fleet, as its cluster manager
// sees it: who manages it, its health and version, and how to reach it.
type ClusterProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ClusterProfileSpec `json:"spec"`
	// +optional
	Status ClusterProfileStatus `json:"status,omitempty"`
}

// ClusterProfileSpec is what the cluster manager declares of the cluster.
type ClusterProfileSpec struct {
	// DisplayName is a name for people.
	// +optional
	DisplayName string `json:"displayName,omitempty"`
	// ClusterManager is the system that manages the cluster; it does not
	// change once set.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="the cluster manager of a profile cannot change"
	ClusterManager ClusterManager `json:"clusterManager"`
}

// ClusterManager names the system (Open Cluster Management, a cloud's
// fleet service, ...) that owns a ClusterProfile.
type ClusterManager struct {
	// Name of the cluster manager.
	// +required
	Name string `json:"name"`
}

// ClusterProfileStatus is what the cluster manager observes of the cluster.
type ClusterProfileStatus struct {
	// Conditions of the cluster, ControlPlaneHealthy among them.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions"`
	// Version of the cluster's software.
	// +optional
	Version ClusterVersion `json:"version,omitempty"`
	// Properties of the cluster: About API ClusterProperties (KEP-2149) or
	// the cluster manager's own.
	// +optional
	// +listType=map
	// +listMapKey=name
	Properties []Property `json:"properties,omitempty"`
	// CredentialProviders is the former name of AccessProviders, still read;
	// an entry of AccessProviders with the same name takes precedence.
	// +optional
	// +listType=map
	// +listMapKey=name
	CredentialProviders []AccessProvider `json:"credentialProviders,omitempty"`
	// AccessProviders are the ways to reach the cluster (KEP-5339), each
	// named after the kind of credentials a consumer's provider file maps
	// to an exec plugin.
	// +optional
	// +listType=map
	// +listMapKey=name
	AccessProviders []AccessProvider `json:"accessProviders,omitempty"`
}

// AccessProvider is one way to reach the cluster: where its API server is
// and how to trust it (a kubeconfig cluster entry), under the name of the
// credentials that go with it.
type AccessProvider struct {
	Name    string              `json:"name"`
	Cluster clientcmdv1.Cluster `json:"cluster,omitempty"`
}

// ClusterVersion is the cluster's software version.
type ClusterVersion struct {
	// Kubernetes is the version of the cluster's Kubernetes.
	// +optional
	Kubernetes string `json:"kubernetes,omitempty"`
}

// Property is a named value observed on the cluster.
type Property struct {
	// Name of the property.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// Value of the property.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +required
	Value string `json:"value"`
	// LastObservedTime is when the value was seen on the cluster.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Format=date-time
	// +optional
	LastObservedTime metav1.Time `json:"lastObservedTime,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// ClusterProfileList is a list of ClusterProfiles.
type ClusterProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterProfile `json:"items"`
}
