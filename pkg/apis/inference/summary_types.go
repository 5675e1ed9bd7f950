package inference

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExportSummary is what importing clusters need of one valid
// export: how to reach the pool in its cluster and whether it is ready.
// It is derived from the exporting cluster's own objects only.
type InferencePoolExportSummary struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Status InferencePoolExportSummaryStatus
}

// InferencePoolExportSummaryStatus is one exporting cluster's entry of an
// import, without the cluster's name.
type InferencePoolExportSummaryStatus struct {
	RoutingMode      RoutingMode
	TargetPortNumber int32
	EndpointPicker   *EndpointPickerImport
	Parents          []ParentImport
	// EndpointAddresses are the addresses of the pool's endpoints, in
	// EndpointMode (pkg/publishedaddrs).
	EndpointAddresses []string
	// ExportSettings are the exporter's stated settings; nil for none
	// (or unreadable ones: the defaults apply).
	ExportSettings *ExportSettings
	Conditions     []metav1.Condition
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExportSummaryList is a list of InferencePoolExportSummaries.
type InferencePoolExportSummaryList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []InferencePoolExportSummary
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferenceClusterSummary is what other clusters need of a cluster that
// does not depend on any one pool: its namespaces, which decide (by
// namespace sameness) whether it imports a pool.
type InferenceClusterSummary struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Status InferenceClusterSummaryStatus
}

// InferenceClusterSummaryStatus lists the cluster's namespaces.
type InferenceClusterSummaryStatus struct {
	Namespaces []string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferenceClusterSummaryList is a list of InferenceClusterSummaries.
type InferenceClusterSummaryList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []InferenceClusterSummary
}
