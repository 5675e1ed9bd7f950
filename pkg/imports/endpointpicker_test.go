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

// importedFrom computes the import that cluster-b serves of example/llm-pool
// when cluster-a holds exporter, and returns cluster-a's entry.
func importedFrom(t *testing.T, exporter ...runtime.Object) inference.ImportedCluster {
	t.Helper()
	cs := clusterSet("cluster-b",
		member(t, "cluster-a", exporter...),
		member(t, "cluster-b", namespace(testNamespace)),
	)
	imp, ok := importBothWays(t, cs, testNamespace, testPool)
	require.True(t, ok)
	require.Len(t, imp.Status.Clusters, 1)
	return imp.Status.Clusters[0]
}

func TestEndpointModeEntry(t *testing.T) {
	ic := importedFrom(t, readyEPP(testNamespace, testPool, targetPorts(8000, 8001))...)
	assert.Equal(t, inference.ImportedCluster{
		Name:             "cluster-a",
		RoutingMode:      inference.RoutingModeEndpoint,
		TargetPortNumber: 8000,
		EndpointPicker: inference.EndpointPickerImport{
			Name: testEPP,
			Service: []inference.ServiceImport{{
				Type:      corev1.ServiceTypeClusterIP,
				Addresses: []string{"10.96.0.10"},
				Ports:     []inference.Port{{Number: 9002}},
			}},
			Health:  &inference.HealthEndpoint{Port: 9003},
			Metrics: &inference.MetricsEndpoint{Port: 9090},
		},
		Conditions: []metav1.Condition{{
			Type:               v1alpha1.ConditionReady,
			Status:             metav1.ConditionTrue,
			ObservedGeneration: 1,
			Reason:             v1alpha1.ReasonReady,
			Message:            "Service example/epp in cluster cluster-a has 1 ready endpoint(s)",
		}},
	}, ic)

	t.Run("a pool without target ports has targetPortNumber 0", func(t *testing.T) {
		ic := importedFrom(t, readyEPP(testNamespace, testPool, targetPorts())...)
		assert.Equal(t, int32(0), ic.TargetPortNumber)
	})
}

