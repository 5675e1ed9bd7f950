package imports

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/eppaddr"
)

// serviceType is the Service's type; an unset type is ClusterIP, as the API
// defaults it.
func serviceType(svc *corev1.Service) corev1.ServiceType {
	if svc.Spec.Type == "" {
		return corev1.ServiceTypeClusterIP
	}
	return svc.Spec.Type
}

// appendUnique appends v to list unless it has it.
func appendUnique[T comparable](list []T, v T) []T {
	if slices.Contains(list, v) {
		return list
	}
	return append(list, v)
}

// serviceImport is the Service as an importing gateway sees it.
func serviceImport(svc *corev1.Service, extProcPort int32) inference.ServiceImport {
	si := inference.ServiceImport{
		Type:      serviceType(svc),
		Addresses: eppaddr.ServiceAddresses(svc),
	}
	if extProcPort != 0 {
		si.Ports = []inference.Port{{Number: extProcPort}}
	}
	return si
}
