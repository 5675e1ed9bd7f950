package routetable

import (
	"maps"
	"slices"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// sameEntry says whether two cluster entries of an import are the same,
// field by field: what tells the Incremental builder that an entry's
// resolution can be reused. It is written out rather than reflected
// because it runs for every entry of a changed import, where
// reflect.DeepEqual cost as much as resolving the entry again; a test
// fails when a field of the entry is added and not compared here. nil and
// empty lists are the same (resolution reads neither).
func sameEntry(a, b *v1alpha1.ImportedCluster) bool {
	return a.Name == b.Name && a.RoutingMode == b.RoutingMode && a.TargetPortNumber == b.TargetPortNumber &&
		slices.Equal(a.EndpointAddresses, b.EndpointAddresses) &&
		slices.Equal(a.Conditions, b.Conditions) &&
		samePtr(a.ExportSettings, b.ExportSettings, sameExportSettings) &&
		sameEndpointPicker(&a.EndpointPicker, &b.EndpointPicker) &&
		slices.EqualFunc(a.Parents, b.Parents, sameParent)
}

// samePtr says whether a and b are both nil, or both set and the same
// by same.
func samePtr[T any](a, b *T, same func(a, b *T) bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return same(a, b)
}

func eq[T comparable](a, b *T) bool { return *a == *b }

func sameExportSettings(a, b *v1alpha1.ExportSettings) bool {
	return a.Weight == b.Weight && a.Region == b.Region && maps.Equal(a.Tags, b.Tags)
}

func sameEndpointPicker(a, b *v1alpha1.EndpointPickerImport) bool {
	return a.Name == b.Name && slices.EqualFunc(a.Service, b.Service, sameService) &&
		samePtr(a.Health, b.Health, func(a, b *v1alpha1.HealthEndpoint) bool {
			return a.Port == b.Port && samePtr(a.SecretRef, b.SecretRef, eq) && samePtr(a.Transport, b.Transport, sameTransport)
		}) &&
		samePtr(a.Metrics, b.Metrics, func(a, b *v1alpha1.MetricsEndpoint) bool {
			return a.Port == b.Port && samePtr(a.SecretRef, b.SecretRef, eq) && samePtr(a.Transport, b.Transport, sameTransport) &&
				samePtr(a.TokenSecretRef, b.TokenSecretRef, eq)
		}) &&
		samePtr(a.SecretRef, b.SecretRef, eq) && samePtr(a.Transport, b.Transport, sameTransport)
}

func sameService(a, b v1alpha1.ServiceImport) bool {
	return a.Type == b.Type && slices.Equal(a.Addresses, b.Addresses) && slices.Equal(a.Ports, b.Ports)
}

func sameTransport(a, b *v1alpha1.EndpointTransport) bool {
	return a.Mode == b.Mode && samePtr(a.Validation, b.Validation, func(a, b *v1alpha1.BackendTLSValidation) bool {
		return a.PolicyName == b.PolicyName && a.WellKnownCACertificates == b.WellKnownCACertificates && a.Hostname == b.Hostname &&
			slices.Equal(a.CACertificateRefs, b.CACertificateRefs) && slices.Equal(a.SubjectAltNames, b.SubjectAltNames)
	})
}

func sameParent(a, b v1alpha1.ParentImport) bool {
	return a.Name == b.Name && a.Namespace == b.Namespace && slices.EqualFunc(a.Service, b.Service, sameService) &&
		slices.Equal(a.Conditions, b.Conditions)
}
