package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// ExportAnnotation on an InferencePool asks for it to be exported. The
	// only supported value is ExportScopeClusterSet.
	ExportAnnotation = "inference.networking.x-k8s.io/export"
	// ExportModeAnnotation chooses the RoutingMode importing gateways use.
	// It requires ExportAnnotation; EndpointMode is the default.
	ExportModeAnnotation = "inference.networking.x-k8s.io/export-mode"
	// ExportToAnnotation on an exported InferencePool limits which members
	// import it: a JSON object with "clusters", a list of member names,
	// and "selector", a label selector (kubectl's syntax) over the
	// members' labels (their ClusterProfile's, or their member Secret's),
	// e.g. {"clusters": ["cluster-b"], "selector": "region=eu"}. A member
	// named or selected imports the pool; no other does, and in summary
	// mode no other is sent its summary. Absent, the pool is exported to
	// the whole ClusterSet; a value that does not parse makes the export
	// invalid.
	ExportToAnnotation = "mci.x-k8s.io/export-to"
	// ExportSettingsAnnotation on an exported InferencePool states what
	// the exporting cluster asks its importers to know of it: a JSON
	// object with "weight" (1 to 1000, 1 when absent), "region" (a DNS
	// label) and "tags" (label-like keys and values), carried on the
	// import's status.clusters[] entry of that cluster as exportSettings.
	// A value that does not parse leaves the export served with the
	// defaults, and says so (ConditionExportSettingsAccepted).
	ExportSettingsAnnotation = "mci.x-k8s.io/export-settings"
	// ExportScopeClusterSet exports a pool to every member of the ClusterSet.
	ExportScopeClusterSet = "ClusterSet"
	// EndpointPickerSecretAnnotation on an InferencePool says that its EPP
	// serves TLS, and names the Secret with the credentials to reach it.
	// By namespace sameness the Secret lives in the pool's namespace of each
	// cluster that reaches the EPP (the importing clusters, and the pool's
	// own cluster for a sidecar routing to it locally); an import carries it
	// as endpointPicker.secretRef (and health.secretRef, metrics.secretRef).
	// The value must be a Secret name (a DNS subdomain); anything else makes
	// the export invalid rather than silently plaintext.
	EndpointPickerSecretAnnotation = "mci.x-k8s.io/endpoint-picker-secret"
	// EndpointPickerTransportAnnotation on an InferencePool says how each
	// port of its EPP is reached: "TLS" or "Plaintext" for every port, or
	// a list of port=mode with ports ext-proc, health and metrics, e.g.
	// "ext-proc=TLS" for an upstream EPP with its default flags (ext_proc
	// over TLS with a self-signed certificate, plaintext gRPC health and
	// metrics). A port it does not name follows the Secret of
	// EndpointPickerSecretAnnotation (TLS), a BackendTLSPolicy that targets
	// the ext-proc port (TLS), else the importing sidecar's default. A
	// value that does not parse makes the export invalid. Imports carry it
	// as endpointPicker.transport (and health.transport, metrics.transport).
	EndpointPickerTransportAnnotation = "mci.x-k8s.io/endpoint-picker-transport"
	// EndpointPickerMetricsTokenSecretAnnotation on an InferencePool names a
	// Secret whose "token" key is the bearer token sidecars send to its
	// EPP's /metrics (which upstream EPPs serve to authorized tokens
	// only). Unlike EndpointPickerSecretAnnotation it changes no port's
	// transport. The Secret lives, labelled as credentials, in the pool's
	// namespace of each cluster that scrapes the EPP; an import carries it
	// as metrics.tokenSecretRef. A value that is not a Secret name makes
	// the export invalid.
	EndpointPickerMetricsTokenSecretAnnotation = "mci.x-k8s.io/endpoint-picker-metrics-token-secret"
	// ClusterPolicyAnnotation chooses how importing sidecars pick a cluster
	// for the pool's requests (a named cluster policy or an inline
	// configuration of the scoring pipeline, pkg/routingpolicy). On an
	// HTTPRoute it applies to the route's backends; on an exported
	// InferencePool, as an annotation or a label (the annotation wins), to
	// the pool. The InferencePoolImport carries its oldest exporter's as an
	// annotation of this name, in canonical form, and the exporter's labels
	// as they are. A value that does not parse makes the export invalid, so
	// that importers see why the cluster is not routable instead of a
	// policy silently replaced by the default.
	ClusterPolicyAnnotation = "mci.x-k8s.io/cluster-policy"
	// DrainAnnotation on an exported InferencePool drains its export ahead
	// of maintenance: "true" keeps the export visible to importers, flagged
	// Draining, and their sidecars send it no new requests, only those of
	// the sessions and conversations it already serves, until they end;
	// "false" is the same as no annotation. Any other value makes the
	// export invalid. On the Secret or ClusterProfile that names a member,
	// it drains every export of that cluster in the imports of the servers
	// whose membership it is; there any other value is ignored (reported)
	// and does not drain.
	DrainAnnotation = "mci.x-k8s.io/drain"

	// ControllerName names this implementation in status.controllers[] of
	// imports and in the parent status entry of exported InferencePools.
	ControllerName = "mci.x-k8s.io/apiserver"

	// ExportedParentKind is the parentRef kind of the status entry that
	// marks an InferencePool as exported: the pool's own InferencePoolImport
	// (same namespace and name), in this API group.
	ExportedParentKind = "InferencePoolImport"
)

