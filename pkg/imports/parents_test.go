package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

func TestParentModeEntry(t *testing.T) {
	ic := importedFrom(t,
		pool(testNamespace, testPool, parentMode(gatewayRef("", "gw"))),
		gateway(testNamespace, "gw", []int32{443, 80, 443, 8080},
			addresses("203.0.113.10", "gw.example.com", "203.0.113.10"),
			programmed(metav1.ConditionTrue)),
	)

	assert.Equal(t, inference.RoutingModeParent, ic.RoutingMode)
	assert.Equal(t, int32(8000), ic.TargetPortNumber)
	assert.Equal(t, inference.EndpointPickerImport{}, ic.EndpointPicker, "ParentMode carries no endpointPicker")
	require.Len(t, ic.Parents, 1)
	p := ic.Parents[0]
	assert.Equal(t, "gw", p.Name)
	assert.Equal(t, testNamespace, p.Namespace, "the parent namespace defaults to the pool's")
	assert.Equal(t, []inference.ServiceImport{{
		Type:      corev1.ServiceTypeLoadBalancer,
		Addresses: []string{"203.0.113.10", "gw.example.com"},
		Ports:     []inference.Port{{Number: 80}, {Number: 443}, {Number: 8080}},
	}}, p.Service, "addresses once each, listener ports deduplicated and sorted")
	assert.Equal(t, metav1.ConditionTrue, condition(t, p.Conditions, "Programmed").Status, "parent conditions are the Gateway's")
	assert.Equal(t, t0, condition(t, p.Conditions, "Programmed").LastTransitionTime.Time.UTC(), "with the time the Gateway reported")

	ready := condition(t, ic.Conditions, v1alpha1.ConditionReady)
	assert.Equal(t, metav1.ConditionTrue, ready.Status)
	assert.Equal(t, v1alpha1.ReasonReady, ready.Reason)
	assert.Contains(t, ready.Message, "example/gw")
}

func TestParentModeParentsAndReadiness(t *testing.T) {
	readyGW := func(ns, name string) runtime.Object {
		return gateway(ns, name, []int32{80}, addresses("203.0.113.1"), programmed(metav1.ConditionTrue))
	}
	tests := []struct {
		name        string
		refs        []poolv1.ParentReference
		gateways    []runtime.Object
		wantParents []string // namespace/name, in order
		wantNoSvc   []string // parents listed without a service
		wantReady   metav1.ConditionStatus
		wantMessage []string
	}{
		{
			name:        "a programmed Gateway with an address makes the cluster Ready",
			refs:        []poolv1.ParentReference{gatewayRef("infra", "gw")},
			gateways:    []runtime.Object{readyGW("infra", "gw")},
			wantParents: []string{"infra/gw"},
			wantReady:   metav1.ConditionTrue,
		},
		{
			name:        "a missing Gateway is listed without a service and does not make the cluster Ready",
			refs:        []poolv1.ParentReference{gatewayRef("", "gone")},
			wantParents: []string{"example/gone"},
			wantNoSvc:   []string{"example/gone"},
			wantReady:   metav1.ConditionFalse,
			wantMessage: []string{"Gateway example/gone does not exist"},
		},
		{
			name:        "a missing Gateway is ignored for readiness when another is ready",
			refs:        []poolv1.ParentReference{gatewayRef("", "gone"), gatewayRef("", "gw")},
			gateways:    []runtime.Object{readyGW(testNamespace, "gw")},
			wantParents: []string{"example/gone", "example/gw"},
			wantNoSvc:   []string{"example/gone"},
			wantReady:   metav1.ConditionTrue,
		},
		{
			name:        "a Gateway that is not Programmed is not ready",
			refs:        []poolv1.ParentReference{gatewayRef("", "gw")},
			gateways:    []runtime.Object{gateway(testNamespace, "gw", []int32{80}, addresses("203.0.113.1"), programmed(metav1.ConditionFalse))},
			wantParents: []string{"example/gw"},
			wantReady:   metav1.ConditionFalse,
			wantMessage: []string{"example/gw is not Programmed"},
		},
		{
			name:        "a Gateway without conditions is not ready",
			refs:        []poolv1.ParentReference{gatewayRef("", "gw")},
			gateways:    []runtime.Object{gateway(testNamespace, "gw", []int32{80}, addresses("203.0.113.1"))},
			wantParents: []string{"example/gw"},
			wantReady:   metav1.ConditionFalse,
		},
		{
			name:        "a programmed Gateway without a status address is not ready",
			refs:        []poolv1.ParentReference{gatewayRef("", "gw")},
			gateways:    []runtime.Object{gateway(testNamespace, "gw", []int32{80}, programmed(metav1.ConditionTrue))},
			wantParents: []string{"example/gw"},
			wantReady:   metav1.ConditionFalse,
			wantMessage: []string{"example/gw has no status address"},
		},
		{
			name:        "a pool without parents is not ready and says so",
			wantReady:   metav1.ConditionFalse,
			wantMessage: []string{"no Gateway in status.parents"},
		},
		{
			name: "parents that are not Gateways are left out",
			refs: []poolv1.ParentReference{
				{Group: ptr("example.com"), Kind: "Gateway", Name: "foreign"},
				{Kind: "Mesh", Name: "mesh"},
				{Group: ptr("gateway.networking.k8s.io"), Kind: "Gateway", Name: "gw"},
			},
			gateways:    []runtime.Object{readyGW(testNamespace, "gw"), readyGW(testNamespace, "foreign"), readyGW(testNamespace, "mesh")},
			wantParents: []string{"example/gw"},
			wantReady:   metav1.ConditionTrue,
		},
		{
			name:        "a parent reported twice is listed once, and parents are sorted",
			refs:        []poolv1.ParentReference{gatewayRef("", "b"), gatewayRef(testNamespace, "a"), gatewayRef("", "b")},
			gateways:    []runtime.Object{readyGW(testNamespace, "a"), readyGW(testNamespace, "b")},
			wantParents: []string{"example/a", "example/b"},
			wantReady:   metav1.ConditionTrue,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]runtime.Object{pool(testNamespace, testPool, parentMode(tc.refs...))}, tc.gateways...)
			ic := importedFrom(t, objs...)

			var got, noSvc []string
			for _, p := range ic.Parents {
				got = append(got, p.Namespace+"/"+p.Name)
				if len(p.Service) == 0 {
					noSvc = append(noSvc, p.Namespace+"/"+p.Name)
				}
			}
			assert.Equal(t, tc.wantParents, got)
			assert.Equal(t, tc.wantNoSvc, noSvc)

			c := condition(t, ic.Conditions, v1alpha1.ConditionReady)
			assert.Equal(t, tc.wantReady, c.Status)
			if tc.wantReady == metav1.ConditionFalse {
				assert.Equal(t, v1alpha1.ReasonNoReadyParents, c.Reason)
			}
			for _, s := range tc.wantMessage {
				assert.Contains(t, c.Message, s)
			}
		})
	}
}
