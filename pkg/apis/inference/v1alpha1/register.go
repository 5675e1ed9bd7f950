package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group mci-apiserver serves.
const GroupName = "inference.networking.x-k8s.io"

// SchemeGroupVersion is the group version of these objects.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource takes an unqualified resource and returns a group-qualified GroupResource.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	// SchemeBuilder collects the functions that add these types to a scheme.
	SchemeBuilder      runtime.SchemeBuilder
	localSchemeBuilder = &SchemeBuilder
	// AddToScheme adds these types to a scheme.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func init() {
	// Generated conversion and defaulting functions register themselves
	// through localSchemeBuilder in their own init functions.
	localSchemeBuilder.Register(addKnownTypes)
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&InferencePoolImport{},
		&InferencePoolImportList{},
		&InferencePoolExport{},
		&InferencePoolExportList{},
		&InferencePoolExportSummary{},
		&InferencePoolExportSummaryList{},
		&InferenceClusterSummary{},
		&InferenceClusterSummaryList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
