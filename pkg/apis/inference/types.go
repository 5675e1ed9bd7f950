package inference

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolImport is an InferencePool exported by other clusters of the
// ClusterSet, as seen from this cluster.
type InferencePoolImport struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   InferencePoolImportSpec
	Status InferencePoolImportStatus
}

// InferencePoolImportSpec is empty: an import is computed, never authored.
type InferencePoolImportSpec struct{}

// RoutingMode says how an importing gateway reaches an exported pool.
type RoutingMode string

const (
	RoutingModeEndpoint RoutingMode = "EndpointMode"
	RoutingModeParent   RoutingMode = "ParentMode"
)

// InferencePoolImportStatus carries the exporting clusters and readiness.
type InferencePoolImportStatus struct {
	Clusters           []ImportedCluster
	Controllers        []ImportController
	Conditions         []metav1.Condition
	ObservedGeneration int64
}

// ExportSettings are what an exporting cluster states of itself for its
// importers (weight 1 to 1000, region, tags).
type ExportSettings struct {
	Weight int32
	Region string
	Tags   map[string]string
}

// ImportedCluster is one exporting cluster behind an import.
type ImportedCluster struct {
	Name             string
	RoutingMode      RoutingMode
	TargetPortNumber int32
	EndpointPicker   EndpointPickerImport
	Parents          []ParentImport
	// EndpointAddresses are the addresses of the pool's endpoints, in
	// EndpointMode (pkg/publishedaddrs).
	EndpointAddresses []string
	// ExportSettings are the exporter's stated settings; nil for none
	// (or unreadable ones: the defaults apply).
	ExportSettings *ExportSettings
	Conditions     []metav1.Condition
}

// EndpointPickerImport says how to reach the exporting cluster's EPP.
// SecretRef, when set, names the TLS credentials (in the importing cluster)
// for its ext-proc, health and metrics ports.
type EndpointPickerImport struct {
	Name      string
	Service   []ServiceImport
	Health    *HealthEndpoint
	Metrics   *MetricsEndpoint
	SecretRef *corev1.SecretReference
	// Transport of the ext-proc port.
	Transport *EndpointTransport
}

// EndpointTransport says how one port of an exported EPP is reached.
type EndpointTransport struct {
	Mode       TransportMode
	Validation *BackendTLSValidation
}

// TransportMode is Plaintext or TLS.
type TransportMode string

const (
	TransportPlaintext TransportMode = "Plaintext"
	TransportTLS       TransportMode = "TLS"
)

// BackendTLSValidation is the validation of a BackendTLSPolicy that targets
// the EPP Service in the exporting cluster.
type BackendTLSValidation struct {
	PolicyName              string
	CACertificateRefs       []CACertificateRef
	WellKnownCACertificates string
	Hostname                string
	SubjectAltNames         []SubjectAltName
}

// CACertificateRef names an object with CA certificates.
type CACertificateRef struct {
	Group string
	Kind  string
	Name  string
}

// SubjectAltName is a name the serving certificate must carry.
type SubjectAltName struct {
	Type     string
	Hostname string
	URI      string
}

// ParentImport is a remote parent (a Gateway) that fronts the exported pool.
type ParentImport struct {
	Name       string
	Namespace  string
	Service    []ServiceImport
	Conditions []metav1.Condition
}

// ServiceImport is the network location of a remote Service or Gateway.
type ServiceImport struct {
	Type      corev1.ServiceType
	Addresses []string
	Ports     []Port
}

// Port is a port number.
type Port struct {
	Number int32
}

// HealthEndpoint is the EPP's gRPC health port.
type HealthEndpoint struct {
	Port      int32
	SecretRef *corev1.SecretReference
	Transport *EndpointTransport
}

// MetricsEndpoint is the EPP's Prometheus metrics port.
type MetricsEndpoint struct {
	Port           int32
	SecretRef      *corev1.SecretReference
	TokenSecretRef *corev1.SecretReference
	Transport      *EndpointTransport
}

// ImportController is the upstream Gateway API Inference Extension shape of
// an import's status: one entry per controller that manages the import.
type ImportController struct {
	Name              string
	ExportingClusters []ExportingCluster
	Parents           []ParentStatus
	Conditions        []metav1.Condition
}

// ParentStatus is the import's status with respect to one local parent of
// an HTTPRoute that uses it as a backendRef.
type ParentStatus struct {
	Conditions     []metav1.Condition
	ParentRef      ParentReference
	ControllerName string
}

// ParentReference identifies a parent of a route, such as a Gateway.
type ParentReference struct {
	Group     *string
	Kind      string
	Name      string
	Namespace string
}

// ExportingCluster names a cluster that exports the pool.
type ExportingCluster struct {
	Name string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolImportList is a list of InferencePoolImports.
type InferencePoolImportList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []InferencePoolImport
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExport reports, in the exporting cluster, what became of an
// InferencePool that carries an export annotation.
type InferencePoolExport struct {
	metav1.TypeMeta
	metav1.ObjectMeta

	Spec   InferencePoolExportSpec
	Status InferencePoolExportStatus
}

// InferencePoolExportSpec is empty: an export report is computed.
type InferencePoolExportSpec struct{}

// InferencePoolExportStatus says whether the export is valid and where it is imported.
type InferencePoolExportStatus struct {
	RoutingMode        RoutingMode
	Clusters           []ExportTargetCluster
	Conditions         []metav1.Condition
	ObservedGeneration int64
}

// ExportTargetCluster is one other member of the ClusterSet and whether it imports the pool.
type ExportTargetCluster struct {
	Name     string
	Imported bool
	Reason   string
	Message  string
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExportList is a list of InferencePoolExports.
type InferencePoolExportList struct {
	metav1.TypeMeta
	metav1.ListMeta

	Items []InferencePoolExport
}