// Condition types and reasons used in import and export status.
const (
	ConditionAccepted = "Accepted"
	ConditionReady    = "Ready"
	ConditionValid    = "Valid"
	// ConditionExported is the condition of the parent status entry mci
	// sets on an exported InferencePool in its own cluster (upstream
	// proposal 1374): True when every other member imports the pool.
	ConditionExported = "Exported"
	// ConditionDraining is True on an export whose pool carries
	// DrainAnnotation: in the InferencePoolExport's conditions, and in
	// the import's status.clusters[] entry of that cluster (present only
	// while it drains, so that clusters that never drain are served as
	// before). The cluster stays Ready: it serves what it holds.
	ConditionDraining = "Draining"
	// ReasonDrainRequested: the exported pool asks to be drained.
	ReasonDrainRequested = "DrainRequested"
	// ReasonMemberDrainRequested: the Secret or ClusterProfile that names
	// the exporting member asks that all of its cluster be drained.
	ReasonMemberDrainRequested = "MemberDrainRequested"
	// ConditionExportSettingsAccepted is False, reason
	// ReasonInvalidExportSettings, on an export whose
	// ExportSettingsAnnotation cannot be read: in the InferencePoolExport's
	// conditions and in the import's status.clusters[] entry of that
	// cluster, which is served with the default settings (no
	// exportSettings). Present only then, so that exports that state no
	// settings, or valid ones, are served as before.
	ConditionExportSettingsAccepted = "ExportSettingsAccepted"
	// ReasonInvalidExportSettings: see ConditionExportSettingsAccepted.
	ReasonInvalidExportSettings = "InvalidExportSettings"

	ReasonAccepted               = "Accepted"
	ReasonReady                  = "Ready"
	ReasonNotReady               = "NotReady"
	ReasonNoReadyEndpoints       = "NoReadyEndpoints"
	ReasonEndpointPickerNotFound = "EndpointPickerNotFound"
	ReasonNoReadyParents         = "NoReadyParents"
	ReasonClusterUnreachable     = "ClusterUnreachable"
	// ReasonCredentialsRejected flags a member that answers mci-apiserver
	// but refuses its credentials (401, or 403 to what it reads): its
	// last known data is served as an unreachable member's.
	ReasonCredentialsRejected = "CredentialsRejected"
	ReasonInvalidExport       = "InvalidExport"
	ReasonNamespaceNotFound   = "NamespaceNotFound"
	ReasonExported            = "Exported"
	ReasonImported            = "Imported"
	ReasonLocalCluster        = "LocalCluster"
	// ReasonOutsideExportScope says a member does not import a pool
	// because the pool's ExportToAnnotation neither names nor selects it.
	ReasonOutsideExportScope = "OutsideExportScope"

	// ReasonInvalidEndpointPickerRef says an exporting pool's
	// endpointPickerRef cannot be imported: it has no name, names a kind or
	// group other than a core Service, or no ext-proc port can be determined.
	ReasonInvalidEndpointPickerRef = "InvalidEndpointPickerRef"

	// ReasonInvalidEndpointAddresses says the endpoint addresses an
	// exporting cluster publishes of a pool do not parse (an address that
	// is not an IP, a prefix wider than /24 or /64, too many entries) or
	// cannot be read (the member's credentials may not list its pods): its
	// entry carries none, and no destination its EPP names is accepted.
	ReasonInvalidEndpointAddresses = "InvalidEndpointAddresses"
)

