package clusterset

import (
	"slices"
	"strings"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
)

// trim is the informers' transform: it keeps only the fields the import
// computation reads, so that a member with many unrelated Services and
// EndpointSlices costs little memory. Every member's cache holds these
// trimmed objects, never the full ones.
func trim(obj interface{}) (interface{}, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return trimService(o), nil
	case *discoveryv1.EndpointSlice:
		return trimEndpointSlice(o), nil
	case *corev1.Pod:
		// An export publishes the addresses of the pods its pool's
		// selector picks that may still serve: labels, addresses and
		// phase are all it reads.
		meta := trimMeta(o.ObjectMeta)
		meta.Labels = o.Labels
		return &corev1.Pod{ObjectMeta: meta, Status: corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs}}, nil
	case *corev1.Namespace:
		// The labels are matched against a listener's allowedRoutes
		// namespace selector (the local cluster's only: see trimOther).
		meta := trimMeta(o.ObjectMeta)
		meta.Labels = o.Labels
		return &corev1.Namespace{ObjectMeta: meta}, nil
	case *gatewayv1.Gateway:
		return trimGateway(o), nil
	case *gatewayv1.HTTPRoute:
		return trimHTTPRoute(o), nil
	case *gatewayv1beta1.ReferenceGrant:
		return &gatewayv1beta1.ReferenceGrant{ObjectMeta: trimMeta(o.ObjectMeta), Spec: o.Spec}, nil
	case *gatewayv1.BackendTLSPolicy:
		// Imports carry the targets and the validation only; the age
		// decides between policies that target the same port.
		meta := trimMeta(o.ObjectMeta)
		meta.CreationTimestamp = o.CreationTimestamp
		return &gatewayv1.BackendTLSPolicy{ObjectMeta: meta, Spec: gatewayv1.BackendTLSPolicySpec{TargetRefs: o.Spec.TargetRefs, Validation: o.Spec.Validation}}, nil
	case *poolv1.InferencePool:
		// The pod selector stays: an export publishes the addresses of
		// the pods it picks.
		o.ManagedFields = nil
		o.Annotations = projectAnnotations(o.Annotations)
		return o, nil
	}
	// cache.DeletedFinalStateUnknown and anything unexpected pass through.
	return obj, nil
}

var _ cache.TransformFunc = trim

// trimOther is trim for every member but the local cluster: its pools keep
// only the Gateways among status.parents, the parents the import
// computation reads. The other entries, mci's own Exported entry of each
// exported pool among them, are the exporting cluster's business, and
// every mci-apiserver of every cluster would otherwise hold them. The local
// cluster's pools keep every entry: the Exported status is written from
// them, and a write must carry the other controllers' entries as they are.
// Its namespaces keep no labels: only the local cluster's routes attach to
// Gateways here.
func trimOther(obj interface{}) (interface{}, error) {
	out, err := trim(obj)
	if ns, ok := out.(*corev1.Namespace); ok {
		ns.Labels = nil
	}
	if p, ok := out.(*poolv1.InferencePool); ok && err == nil {
		p.Status.Parents = slices.DeleteFunc(p.Status.Parents, func(ps poolv1.ParentStatus) bool { return !isGateway(ps.ParentRef) })
		// DeleteFunc keeps the decoded array: without a fresh one, every
		// other member's exported pool would hold its emptied entry.
		if len(p.Status.Parents) == 0 {
			p.Status.Parents = nil
		} else if len(p.Status.Parents) < cap(p.Status.Parents) {
			p.Status.Parents = slices.Clone(p.Status.Parents)
		}
	}
	return out, err
}

// isGateway says whether a pool's parent is a Gateway (the kind and group
// a parentRef defaults to).
func isGateway(ref poolv1.ParentReference) bool {
	return (ref.Kind == "" || ref.Kind == "Gateway") && (ref.Group == nil || *ref.Group == gatewayv1.GroupName)
}

// projectAnnotationDomains are the annotation key prefixes mci reads on an
// InferencePool (the export annotations and mci's own).
var projectAnnotationDomains = []string{"inference.networking.x-k8s.io/", "mci.x-k8s.io/"}

// projectAnnotations keeps a pool's annotations of mci's domains. A pool's
// annotations may total 256 KiB (kubectl apply alone leaves a copy of the
// whole object in one), and every mci-apiserver of every cluster would
// otherwise hold them for every pool of every member.
func projectAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		for _, domain := range projectAnnotationDomains {
			if strings.HasPrefix(k, domain) {
				if out == nil {
					out = make(map[string]string, 2)
				}
				// Every pool repeats the same few keys: one copy each.
				out[unique.Make(k).Value()] = v
				break
			}
		}
	}
	return out
}

