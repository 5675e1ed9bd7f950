package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/test/waitfor"
)

// An import follows the exporting cluster's EPP Service and parent Gateway
// as they change, not only the pool.
func TestAnImportFollowsChangesToTheEPPServiceAndTheParentGateway(t *testing.T) {
	ctx := context.Background()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-changes"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	a.createEPPService(t, ctx, ns, "127.0.0.11")
	a.setEPPEndpoint(t, ctx, ns, true)
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	c.createProgrammedGateway(t, ctx, ns, "inf-gw", "127.0.0.12")
	_, err = c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeParent), metav1.CreateOptions{})
	require.NoError(t, err)
	c.setGatewayParents(t, ctx, ns, "llm", "", poolv1.ParentReference{Name: "inf-gw"})

	// addresses renders what cluster-b's import says of each cluster.
	addresses := func(imp *v1alpha1.InferencePoolImport) string {
		var parts []string
		for _, cl := range imp.Status.Clusters {
			var addrs []string
			for _, s := range cl.EndpointPicker.Service {
				addrs = append(addrs, s.Addresses...)
			}
			for _, p := range cl.Parents {
				for _, s := range p.Service {
					addrs = append(addrs, s.Addresses...)
				}
			}
			parts = append(parts, fmt.Sprintf("%s=%s/%s", cl.Name, strings.Join(addrs, "+"), conditionStatus(cl.Conditions, "Ready")))
		}
		return strings.Join(parts, " ")
	}
	waitFor := func(want string) {
		t.Helper()
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, "llm")
			if err != nil || imp == nil {
				return false, fmt.Sprintf("err=%v", err)
			}
			return addresses(imp) == want, addresses(imp)
		})
	}
	waitFor("cluster-a=127.0.0.11/True cluster-c=127.0.0.12/True")

	t.Run("a new LoadBalancer address of the EPP Service", func(t *testing.T) {
		svc, err := a.kube.CoreV1().Services(ns).Get(ctx, "epp", metav1.GetOptions{})
		require.NoError(t, err)
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "127.0.0.13"}}
		_, err = a.kube.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
		require.NoError(t, err)
		waitFor("cluster-a=127.0.0.13/True cluster-c=127.0.0.12/True")
	})
	t.Run("the EPP Service is deleted", func(t *testing.T) {
		require.NoError(t, a.kube.CoreV1().Services(ns).Delete(ctx, "epp", metav1.DeleteOptions{}))
		waitFor("cluster-a=/False cluster-c=127.0.0.12/True")
	})
	t.Run("the parent Gateway stops being Programmed", func(t *testing.T) {
		gw, err := c.gateway.GatewayV1().Gateways(ns).Get(ctx, "inf-gw", metav1.GetOptions{})
		require.NoError(t, err)
		gw.Status.Conditions[0].Status = metav1.ConditionFalse
		gw.Status.Conditions[0].Reason = string(gatewayv1.GatewayReasonInvalid)
		_, err = c.gateway.GatewayV1().Gateways(ns).UpdateStatus(ctx, gw, metav1.UpdateOptions{})
		require.NoError(t, err)
		waitFor("cluster-a=/False cluster-c=127.0.0.12/False")
	})
}