func TestEndpointPickerSecretRef(t *testing.T) {
	secret := func(name string) poolOption {
		return func(p *poolv1.InferencePool) { p.Annotations[v1alpha1.EndpointPickerSecretAnnotation] = name }
	}
	token := func(name string) poolOption {
		return func(p *poolv1.InferencePool) {
			p.Annotations[v1alpha1.EndpointPickerMetricsTokenSecretAnnotation] = name
		}
	}
	ref := &corev1.SecretReference{Namespace: testNamespace, Name: "epp-client-tls"}
	tokenRef := &corev1.SecretReference{Namespace: testNamespace, Name: "epp-metrics-token"}
	tests := []struct {
		name    string
		objs    []runtime.Object
		want    *corev1.SecretReference
		health  *inference.HealthEndpoint
		metrics *inference.MetricsEndpoint
	}{
		{
			name:    "without the annotation the EPP is reached in plaintext: no secretRef anywhere",
			objs:    readyEPP(testNamespace, testPool),
			health:  &inference.HealthEndpoint{Port: 9003},
			metrics: &inference.MetricsEndpoint{Port: 9090},
		},
		{
			name:    "the annotation names a Secret of the pool's namespace for the ext-proc, health and metrics ports",
			objs:    readyEPP(testNamespace, testPool, secret("epp-client-tls")),
			want:    ref,
			health:  &inference.HealthEndpoint{Port: 9003, SecretRef: ref},
			metrics: &inference.MetricsEndpoint{Port: 9090, SecretRef: ref},
		},
		{
			name:    "the metrics token Secret goes to the metrics port alone, and makes nothing TLS",
			objs:    readyEPP(testNamespace, testPool, token("epp-metrics-token")),
			health:  &inference.HealthEndpoint{Port: 9003},
			metrics: &inference.MetricsEndpoint{Port: 9090, TokenSecretRef: tokenRef},
		},
		{
			name:    "both Secrets: TLS credentials everywhere, the token for metrics",
			objs:    readyEPP(testNamespace, testPool, secret("epp-client-tls"), token("epp-metrics-token")),
			want:    ref,
			health:  &inference.HealthEndpoint{Port: 9003, SecretRef: ref},
			metrics: &inference.MetricsEndpoint{Port: 9090, SecretRef: ref, TokenSecretRef: tokenRef},
		},
		{
			name: "a Service without health and metrics ports carries the Secret on the endpointPicker alone",
			objs: []runtime.Object{
				pool(testNamespace, testPool, secret("epp-client-tls")),
				service(testNamespace, testEPP, ports(port("ext-proc", 9002))),
				slice(testNamespace, testEPP, isReady),
			},
			want: ref,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ic := importedFrom(t, tc.objs...)
			assert.Equal(t, tc.want, ic.EndpointPicker.SecretRef)
			assert.Equal(t, tc.health, ic.EndpointPicker.Health)
			assert.Equal(t, tc.metrics, ic.EndpointPicker.Metrics)
		})
	}

	t.Run("a pool whose annotation is not a Secret name is listed not Ready, with no EPP, rather than reached in plaintext", func(t *testing.T) {
		ic := importedFrom(t, readyEPP(testNamespace, testPool, secret("not/a-name"))...)
		ready := condition(t, ic.Conditions, v1alpha1.ConditionReady)
		assert.Equal(t, metav1.ConditionFalse, ready.Status)
		assert.Equal(t, v1alpha1.ReasonInvalidExport, ready.Reason)
		assert.Contains(t, ready.Message, "not/a-name")
		assert.Equal(t, inference.EndpointPickerImport{}, ic.EndpointPicker)
	})

	t.Run("a ParentMode export has no EPP, so the annotation adds nothing", func(t *testing.T) {
		ic := importedFrom(t,
			pool(testNamespace, testPool, parentMode(gatewayRef("", "gw")), secret("epp-client-tls")),
			gateway(testNamespace, "gw", []int32{80}, addresses("203.0.113.10"), programmed(metav1.ConditionTrue)),
		)
		assert.Equal(t, inference.EndpointPickerImport{}, ic.EndpointPicker)
	})

	t.Run("the served v1alpha1 object carries the references", func(t *testing.T) {
		ic := importedFrom(t, readyEPP(testNamespace, testPool, secret("epp-client-tls"))...)
		var out v1alpha1.ImportedCluster
		require.NoError(t, v1alpha1.Convert_inference_ImportedCluster_To_v1alpha1_ImportedCluster(&ic, &out, nil))
		assert.Equal(t, ref, out.EndpointPicker.SecretRef)
		assert.Equal(t, ref, out.EndpointPicker.Health.SecretRef)
		assert.Equal(t, ref, out.EndpointPicker.Metrics.SecretRef)
	})
}

func TestEndpointPickerServiceByType(t *testing.T) {
	tests := []struct {
		name      string
		svc       *corev1.Service
		wantType  corev1.ServiceType
		wantAddrs []string
	}{
		{
			name:      "a ClusterIP Service is reached at its cluster IPs",
			svc:       service(testNamespace, testEPP, clusterIPs("10.96.0.20", "fd00::20")),
			wantType:  corev1.ServiceTypeClusterIP,
			wantAddrs: []string{"10.96.0.20", "fd00::20"},
		},
		{
			name:      "a Service without a type is a ClusterIP Service",
			svc:       service(testNamespace, testEPP, ofType("")),
			wantType:  corev1.ServiceTypeClusterIP,
			wantAddrs: []string{"10.96.0.10"},
		},
		{
			name:      "a Service with only the legacy clusterIP field is reached there",
			svc:       service(testNamespace, testEPP, func(s *corev1.Service) { s.Spec.ClusterIPs = nil }),
			wantType:  corev1.ServiceTypeClusterIP,
			wantAddrs: []string{"10.96.0.10"},
		},
		{
			name:      "a NodePort Service mirrors its type and is reached at its cluster IPs",
			svc:       service(testNamespace, testEPP, ofType(corev1.ServiceTypeNodePort)),
			wantType:  corev1.ServiceTypeNodePort,
			wantAddrs: []string{"10.96.0.10"},
		},
		{
			name:      "a LoadBalancer Service is reached at its ingress IP",
			svc:       service(testNamespace, testEPP, ingress(corev1.LoadBalancerIngress{IP: "203.0.113.7"})),
			wantType:  corev1.ServiceTypeLoadBalancer,
			wantAddrs: []string{"203.0.113.7"},
		},
		{
			name:      "a LoadBalancer Service is reached at its ingress hostname",
			svc:       service(testNamespace, testEPP, ingress(corev1.LoadBalancerIngress{Hostname: "epp.example.com"})),
			wantType:  corev1.ServiceTypeLoadBalancer,
			wantAddrs: []string{"epp.example.com"},
		},
		{
			name: "every LoadBalancer ingress is listed once, IP before hostname",
			svc: service(testNamespace, testEPP, ingress(
				corev1.LoadBalancerIngress{IP: "203.0.113.7", Hostname: "a.example.com"},
				corev1.LoadBalancerIngress{IP: "203.0.113.7"},
				corev1.LoadBalancerIngress{Hostname: "b.example.com"},
			)),
			wantType:  corev1.ServiceTypeLoadBalancer,
			wantAddrs: []string{"203.0.113.7", "a.example.com", "b.example.com"},
		},
		{
			name:      "a LoadBalancer Service still waiting for an ingress falls back to its cluster IPs",
			svc:       service(testNamespace, testEPP, ingress()),
			wantType:  corev1.ServiceTypeLoadBalancer,
			wantAddrs: []string{"10.96.0.10"},
		},
		{
			name:      "an ExternalName Service is reached at its external name",
			svc:       service(testNamespace, testEPP, externalName("epp.other.example.com")),
			wantType:  corev1.ServiceTypeExternalName,
			wantAddrs: []string{"epp.other.example.com"},
		},
		{
			name:      "a headless Service has no address",
			svc:       service(testNamespace, testEPP, clusterIPs(corev1.ClusterIPNone)),
			wantType:  corev1.ServiceTypeClusterIP,
			wantAddrs: nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ic := importedFrom(t, pool(testNamespace, testPool), tc.svc, slice(testNamespace, testEPP, isReady))
			require.Len(t, ic.EndpointPicker.Service, 1)
			si := ic.EndpointPicker.Service[0]
			assert.Equal(t, tc.wantType, si.Type)
			assert.Equal(t, tc.wantAddrs, si.Addresses)
			assert.Equal(t, []inference.Port{{Number: 9002}}, si.Ports, "ports carry the endpointPickerRef port")
		})
	}
}

