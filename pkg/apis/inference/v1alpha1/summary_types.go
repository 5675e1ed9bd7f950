package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +genclient:onlyVerbs=get,list,watch
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExportSummary is what importing clusters need of one valid
// export, published by the exporting cluster's mci-apiserver: how to reach
// the pool there and whether it is ready. It has the namespace, name,
// labels and creationTimestamp of the exported InferencePool, and is
// derived from the exporting cluster's own objects only, so that its
// resourceVersion moves exactly when what importers read of it changes.
// Other clusters' mci-apiservers watch these instead of the exporting
// cluster's InferencePools, Services, EndpointSlices and Gateways.
type InferencePoolExportSummary struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status is the exporting cluster's entry of the import, without the
	// cluster's name.
	// +optional
	Status InferencePoolExportSummaryStatus `json:"status,omitempty"`
}

// InferencePoolExportSummaryStatus is one exporting cluster's entry of an
// import (see ImportedCluster), without the cluster's name.
type InferencePoolExportSummaryStatus struct {
	// RoutingMode is the mode the export asks for.
	RoutingMode RoutingMode `json:"routingMode"`

	// TargetPortNumber is the pool's first spec.targetPorts entry.
	TargetPortNumber int32 `json:"targetPortNumber"`

	// EndpointPicker says how to reach the pool's EPP, in EndpointMode.
	// +optional
	EndpointPicker *EndpointPickerImport `json:"endpointPicker,omitempty"`

	// Parents are the pool's parent Gateways, in ParentMode.
	// +optional
	// +listType=atomic
	Parents []ParentImport `json:"parents,omitempty"`

	// EndpointAddresses are the addresses the exporting cluster publishes
	// of the pool's endpoints (the IPs of every pod its selector picks,
	// ready or not), in EndpointMode: a remote EPP's destination must be
	// one of them, or within one of the prefixes listed. At most 1024
	// entries: IP addresses, or, for a pool of more pods, the /24 (IPv4)
	// or /64 (IPv6) prefixes that cover them. Empty when the exporter
	// publishes none or published a list that does not parse, and then
	// importing gateways accept no destination of this cluster.
	// +optional
	// +listType=atomic
	EndpointAddresses []string `json:"endpointAddresses,omitempty"`

	// ExportSettings are what the exporting cluster states of itself for
	// its importers (the pool's mci.x-k8s.io/export-settings annotation):
	// unset when it states none, or settings that cannot be read (then
	// condition ExportSettingsAccepted is False and the defaults apply:
	// weight 1, no region, no tags).
	// +optional
	ExportSettings *ExportSettings `json:"exportSettings,omitempty"`

	// Conditions: Ready says whether the EPP (or a parent) can take
	// traffic, as the exporting cluster sees it.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExportSummaryList is a list of InferencePoolExportSummaries.
type InferencePoolExportSummaryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferencePoolExportSummary `json:"items"`
}

// +genclient
// +genclient:nonNamespaced
// +genclient:onlyVerbs=get,list,watch
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferenceClusterSummary is what other clusters need of a cluster that
// does not depend on any one pool, published by its mci-apiserver: there
// is one, named after the cluster. Its namespaces decide, by namespace
// sameness, whether it imports a pool, which InferencePoolExports and the
// Exported condition of other clusters report.
type InferenceClusterSummary struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status lists the cluster's namespaces.
	// +optional
	Status InferenceClusterSummaryStatus `json:"status,omitempty"`
}

// InferenceClusterSummaryStatus lists the cluster's namespaces.
type InferenceClusterSummaryStatus struct {
	// Namespaces are the names of the cluster's namespaces that are not
	// being deleted, sorted.
	// +optional
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferenceClusterSummaryList is a list of InferenceClusterSummaries.
type InferenceClusterSummaryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferenceClusterSummary `json:"items"`
}