// +genclient
// +genclient:onlyVerbs=get,list,watch
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolImport represents an InferencePool exported by other clusters
// of the ClusterSet, as seen from this cluster. It has the namespace and name
// of the exported pool. It is computed on demand from the exporting clusters
// and is read-only: export or withdraw the InferencePool to change it.
type InferencePoolImport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is intentionally empty since this resource is fully computed.
	// +optional
	Spec InferencePoolImportSpec `json:"spec,omitempty"`

	// Status communicates the imported targets (EPPs and/or parents) and readiness.
	// +optional
	Status InferencePoolImportStatus `json:"status,omitempty"`
}

// InferencePoolImportSpec is intentionally empty.
type InferencePoolImportSpec struct{}

// RoutingMode expresses how the importing gateway should route requests to the exported pool.
// +enum
type RoutingMode string

const (
	// RoutingModeEndpoint means the gateway routes to remote model server endpoints
	// directly, choosing them through the remote EPP.
	RoutingModeEndpoint RoutingMode = "EndpointMode"
	// RoutingModeParent means the gateway routes via a remote parent (a Gateway)
	// that fronts the pool.
	RoutingModeParent RoutingMode = "ParentMode"
)

// InferencePoolImportStatus carries the exporting clusters and readiness.
type InferencePoolImportStatus struct {
	// Clusters is the set of exporting clusters that currently back this import,
	// sorted by name.
	// +listType=map
	// +listMapKey=name
	Clusters []ImportedCluster `json:"clusters"`

	// Controllers is the upstream Gateway API Inference Extension shape of the
	// same information: one entry, for this implementation.
	// +optional
	// +listType=map
	// +listMapKey=name
	Controllers []ImportController `json:"controllers,omitempty"`

	// Conditions include Accepted (a valid import was synthesized) and Ready
	// (at least one exporting cluster is ready).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration reflects the generation observed when computing this status.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ExportSettings are what an exporting cluster states of itself for its
// importers: settings that cluster policies and weighted picks use.
type ExportSettings struct {
	// Weight multiplies the cluster's weight in importing gateways'
	// weighted picks and weight scores: 1 to 1000.
	Weight int32 `json:"weight"`

	// Region is the exporting cluster's region (a DNS label, such as
	// eu-west-1); importing routes may restrict a backend to clusters of
	// some regions.
	// +optional
	Region string `json:"region,omitempty"`

	// Tags are free-form settings (SLO class, tier): at most 16, keys and
	// values written as label keys and values.
	// +optional
	Tags map[string]string `json:"tags,omitempty"`
}

// ImportedCluster is one exporting cluster behind an import.
type ImportedCluster struct {
	// Name of the exporting cluster, unique within the list.
	Name string `json:"name"`

	// RoutingMode tells gateways how to program the data plane for this cluster.
	RoutingMode RoutingMode `json:"routingMode"`

	// TargetPortNumber is the port the model servers listen on in the exported
	// pool (its first spec.targetPorts entry). Used when RoutingMode=EndpointMode.
	TargetPortNumber int32 `json:"targetPortNumber"`

	// EndpointPicker describes how to connect to the EPP in the exporting cluster.
	// Set when RoutingMode=EndpointMode.
	// +optional
	EndpointPicker EndpointPickerImport `json:"endpointPicker,omitzero"`

	// Parents describes the parents (Gateways) to route through when
	// RoutingMode=ParentMode.
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

	// Conditions for this cluster: Ready says whether its EPP (or a parent)
	// can take traffic.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// EndpointPickerImport says how to connect to an exporting cluster's EPP.
type EndpointPickerImport struct {
	// Name of the EPP Service (informational).
	Name string `json:"name"`

	// Service endpoints (addresses and ports) where the EPP exposes ext-proc.
	// +listType=atomic
	Service []ServiceImport `json:"service"`

	// Health endpoint of the exported EPP, from its Service port named for health.
	// +optional
	Health *HealthEndpoint `json:"health,omitempty"`

	// Metrics endpoint of the exported EPP, from its Service port named for metrics.
	// +optional
	Metrics *MetricsEndpoint `json:"metrics,omitempty"`

	// SecretRef references the TLS credentials for reaching the EPP: a
	// Secret of the importing cluster, in the pool's namespace, named by the
	// exporting pool's annotation mci.x-k8s.io/endpoint-picker-secret. It
	// applies to the ext-proc, health and metrics ports alike (health and
	// metrics carry the same reference). Keys: ca.crt (required: the CA that
	// verifies the EPP's serving certificate), tls.crt and tls.key
	// (optional: a client certificate, for mutual TLS) and server-name
	// (optional: the name to verify the serving certificate against instead
	// of the address dialled). Unset: the EPP is reached in plaintext.
	// +optional
	SecretRef *corev1.SecretReference `json:"secretRef,omitempty"`

	// Transport says how the ext-proc port is reached: from the exporting
	// pool's annotation mci.x-k8s.io/endpoint-picker-transport and the
	// BackendTLSPolicy that targets the EPP Service in the exporting
	// cluster. Unset: TLS with secretRef when it is set, else the
	// importing sidecar's default.
	// +optional
	Transport *EndpointTransport `json:"transport,omitempty"`
}

// EndpointTransport says how one port of an exported EPP is reached.
type EndpointTransport struct {
	// Mode is Plaintext or TLS. Empty: TLS with the secretRef of the port
	// when there is one, else the importing sidecar's default.
	// +optional
	Mode TransportMode `json:"mode,omitempty"`

	// Validation says how the EPP's serving certificate is verified, as a
	// BackendTLSPolicy (gateway.networking.k8s.io/v1) that targets this
	// port of the EPP Service in the exporting cluster says it. Only with
	// TLS. Without it and without a secretRef, a TLS port's certificate is
	// not verified, as gateways reach an EPP's default self-signed one.
	// +optional
	Validation *BackendTLSValidation `json:"validation,omitempty"`
}

// TransportMode is how a port is reached.
type TransportMode string

const (
	// TransportPlaintext reaches the port without TLS.
	TransportPlaintext TransportMode = "Plaintext"
	// TransportTLS reaches the port over TLS.
	TransportTLS TransportMode = "TLS"
)

// BackendTLSValidation is the validation of the BackendTLSPolicy that
// targets an exported EPP's Service port, carried to importers. The CA
// certificates it names are read in the importing cluster, in the pool's
// namespace (namespace sameness, as secretRef).
type BackendTLSValidation struct {
	// PolicyName is the BackendTLSPolicy's name in the exporting cluster,
	// in the pool's namespace.
	PolicyName string `json:"policyName"`

	// CACertificateRefs name the objects with the CA certificates (key
	// ca.crt) that verify the serving certificate: core ConfigMaps.
	// +optional
	// +listType=atomic
	CACertificateRefs []CACertificateRef `json:"caCertificateRefs,omitempty"`

	// WellKnownCACertificates is "System" for the system's trusted CAs.
	// +optional
	WellKnownCACertificates string `json:"wellKnownCACertificates,omitempty"`

	// Hostname is the name sent as SNI and, without SubjectAltNames,
	// verified against the certificate.
	Hostname string `json:"hostname"`

	// SubjectAltNames, when set, are verified instead of Hostname: the
	// certificate must carry one of them.
	// +optional
	// +listType=atomic
	SubjectAltNames []SubjectAltName `json:"subjectAltNames,omitempty"`
}

// CACertificateRef names an object with CA certificates, in the pool's
// namespace.
type CACertificateRef struct {
	// Group of the object ("" for core).
	// +optional
	Group string `json:"group,omitempty"`
	// Kind of the object: ConfigMap.
	Kind string `json:"kind"`
	// Name of the object.
	Name string `json:"name"`
}

// SubjectAltName is a name the serving certificate must carry.
type SubjectAltName struct {
	// Type is Hostname or URI.
	Type string `json:"type"`
	// Hostname, for Type Hostname.
	// +optional
	Hostname string `json:"hostname,omitempty"`
	// URI, for Type URI.
	// +optional
	URI string `json:"uri,omitempty"`
}

// ParentImport models a remote parent (a Gateway) that fronts the imported pool.
type ParentImport struct {
	// Name of the Gateway.
	Name string `json:"name"`
	// Namespace of the Gateway.
	Namespace string `json:"namespace"`
	// Service holds the Gateway's addresses and listener ports.
	// +listType=atomic
	Service []ServiceImport `json:"service"`
	// Conditions of the parent as the exporting cluster reports them.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ServiceImport is the network location of a remote Service or Gateway.
type ServiceImport struct {
	// Type mirrors core Service types: ClusterIP, NodePort, LoadBalancer or ExternalName.
	Type corev1.ServiceType `json:"type"`

	// Addresses are IPs and/or hostnames of the remote service.
	// +optional
	// +listType=atomic
	Addresses []string `json:"addresses,omitempty"`

	// Ports exposed by the remote service (e.g. 9002 for EPP ext-proc).
	// +optional
	// +listType=atomic
	Ports []Port `json:"ports,omitempty"`
}

// Port is a port number.
type Port struct {
	// Number of the port.
	Number int32 `json:"number"`
}

// HealthEndpoint is the gRPC health port of an exported EPP.
type HealthEndpoint struct {
	// Port of the gRPC health service.
	Port int32 `json:"port"`
	// SecretRef optionally references credentials for secure health checks.
	// +optional
	SecretRef *corev1.SecretReference `json:"secretRef,omitempty"`
	// Transport says how the health port is reached (see
	// endpointPicker.transport).
	// +optional
	Transport *EndpointTransport `json:"transport,omitempty"`
}

// MetricsEndpoint is the Prometheus metrics port of an exported EPP.
type MetricsEndpoint struct {
	// Port of the metrics endpoint.
	Port int32 `json:"port"`
	// SecretRef optionally references scrape credentials.
	// +optional
	SecretRef *corev1.SecretReference `json:"secretRef,omitempty"`
	// TokenSecretRef optionally references a Secret whose "token" key is
	// the bearer token sent with scrapes of this port (upstream EPPs
	// serve /metrics to authorized tokens only). It changes no port's
	// transport.
	// +optional
	TokenSecretRef *corev1.SecretReference `json:"tokenSecretRef,omitempty"`
	// Transport says how the metrics port is reached (see
	// endpointPicker.transport).
	// +optional
	Transport *EndpointTransport `json:"transport,omitempty"`
}

// ImportController is the upstream status shape: the clusters a controller
// imports the pool from, and its conditions.
type ImportController struct {
	// Name of the controller, e.g. mci.x-k8s.io/apiserver.
	Name string `json:"name"`
	// ExportingClusters are the clusters that export the pool.
	// +optional
	// +listType=map
	// +listMapKey=name
	ExportingClusters []ExportingCluster `json:"exportingClusters,omitempty"`
	// Parents are the local cluster's parents (Gateways) of the HTTPRoutes
	// that use the import as a backendRef, each with the import's status
	// with respect to that parent. Computed from the local cluster's
	// HTTPRoutes and Gateways; empty when no route uses the import.
	// +optional
	// +listType=atomic
	Parents []ParentStatus `json:"parents,omitempty"`
	// Conditions of the import as this controller sees it.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ExportingCluster names a cluster that exports the pool.
type ExportingCluster struct {
	// Name of the cluster.
	Name string `json:"name"`
}

// ParentStatus is the import's status with respect to one local parent of
// an HTTPRoute that uses it as a backendRef, in the shape of the upstream
// InferencePool ParentStatus.
type ParentStatus struct {
	// Conditions: Accepted (the route's parentRef names an existing parent
	// that may take the route) and ResolvedRefs (the route's backendRef to
	// this import is permitted and resolves to it).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ParentRef identifies the parent, in the importing cluster.
	ParentRef ParentReference `json:"parentRef"`
	// ControllerName is the controller that computed this entry.
	// +optional
	ControllerName string `json:"controllerName,omitempty"`
}

// ParentReference identifies a parent of a route, such as a Gateway.
type ParentReference struct {
	// Group of the parent; gateway.networking.k8s.io for a Gateway.
	// +optional
	Group *string `json:"group,omitempty"`
	// Kind of the parent, e.g. Gateway.
	// +optional
	Kind string `json:"kind,omitempty"`
	// Name of the parent.
	Name string `json:"name"`
	// Namespace of the parent.
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// Condition types and reasons of an import's parents (status.controllers[]
// .parents[].conditions), as the upstream InferencePool ParentStatus names
// them.
const (
	ConditionResolvedRefs = "ResolvedRefs"

	// ReasonNotSupportedByParent: the parentRef names no Gateway this
	// cluster has, or a kind of parent mci does not route through.
	ReasonNotSupportedByParent = "NotSupportedByParent"
	// ReasonHTTPRouteNotAccepted: the parent's controller rejected the route
	// (the route's status says so), or no listener of the parent allows it.
	ReasonHTTPRouteNotAccepted = "HTTPRouteNotAccepted"
	// ReasonResolvedRefs: the backendRef is permitted and names this import.
	ReasonResolvedRefs = "ResolvedRefs"
	// ReasonRefNotPermitted: the backendRef crosses namespaces and no
	// ReferenceGrant in the import's namespace allows it.
	ReasonRefNotPermitted = "RefNotPermitted"
)

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolImportList is a list of InferencePoolImports.
type InferencePoolImportList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferencePoolImport `json:"items"`
}

// +genclient
// +genclient:onlyVerbs=get,list,watch
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExport reports, in the exporting cluster, what became of an
// InferencePool that carries an export annotation: whether the export is
// valid and which clusters of the ClusterSet import it, or why not. It has
// the namespace and name of the pool, and is computed on demand.
type InferencePoolExport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is intentionally empty since this resource is fully computed.
	// +optional
	Spec InferencePoolExportSpec `json:"spec,omitempty"`

	// Status says whether the export is valid and where it is imported.
	// +optional
	Status InferencePoolExportStatus `json:"status,omitempty"`
}

// InferencePoolExportSpec is intentionally empty.
type InferencePoolExportSpec struct{}

// InferencePoolExportStatus says whether an export is valid and where it is imported.
type InferencePoolExportStatus struct {
	// RoutingMode is the mode the export asks for, when the export is valid.
	// +optional
	RoutingMode RoutingMode `json:"routingMode,omitempty"`

	// Clusters lists every other member of the ClusterSet, sorted by name,
	// and whether it imports the pool.
	// +optional
	// +listType=map
	// +listMapKey=name
	Clusters []ExportTargetCluster `json:"clusters,omitempty"`

	// Conditions include Valid: whether the export annotations are valid.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the InferencePool generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ExportTargetCluster is one other member of the ClusterSet and whether it imports the pool.
type ExportTargetCluster struct {
	// Name of the cluster.
	Name string `json:"name"`
	// Imported is true when the cluster serves an InferencePoolImport for the pool.
	Imported bool `json:"imported"`
	// Reason is a CamelCase reason: Imported, NamespaceNotFound,
	// ClusterUnreachable, CredentialsRejected or InvalidExport.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message is a human readable explanation.
	// +optional
	Message string `json:"message,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// InferencePoolExportList is a list of InferencePoolExports.
type InferencePoolExportList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []InferencePoolExport `json:"items"`
}