func TestEndpointPickerPorts(t *testing.T) {
	noRefPort := eppRef(poolv1.EndpointPickerRef{Name: testEPP})
	tests := []struct {
		name        string
		poolOpts    []poolOption
		svcPorts    []corev1.ServicePort
		wantExtProc int32 // 0: no port, and the entry is not Ready
		wantHealth  *inference.HealthEndpoint
		wantMetrics *inference.MetricsEndpoint
	}{
		{
			name:        "health and metrics come from ports named health and metrics",
			svcPorts:    []corev1.ServicePort{port("ext-proc", 9002), port("health", 19003), port("metrics", 19090)},
			wantExtProc: 9002,
			wantHealth:  &inference.HealthEndpoint{Port: 19003},
			wantMetrics: &inference.MetricsEndpoint{Port: 19090},
		},
		{
			name:        "grpc-health and http-metrics are recognised",
			svcPorts:    []corev1.ServicePort{port("grpc-health", 1003), port("http-metrics", 1090)},
			wantExtProc: 9002,
			wantHealth:  &inference.HealthEndpoint{Port: 1003},
			wantMetrics: &inference.MetricsEndpoint{Port: 1090},
		},
		{
			name:        "health-grpc is recognised",
			svcPorts:    []corev1.ServicePort{port("health-grpc", 2003)},
			wantExtProc: 9002,
			wantHealth:  &inference.HealthEndpoint{Port: 2003},
		},
		{
			name:        "names ending in -health and -metrics are recognised",
			svcPorts:    []corev1.ServicePort{port("epp-health", 3003), port("epp-metrics", 3090)},
			wantExtProc: 9002,
			wantHealth:  &inference.HealthEndpoint{Port: 3003},
			wantMetrics: &inference.MetricsEndpoint{Port: 3090},
		},
		{
			name:        "a name wins over the conventional number",
			svcPorts:    []corev1.ServicePort{port("a", 9003), port("health", 4003), port("b", 9090), port("metrics", 4090)},
			wantExtProc: 9002,
			wantHealth:  &inference.HealthEndpoint{Port: 4003},
			wantMetrics: &inference.MetricsEndpoint{Port: 4090},
		},
		{
			name:        "without a matching name, ports numbered 9003 and 9090 are used",
			svcPorts:    []corev1.ServicePort{port("a", 9002), port("b", 9003), port("c", 9090)},
			wantExtProc: 9002,
			wantHealth:  &inference.HealthEndpoint{Port: 9003},
			wantMetrics: &inference.MetricsEndpoint{Port: 9090},
		},
		{
			name:        "names that merely contain health or metrics do not match",
			svcPorts:    []corev1.ServicePort{port("healthz", 5003), port("metricsx", 5090)},
			wantExtProc: 9002,
		},
		{
			name:        "without a health or metrics port both are nil",
			svcPorts:    []corev1.ServicePort{port("ext-proc", 9002)},
			wantExtProc: 9002,
		},
		{
			name:        "without a ref port, the Service port named ext-proc is used",
			poolOpts:    []poolOption{noRefPort},
			svcPorts:    []corev1.ServicePort{port("health", 9003), port("ext-proc", 7002), port("other", 7777)},
			wantExtProc: 7002,
			wantHealth:  &inference.HealthEndpoint{Port: 9003},
		},
		{
			name:        "without a ref port, the Service port named grpc is used",
			poolOpts:    []poolOption{noRefPort},
			svcPorts:    []corev1.ServicePort{port("grpc", 7003), port("other", 7777)},
			wantExtProc: 7003,
		},
		{
			name:        "without a ref port or a named port, the only port other than health and metrics is used",
			poolOpts:    []poolOption{noRefPort},
			svcPorts:    []corev1.ServicePort{port("", 9002), port("", 9003), port("", 9090)},
			wantExtProc: 9002,
			wantHealth:  &inference.HealthEndpoint{Port: 9003},
			wantMetrics: &inference.MetricsEndpoint{Port: 9090},
		},
		{
			name:        "a ref port numbered 0 counts as no port",
			poolOpts:    []poolOption{eppRef(poolv1.EndpointPickerRef{Name: testEPP, Port: &poolv1.Port{}})},
			svcPorts:    []corev1.ServicePort{port("only", 7004)},
			wantExtProc: 7004,
		},
		{
			name:     "without a ref port and with several unnamed candidates the port is unknown",
			poolOpts: []poolOption{noRefPort},
			svcPorts: []corev1.ServicePort{port("a", 7001), port("b", 7002)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ic := importedFrom(t,
				pool(testNamespace, testPool, tc.poolOpts...),
				service(testNamespace, testEPP, ports(tc.svcPorts...)),
				slice(testNamespace, testEPP, isReady),
			)
			epp := ic.EndpointPicker
			require.Len(t, epp.Service, 1)
			assert.Equal(t, tc.wantHealth, epp.Health)
			assert.Equal(t, tc.wantMetrics, epp.Metrics)
			ready := condition(t, ic.Conditions, v1alpha1.ConditionReady)
			if tc.wantExtProc == 0 {
				assert.Empty(t, epp.Service[0].Ports)
				assert.Equal(t, metav1.ConditionFalse, ready.Status)
				assert.Equal(t, v1alpha1.ReasonInvalidEndpointPickerRef, ready.Reason)
				assert.Contains(t, ready.Message, "example/epp")
				return
			}
			assert.Equal(t, []inference.Port{{Number: tc.wantExtProc}}, epp.Service[0].Ports)
			assert.Equal(t, metav1.ConditionTrue, ready.Status)
		})
	}
}

