package clusterset

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

func TestTrimKeepsWhatTheComputationReadsAndDropsTheRest(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "epp", Namespace: "ns", ResourceVersion: "7",
			Annotations:   map[string]string{"big": "annotation"},
			Labels:        map[string]string{"app": "epp"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Selector: map[string]string{"app": "epp"},
			Ports:    []corev1.ServicePort{{Name: "health", Port: 9003}},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "127.0.0.2"}}}},
	}
	out, err := trim(svc)
	require.NoError(t, err)
	got := out.(*corev1.Service)
	assert.Equal(t, "7", got.ResourceVersion)
	assert.Empty(t, got.Annotations)
	assert.Empty(t, got.ManagedFields)
	assert.Empty(t, got.Spec.Selector)
	assert.Equal(t, svc.Spec.Ports[0].Port, got.Spec.Ports[0].Port)
	assert.Equal(t, "127.0.0.2", got.Status.LoadBalancer.Ingress[0].IP)

	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "epp", "other": "x"}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"192.0.2.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)},
			TargetRef: &corev1.ObjectReference{Name: "pod"},
		}},
	}
	out, err = trim(slice)
	require.NoError(t, err)
	gotSlice := out.(*discoveryv1.EndpointSlice)
	assert.Equal(t, map[string]string{discoveryv1.LabelServiceName: "epp"}, gotSlice.Labels)
	require.Len(t, gotSlice.Endpoints, 1)
	assert.False(t, *gotSlice.Endpoints[0].Conditions.Ready, "readiness is kept")
	assert.Empty(t, gotSlice.Endpoints[0].Addresses)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"a": "b"}}, Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{"kubernetes"}}}
	out, err = trim(ns)
	require.NoError(t, err)
	assert.Equal(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"a": "b"}}}, out,
		"the local cluster's namespaces keep their labels, for listeners' namespace selectors")
	out, err = trimOther(ns.DeepCopy())
	require.NoError(t, err)
	assert.Equal(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}, out, "another member's namespaces keep no labels")
}

func TestTrimKeepsThePoolsPodSelectorAndDropsForeignAnnotations(t *testing.T) {
	pool := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{
			Name: "llm", Namespace: "ns", Labels: map[string]string{"team": "a"},
			Annotations: map[string]string{
				"inference.networking.x-k8s.io/export":      "ClusterSet",
				"inference.networking.x-k8s.io/export-mode": "ParentMode",
				"mci.x-k8s.io/some-setting":                 "kept",
				corev1.LastAppliedConfigAnnotation:          strings.Repeat("x", 200<<10),
				"example.com/notes":                         "dropped",
			},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": "llm"}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp"},
		},
	}
	out, err := trim(pool)
	require.NoError(t, err)
	got := out.(*poolv1.InferencePool)
	assert.Equal(t, map[string]string{"app": "llm"}, got.Spec.Selector.MatchLabels, "the selector names the pods whose addresses an export publishes")
	assert.Empty(t, got.ManagedFields)
	assert.Equal(t, map[string]string{"team": "a"}, got.Labels, "imports carry the pool's labels")
	assert.Equal(t, map[string]string{
		"inference.networking.x-k8s.io/export":      "ClusterSet",
		"inference.networking.x-k8s.io/export-mode": "ParentMode",
		"mci.x-k8s.io/some-setting":                 "kept",
	}, got.Annotations, "only the annotations of mci's domains are kept")
	assert.Equal(t, int32(8000), int32(got.Spec.TargetPorts[0].Number))
	assert.Equal(t, "epp", string(got.Spec.EndpointPickerRef.Name))
}

func TestTrimKeepsOfAnHTTPRouteOnlyWhatMakesImportParents(t *testing.T) {
	importRef := gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{
		BackendObjectReference: gatewayv1.BackendObjectReference{
			Group: ptr.To(gatewayv1.Group("inference.networking.x-k8s.io")), Kind: ptr.To(gatewayv1.Kind("InferencePoolImport")), Name: "llm-pool",
		},
		Weight: ptr.To(int32(50)),
	}}
	serviceRef := gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "web"}}}
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns", ResourceVersion: "9", Annotations: map[string]string{"big": "x"}},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "gw"}}},
			Hostnames:       []gatewayv1.Hostname{"example.com"},
			Rules: []gatewayv1.HTTPRouteRule{
				{Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Value: ptr.To("/v1")}}}, BackendRefs: []gatewayv1.HTTPBackendRef{importRef, serviceRef}},
			},
		},
		Status: gatewayv1.HTTPRouteStatus{RouteStatus: gatewayv1.RouteStatus{Parents: []gatewayv1.RouteParentStatus{{
			ParentRef: gatewayv1.ParentReference{Name: "gw"}, ControllerName: "example.net/gw",
			Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue}, {Type: "ResolvedRefs", Status: metav1.ConditionTrue}},
		}}}},
	}
	out, err := trim(route)
	require.NoError(t, err)
	got := out.(*gatewayv1.HTTPRoute)
	assert.Equal(t, "9", got.ResourceVersion)
	assert.Empty(t, got.Annotations)
	assert.Equal(t, route.Spec.Hostnames, got.Spec.Hostnames, "hostnames decide which listeners take the route")
	assert.Equal(t, route.Spec.ParentRefs, got.Spec.ParentRefs)
	require.Len(t, got.Spec.Rules, 1)
	assert.Empty(t, got.Spec.Rules[0].Matches)
	require.Len(t, got.Spec.Rules[0].BackendRefs, 1, "only the import backendRef is kept")
	assert.Equal(t, importRef.BackendObjectReference, got.Spec.Rules[0].BackendRefs[0].BackendObjectReference)
	require.Len(t, got.Status.Parents, 1)
	require.Len(t, got.Status.Parents[0].Conditions, 1)
	assert.Equal(t, "Accepted", got.Status.Parents[0].Conditions[0].Type)

	plain := route.DeepCopy()
	plain.Spec.Rules[0].BackendRefs = []gatewayv1.HTTPBackendRef{serviceRef}
	out, err = trim(plain)
	require.NoError(t, err)
	assert.Equal(t, &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns", ResourceVersion: "9"}}, out, "a route that uses no import keeps only its metadata")
}