// trimMeta keeps what identifies an object and orders its changes.
func trimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         m.Namespace,
		ResourceVersion:   m.ResourceVersion,
		DeletionTimestamp: m.DeletionTimestamp,
	}
}

func trimService(s *corev1.Service) *corev1.Service {
	out := &corev1.Service{ObjectMeta: trimMeta(s.ObjectMeta)}
	out.Spec.Type = s.Spec.Type
	out.Spec.ClusterIPs = s.Spec.ClusterIPs
	if len(s.Spec.ClusterIPs) == 0 {
		// Only objects from before dual-stack lack clusterIPs.
		out.Spec.ClusterIP = s.Spec.ClusterIP
	}
	out.Spec.ExternalName = s.Spec.ExternalName
	if len(s.Spec.Ports) > 0 {
		out.Spec.Ports = make([]corev1.ServicePort, len(s.Spec.Ports))
		for i, p := range s.Spec.Ports {
			out.Spec.Ports[i] = corev1.ServicePort{Name: p.Name, Port: p.Port}
		}
	}
	out.Status.LoadBalancer.Ingress = s.Status.LoadBalancer.Ingress
	return out
}

func trimEndpointSlice(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{ObjectMeta: trimMeta(s.ObjectMeta), AddressType: s.AddressType}
	if svc, ok := s.Labels[discoveryv1.LabelServiceName]; ok {
		out.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	// Readiness is all the computation needs of each endpoint; addresses
	// are what a data path would need, and imports carry Service addresses.
	if len(s.Endpoints) > 0 {
		out.Endpoints = make([]discoveryv1.Endpoint, len(s.Endpoints))
		for i, e := range s.Endpoints {
			out.Endpoints[i] = discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: e.Conditions.Ready}}
		}
	}
	return out
}

func trimGateway(g *gatewayv1.Gateway) *gatewayv1.Gateway {
	out := &gatewayv1.Gateway{ObjectMeta: trimMeta(g.ObjectMeta)}
	if len(g.Spec.Listeners) > 0 {
		out.Spec.Listeners = make([]gatewayv1.Listener, len(g.Spec.Listeners))
		for i, l := range g.Spec.Listeners {
			// allowedRoutes and the hostname decide whether the local
			// Gateway takes a route (an import's parents); they are small.
			out.Spec.Listeners[i] = gatewayv1.Listener{Name: l.Name, Port: l.Port, Protocol: l.Protocol, Hostname: l.Hostname, AllowedRoutes: l.AllowedRoutes}
		}
	}
	out.Status.Addresses = g.Status.Addresses
	out.Status.Conditions = g.Status.Conditions
	return out
}

// trimHTTPRoute keeps what an import's parents are computed from: the
// parentRefs, the hostnames and the backendRefs to InferencePoolImports,
// with the Accepted condition each parent's controller wrote. A route that
// uses no import keeps only its metadata: routes are many, and most send
// traffic elsewhere.
func trimHTTPRoute(r *gatewayv1.HTTPRoute) *gatewayv1.HTTPRoute {
	out := &gatewayv1.HTTPRoute{ObjectMeta: trimMeta(r.ObjectMeta)}
	if len(imports.ImportBackendRefs(r)) == 0 {
		return out
	}
	out.Spec.ParentRefs = r.Spec.ParentRefs
	out.Spec.Hostnames = r.Spec.Hostnames
	var refs []gatewayv1.HTTPBackendRef
	for _, rule := range r.Spec.Rules {
		for _, ref := range rule.BackendRefs {
			if imports.IsImportBackendRef(ref.BackendObjectReference) {
				refs = append(refs, gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: ref.BackendObjectReference}})
			}
		}
	}
	out.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: refs}}
	for _, p := range r.Status.Parents {
		ps := gatewayv1.RouteParentStatus{ParentRef: p.ParentRef, ControllerName: p.ControllerName}
		if c := meta.FindStatusCondition(p.Conditions, string(gatewayv1.RouteConditionAccepted)); c != nil {
			ps.Conditions = []metav1.Condition{*c}
		}
		out.Status.Parents = append(out.Status.Parents, ps)
	}
	return out
}