func TestEndpointPickerReadiness(t *testing.T) {
	tests := []struct {
		name        string
		objs        []runtime.Object
		wantReady   metav1.ConditionStatus
		wantReason  string
		wantMessage []string
	}{
		{
			name:       "a ready endpoint makes the cluster Ready",
			objs:       []runtime.Object{slice(testNamespace, testEPP, isNotReady, isReady)},
			wantReady:  metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
		},
		{
			name:       "an endpoint whose ready condition is unset counts as ready",
			objs:       []runtime.Object{slice(testNamespace, testEPP, readyUnset)},
			wantReady:  metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
		},
		{
			name:       "a ready endpoint in any of several slices makes the cluster Ready",
			objs:       []runtime.Object{slice(testNamespace, testEPP, isNotReady), slice(testNamespace, testEPP, isReady)},
			wantReady:  metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
		},
		{
			name:        "endpoints that are all not ready leave the cluster not Ready",
			objs:        []runtime.Object{slice(testNamespace, testEPP, isNotReady, isNotReady)},
			wantReady:   metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonNoReadyEndpoints,
			wantMessage: []string{"2 endpoint(s), none ready", "example/epp", "cluster-a"},
		},
		{
			name:        "a slice without endpoints leaves the cluster not Ready",
			objs:        []runtime.Object{slice(testNamespace, testEPP)},
			wantReady:   metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonNoReadyEndpoints,
			wantMessage: []string{"0 endpoint(s)"},
		},
		{
			name:        "no slices at all leaves the cluster not Ready",
			wantReady:   metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonNoReadyEndpoints,
			wantMessage: []string{"has no EndpointSlices", "example/epp", "cluster-a"},
		},
		{
			name: "ready slices of another Service or namespace do not count",
			objs: []runtime.Object{
				slice(testNamespace, "other", isReady),
				slice("elsewhere", testEPP, isReady),
			},
			wantReady:  metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonNoReadyEndpoints,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]runtime.Object{pool(testNamespace, testPool), service(testNamespace, testEPP)}, tc.objs...)
			c := condition(t, importedFrom(t, objs...).Conditions, v1alpha1.ConditionReady)
			assert.Equal(t, tc.wantReady, c.Status)
			assert.Equal(t, tc.wantReason, c.Reason)
			for _, s := range tc.wantMessage {
				assert.Contains(t, c.Message, s)
			}
		})
	}

	t.Run("an ExternalName Service is Ready without endpoints, and the message says why", func(t *testing.T) {
		c := condition(t, importedFrom(t, pool(testNamespace, testPool), service(testNamespace, testEPP, externalName("epp.example.com"))).Conditions, v1alpha1.ConditionReady)
		assert.Equal(t, metav1.ConditionTrue, c.Status)
		assert.Contains(t, c.Message, "ExternalName")
		assert.Contains(t, c.Message, "no endpoints to check")
	})
}

