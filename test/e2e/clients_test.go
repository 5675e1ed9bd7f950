package e2e

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/promtext"
)

// cluster bundles the clients of one member cluster.
type cluster struct {
	name    string
	kube    kubernetes.Interface
	mci     mciclient.Interface
	gateway gatewayclient.Interface
}

func clusterClients(t *testing.T, name string) *cluster {
	t.Helper()
	c, err := clusters.Cluster(name)
	require.NoError(t, err)
	return &cluster{
		name:    name,
		kube:    kubernetes.NewForConfigOrDie(c.Config),
		mci:     mciclient.NewForConfigOrDie(c.Config),
		gateway: gatewayclient.NewForConfigOrDie(c.Config),
	}
}

func (c *cluster) createNamespace(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	_, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_ = c.kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// exportedPool is an InferencePool exported in mode, whose EPP is the
// Service "epp".
func exportedPool(namespace, name string, mode v1alpha1.RoutingMode) *poolv1.InferencePool {
	return &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Labels: map[string]string{"team": "llm"},
			Annotations: map[string]string{
				v1alpha1.ExportAnnotation:     v1alpha1.ExportScopeClusterSet,
				v1alpha1.ExportModeAnnotation: string(mode),
			},
		},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
}

// createEPPService creates a LoadBalancer EPP Service with an ingress IP,
// as a cloud controller would set it.
func (c *cluster) createEPPService(t *testing.T, ctx context.Context, namespace, ip string) {
	t.Helper()
	svc, err := c.kube.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "epp", Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": "epp"},
			Ports: []corev1.ServicePort{
				{Name: "ext-proc", Port: 9002},
				{Name: "grpc-health", Port: 9003},
				{Name: "http-metrics", Port: 9090},
			},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
	_, err = c.kube.CoreV1().Services(namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// setEPPEndpoint writes the EndpointSlice of the EPP Service with one
// endpoint of the given readiness, as the EndpointSlice controller would.
// The address is from a documentation range: nothing is sent to it.
func (c *cluster) setEPPEndpoint(t *testing.T, ctx context.Context, namespace string, ready bool) {
	t.Helper()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "epp-1", Namespace: namespace, Labels: map[string]string{discoveryv1.LabelServiceName: "epp"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("ext-proc"), Port: ptr.To[int32](9002)}},
	}
	api := c.kube.DiscoveryV1().EndpointSlices(namespace)
	existing, err := api.Get(ctx, slice.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, slice, metav1.CreateOptions{})
		require.NoError(t, err)
		return
	}
	require.NoError(t, err)
	existing.Endpoints = slice.Endpoints
	_, err = api.Update(ctx, existing, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// createProgrammedGateway creates a Gateway with an address and a
// Programmed condition, as a gateway controller would report them.
func (c *cluster) createProgrammedGateway(t *testing.T, ctx context.Context, namespace, name, address string) {
	t.Helper()
	gw, err := c.gateway.GatewayV1().Gateways(namespace).Create(ctx, &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: gatewayv1.GatewaySpec{
			GatewayClassName: "inference",
			Listeners:        []gatewayv1.Listener{{Name: "http", Protocol: gatewayv1.HTTPProtocolType, Port: 80}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	gw.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: ptr.To(gatewayv1.IPAddressType), Value: address}}
	gw.Status.Conditions = []metav1.Condition{{
		Type: string(gatewayv1.GatewayConditionProgrammed), Status: metav1.ConditionTrue, Reason: "Programmed",
		LastTransitionTime: metav1.Now(), ObservedGeneration: gw.Generation,
	}}
	_, err = c.gateway.GatewayV1().Gateways(namespace).UpdateStatus(ctx, gw, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// editPool changes the pool as its owner does: read, change, write with
// the resourceVersion read, retry on a conflict. The member's export status
// controller writes the pool's status between a test's read and its
// write, so a plain read and update fails now and then.
func (c *cluster) editPool(t *testing.T, ctx context.Context, namespace, name string, change func(*poolv1.InferencePool)) {
	t.Helper()
	api := c.mci.InferencePoolV1().InferencePools(namespace)
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pool, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pool.Annotations == nil {
			pool.Annotations = map[string]string{}
		}
		change(pool)
		_, err = api.Update(ctx, pool, metav1.UpdateOptions{})
		return err
	}), "editing InferencePool %s/%s", namespace, name)
}

// setGatewayParents sets the pool's status.parents entries of controller
// to parents, as a gateway controller does: read, modify only its own
// entries, write with the resourceVersion read, retry on a conflict. Other
// controllers write the same atomic list (mci writes its Exported entry
// there), so a blind replace could lose their entries or fail.
func (c *cluster) setGatewayParents(t *testing.T, ctx context.Context, namespace, name, controller string, parents ...poolv1.ParentReference) {
	t.Helper()
	api := c.mci.InferencePoolV1().InferencePools(namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pool, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pool.Status.Parents = slices.DeleteFunc(pool.Status.Parents, func(p poolv1.ParentStatus) bool { return p.ControllerName == controller })
		for _, ref := range parents {
			pool.Status.Parents = append(pool.Status.Parents, poolv1.ParentStatus{ParentRef: ref, ControllerName: controller})
		}
		_, err = api.UpdateStatus(ctx, pool, metav1.UpdateOptions{})
		return err
	})
	require.NoError(t, err)
}

// importOf returns the import namespace/name in c, nil when none is served.
func (c *cluster) importOf(ctx context.Context, namespace, name string) (*v1alpha1.InferencePoolImport, error) {
	imp, err := c.mci.InferenceV1alpha1().InferencePoolImports(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return imp, err
}

func conditionStatus(conds []metav1.Condition, t string) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// seriesValue finds series (name{label="value",...}) in a Prometheus text
// exposition; 0 when absent.
func seriesValue(t *testing.T, body []byte, series string) float64 {
	t.Helper()
	m, err := promtext.Parse(body)
	require.NoError(t, err)
	v, _, err := m.Lookup(series)
	require.NoError(t, err)
	return v
}