func TestTrimKeepsABackendTLSPolicysTargetsValidationAndAge(t *testing.T) {
	created := metav1.NewTime(metav1.Now().Rfc3339Copy().Time)
	p := &gatewayv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name: "epp-tls", Namespace: "ns", ResourceVersion: "9", CreationTimestamp: created,
			Annotations: map[string]string{"big": "annotation"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec: gatewayv1.BackendTLSPolicySpec{
			TargetRefs: []gatewayv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gatewayv1.LocalPolicyTargetReference{Kind: "Service", Name: "epp"}}},
			Validation: gatewayv1.BackendTLSPolicyValidation{CACertificateRefs: []gatewayv1.LocalObjectReference{{Kind: "ConfigMap", Name: "ca"}}, Hostname: "epp.example.com"},
			Options:    map[gatewayv1.AnnotationKey]gatewayv1.AnnotationValue{"x": "y"},
		},
		Status: gatewayv1.PolicyStatus{Ancestors: []gatewayv1.PolicyAncestorStatus{{ControllerName: "gw"}}},
	}
	out, err := trim(p)
	require.NoError(t, err)
	assert.Equal(t, &gatewayv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "epp-tls", Namespace: "ns", ResourceVersion: "9", CreationTimestamp: created},
		Spec:       gatewayv1.BackendTLSPolicySpec{TargetRefs: p.Spec.TargetRefs, Validation: p.Spec.Validation},
	}, out)
}

func TestOtherMembersPoolsKeepOnlyGatewayParents(t *testing.T) {
	parents := func() []poolv1.ParentStatus {
		return []poolv1.ParentStatus{
			{ParentRef: poolv1.ParentReference{Name: "gw"}, ControllerName: "example.com/gateway"},
			{ParentRef: poolv1.ParentReference{Group: ptr.To("gateway.networking.k8s.io"), Kind: "Gateway", Name: "gw2"}},
			{ParentRef: poolv1.ParentReference{Group: ptr.To("inference.networking.x-k8s.io"), Kind: "InferencePoolImport", Name: "pool"}, ControllerName: "mci.x-k8s.io/apiserver",
				Conditions: []metav1.Condition{{Type: "Exported", Status: metav1.ConditionTrue, Reason: "Exported", Message: "exported to every other member"}}},
		}
	}
	pool := func() *poolv1.InferencePool {
		return &poolv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: "ns"}, Status: poolv1.InferencePoolStatus{Parents: parents()}}
	}

	out, err := trimOther(pool())
	require.NoError(t, err)
	assert.Equal(t, parents()[:2], out.(*poolv1.InferencePool).Status.Parents, "another member's pool keeps its Gateways only")

	assert.Equal(t, 2, cap(out.(*poolv1.InferencePool).Status.Parents), "nor the array that held the others")

	exportedOnly := pool()
	exportedOnly.Status.Parents = parents()[2:]
	out, err = trimOther(exportedOnly)
	require.NoError(t, err)
	assert.Nil(t, out.(*poolv1.InferencePool).Status.Parents, "a pool with mci's entry only keeps nothing")

	out, err = trim(pool())
	require.NoError(t, err)
	assert.Equal(t, parents(), out.(*poolv1.InferencePool).Status.Parents, "the local cluster's pool keeps every entry")
}

func TestPoolsUsingServiceAreThePoolsOfItsNamespaceThatNameIt(t *testing.T) {
	withEPP := func(ns, name, epp string) *poolv1.InferencePool {
		return &poolv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: poolv1.InferencePoolSpec{EndpointPickerRef: poolv1.EndpointPickerRef{Name: epp}}}
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range []*poolv1.InferencePool{
		withEPP("a", "p1", "epp"), withEPP("a", "p2", "epp"), withEPP("a", "p3", "other"), withEPP("b", "p4", "epp"),
	} {
		require.NoError(t, idx.Add(p))
	}
	m := &member{poolIndexer: idx}
	assert.ElementsMatch(t, []string{"a/p1", "a/p2"}, m.poolsUsingService("a", "epp"))
	assert.Equal(t, []string{"b/p4"}, m.poolsUsingService("b", "epp"))
	assert.Empty(t, m.poolsUsingService("c", "epp"))
}