func TestEndpointPickerProblems(t *testing.T) {
	tests := []struct {
		name        string
		objs        []runtime.Object
		wantName    string
		wantReason  string
		wantMessage []string
	}{
		{
			name:        "a missing EPP Service is listed by name without a service and is not Ready",
			objs:        []runtime.Object{pool(testNamespace, testPool), slice(testNamespace, testEPP, isReady)},
			wantName:    testEPP,
			wantReason:  v1alpha1.ReasonEndpointPickerNotFound,
			wantMessage: []string{"Service example/epp", "cluster cluster-a", "does not exist"},
		},
		{
			name:        "an endpointPickerRef of another kind is not imported",
			objs:        []runtime.Object{pool(testNamespace, testPool, eppRef(poolv1.EndpointPickerRef{Kind: "Deployment", Name: testEPP})), service(testNamespace, testEPP)},
			wantName:    testEPP,
			wantReason:  v1alpha1.ReasonInvalidEndpointPickerRef,
			wantMessage: []string{`kind "Deployment"`, "only a core Service"},
		},
		{
			name:        "an endpointPickerRef in another group is not imported",
			objs:        []runtime.Object{pool(testNamespace, testPool, eppRef(poolv1.EndpointPickerRef{Group: ptr("example.com"), Kind: "Service", Name: testEPP})), service(testNamespace, testEPP)},
			wantName:    testEPP,
			wantReason:  v1alpha1.ReasonInvalidEndpointPickerRef,
			wantMessage: []string{`group "example.com"`},
		},
		{
			name:        "an endpointPickerRef without a name is not imported",
			objs:        []runtime.Object{pool(testNamespace, testPool, eppRef(poolv1.EndpointPickerRef{}))},
			wantReason:  v1alpha1.ReasonInvalidEndpointPickerRef,
			wantMessage: []string{"no spec.endpointPickerRef.name"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ic := importedFrom(t, tc.objs...)
			assert.Equal(t, tc.wantName, ic.EndpointPicker.Name)
			assert.Empty(t, ic.EndpointPicker.Service)
			c := condition(t, ic.Conditions, v1alpha1.ConditionReady)
			assert.Equal(t, metav1.ConditionFalse, c.Status)
			assert.Equal(t, tc.wantReason, c.Reason)
			for _, s := range tc.wantMessage {
				assert.Contains(t, c.Message, s)
			}
		})
	}

	t.Run("an explicit core group and Service kind are accepted", func(t *testing.T) {
		ic := importedFrom(t,
			pool(testNamespace, testPool, eppRef(poolv1.EndpointPickerRef{Group: ptr(""), Kind: "Service", Name: testEPP, Port: &poolv1.Port{Number: 9002}})),
			service(testNamespace, testEPP), slice(testNamespace, testEPP, isReady))
		assert.Equal(t, metav1.ConditionTrue, condition(t, ic.Conditions, v1alpha1.ConditionReady).Status)
	})
}
