package imports

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/eppaddr"
)

// eppServiceName returns the name of the Service the pool's
// endpointPickerRef names, and a verdict when the ref cannot be imported:
// it has no name, or names something other than a core Service.
func eppServiceName(cluster string, pool *poolv1.InferencePool) (string, *verdict) {
	ref := pool.Spec.EndpointPickerRef
	if ref.Name == "" {
		return "", &verdict{
			reason:  v1alpha1.ReasonInvalidEndpointPickerRef,
			message: fmt.Sprintf("InferencePool %s/%s in cluster %s has no spec.endpointPickerRef.name", pool.Namespace, pool.Name, cluster),
		}
	}
	group := ""
	if ref.Group != nil {
		group = *ref.Group
	}
	if group != "" || (ref.Kind != "" && ref.Kind != "Service") {
		return ref.Name, &verdict{
			reason: v1alpha1.ReasonInvalidEndpointPickerRef,
			message: fmt.Sprintf("InferencePool %s/%s in cluster %s has an endpointPickerRef of kind %q in group %q; only a core Service (kind \"Service\", group \"\") can be imported",
				pool.Namespace, pool.Name, cluster, ref.Kind, group),
		}
	}
	return ref.Name, nil
}

// endpointPickerImport computes an EndpointMode cluster entry's
// endpointPicker and its Ready verdict.
func endpointPickerImport(m *Member, pool *poolv1.InferencePool, counter endpointCounter) (inference.EndpointPickerImport, verdict) {
	name, invalid := eppServiceName(m.Name, pool)
	// service is a required list: serve [] rather than null when the EPP
	// cannot be located.
	epp := inference.EndpointPickerImport{Name: name, Service: []inference.ServiceImport{}}
	if invalid != nil {
		return epp, *invalid
	}

	svc := m.service(pool.Namespace, name)
	if svc == nil {
		return epp, verdict{
			reason: v1alpha1.ReasonEndpointPickerNotFound,
			message: fmt.Sprintf("Service %s/%s, the endpointPickerRef of InferencePool %s/%s, does not exist in cluster %s",
				pool.Namespace, name, pool.Namespace, pool.Name, m.Name),
		}
	}

	var refPort int32
	if p := pool.Spec.EndpointPickerRef.Port; p != nil {
		refPort = p.Number
	}
	ports := eppaddr.ResolvePorts(svc, refPort)
	epp.Service = []inference.ServiceImport{serviceImport(svc, ports.ExtProc)}
	// The exporter's ParseExport has accepted the annotation's value.
	secret, _ := eppaddr.EndpointPickerSecret(pool.Annotations)
	if secret != "" {
		epp.SecretRef = &corev1.SecretReference{Namespace: pool.Namespace, Name: secret}
	}
	// The exporter's ParseExport has accepted the transport annotation too.
	modes, _ := eppaddr.EndpointPickerTransport(pool.Annotations)
	policies := m.backendTLSPolicies(pool.Namespace)
	policy := func(port int32) *gatewayv1.BackendTLSPolicy { return eppaddr.TLSPolicyFor(policies, svc, port) }
	epp.Transport = portTransport(modes.ExtProc, policy(ports.ExtProc), true)
	if ports.Health != 0 {
		epp.Health = &inference.HealthEndpoint{Port: ports.Health, SecretRef: epp.SecretRef, Transport: portTransport(modes.Health, policy(ports.Health), false)}
	}
	if ports.Metrics != 0 {
		epp.Metrics = &inference.MetricsEndpoint{Port: ports.Metrics, SecretRef: epp.SecretRef, Transport: portTransport(modes.Metrics, policy(ports.Metrics), false)}
		// Accepted by ParseExport too; the token changes no transport.
		if token, _ := eppaddr.EndpointPickerMetricsTokenSecret(pool.Annotations); token != "" {
			epp.Metrics.TokenSecretRef = &corev1.SecretReference{Namespace: pool.Namespace, Name: token}
		}
	}

	if ports.ExtProc == 0 {
		return epp, verdict{
			reason: v1alpha1.ReasonInvalidEndpointPickerRef,
			message: fmt.Sprintf("the ext-proc port of Service %s/%s in cluster %s is unknown: InferencePool %s/%s sets no endpointPickerRef.port and the Service has no port named ext-proc or grpc, nor a single port other than health and metrics",
				pool.Namespace, name, m.Name, pool.Namespace, pool.Name),
		}
	}
	return epp, eppReadiness(m.Name, svc, counter)
}

// eppReadiness is Ready for an EPP Service: at least one ready endpoint in
// its EndpointSlices. An ExternalName Service has no endpoints to check and
// counts as ready.
func eppReadiness(cluster string, svc *corev1.Service, counter endpointCounter) verdict {
	if serviceType(svc) == corev1.ServiceTypeExternalName {
		return verdict{
			ok:      true,
			reason:  v1alpha1.ReasonReady,
			message: fmt.Sprintf("Service %s/%s in cluster %s is an ExternalName Service (%s): it has no endpoints to check, so it is taken as ready", svc.Namespace, svc.Name, cluster, svc.Spec.ExternalName),
		}
	}
	c := counter.count(svc.Namespace, svc.Name)
	switch {
	case c.ready > 0:
		return verdict{
			ok:     true,
			reason: v1alpha1.ReasonReady,
			// Concatenation rather than Sprintf: this is the message of
			// nearly every cluster entry of a large list.
			message: "Service " + svc.Namespace + "/" + svc.Name + " in cluster " + cluster + " has " + strconv.Itoa(c.ready) + " ready endpoint(s)",
		}
	case c.slices == 0:
		return verdict{
			reason:  v1alpha1.ReasonNoReadyEndpoints,
			message: fmt.Sprintf("Service %s/%s in cluster %s has no EndpointSlices", svc.Namespace, svc.Name, cluster),
		}
	default:
		return verdict{
			reason:  v1alpha1.ReasonNoReadyEndpoints,
			message: fmt.Sprintf("Service %s/%s in cluster %s has %d endpoint(s), none ready", svc.Namespace, svc.Name, cluster, c.endpoints),
		}
	}
}

// service gets one Service of the member, or nil.
func (m *Member) service(namespace, name string) *corev1.Service {
	if m.Services == nil {
		return nil
	}
	svc, err := m.Services.Services(namespace).Get(name)
	if err != nil {
		return nil
	}
	return svc
}
