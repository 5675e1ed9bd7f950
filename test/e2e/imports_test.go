package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/test/waitfor"
)

const convergence = 20 * time.Second

func TestEndpointModeImportFollowsTheExportingCluster(t *testing.T) {
	ctx := context.Background()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-endpoint"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	a.createEPPService(t, ctx, ns, "127.0.0.5")
	a.setEPPEndpoint(t, ctx, ns, true)
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)

	var imp *v1alpha1.InferencePoolImport
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		imp, err = b.importOf(ctx, ns, "llm")
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import not served yet (err=%v)", err)
		}
		return conditionStatus(imp.Status.Conditions, "Ready") == metav1.ConditionTrue, fmt.Sprintf("%+v", imp.Status)
	})
	require.Len(t, imp.Status.Clusters, 1)
	got := imp.Status.Clusters[0]
	assert.Equal(t, "cluster-a", got.Name)
	assert.Equal(t, v1alpha1.RoutingModeEndpoint, got.RoutingMode)
	assert.Equal(t, int32(8000), got.TargetPortNumber)
	assert.Equal(t, "epp", got.EndpointPicker.Name)
	require.Len(t, got.EndpointPicker.Service, 1)
	assert.Equal(t, "LoadBalancer", string(got.EndpointPicker.Service[0].Type))
	assert.Equal(t, []string{"127.0.0.5"}, got.EndpointPicker.Service[0].Addresses)
	assert.Equal(t, []v1alpha1.Port{{Number: 9002}}, got.EndpointPicker.Service[0].Ports)
	require.NotNil(t, got.EndpointPicker.Health)
	assert.Equal(t, int32(9003), got.EndpointPicker.Health.Port)
	require.NotNil(t, got.EndpointPicker.Metrics)
	assert.Equal(t, int32(9090), got.EndpointPicker.Metrics.Port)
	assert.Equal(t, metav1.ConditionTrue, conditionStatus(imp.Status.Conditions, "Accepted"))
	require.Len(t, imp.Status.Controllers, 1, "the upstream status.controllers[] shape is served too")
	assert.Equal(t, v1alpha1.ControllerName, imp.Status.Controllers[0].Name)
	assert.Equal(t, []v1alpha1.ExportingCluster{{Name: "cluster-a"}}, imp.Status.Controllers[0].ExportingClusters)
	assert.Equal(t, "llm", imp.Labels["team"], "labels are copied from the exporting pool")
	assert.NotEmpty(t, imp.UID)
	assert.NotEmpty(t, imp.ResourceVersion)

	t.Run("the exporting cluster does not import its own pool", func(t *testing.T) {
		own, err := a.importOf(ctx, ns, "llm")
		require.NoError(t, err)
		assert.Nil(t, own)
	})

	t.Run("a cluster without the namespace imports nothing until the namespace exists", func(t *testing.T) {
		none, err := c.importOf(ctx, ns, "llm")
		require.NoError(t, err)
		assert.Nil(t, none)
		c.createNamespace(t, ctx, ns)
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := c.importOf(ctx, ns, "llm")
			return err == nil && imp != nil, fmt.Sprintf("err=%v", err)
		})
		again, err := c.importOf(ctx, ns, "llm")
		require.NoError(t, err)
		assert.Equal(t, imp.UID, again.UID, "every cluster derives the same uid for the same import")
	})

	t.Run("an EPP endpoint that stops being ready makes the cluster not ready", func(t *testing.T) {
		a.setEPPEndpoint(t, ctx, ns, false)
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, "llm")
			if err != nil || imp == nil || len(imp.Status.Clusters) != 1 {
				return false, fmt.Sprintf("err=%v imp=%v", err, imp)
			}
			for _, cond := range imp.Status.Clusters[0].Conditions {
				if cond.Type == "Ready" {
					return cond.Status == metav1.ConditionFalse && cond.Reason == v1alpha1.ReasonNoReadyEndpoints, cond.Reason
				}
			}
			return false, "no Ready condition"
		})
	})

	t.Run("withdrawing the export removes the import", func(t *testing.T) {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null}}}`, v1alpha1.ExportAnnotation, v1alpha1.ExportModeAnnotation)
		_, err := a.mci.InferencePoolV1().InferencePools(ns).Patch(ctx, "llm", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, "llm")
			return err == nil && imp == nil, fmt.Sprintf("err=%v imp=%v", err, imp != nil)
		})
	})
}

func TestParentModeImportCarriesTheRemoteGateway(t *testing.T) {
	ctx := context.Background()
	b, c := clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-parent"
	b.createNamespace(t, ctx, ns)
	c.createNamespace(t, ctx, ns)
	c.createProgrammedGateway(t, ctx, ns, "inf-gw", "127.0.0.6")
	_, err := c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeParent), metav1.CreateOptions{})
	require.NoError(t, err)
	c.setGatewayParents(t, ctx, ns, "llm", "example.com/gateway", poolv1.ParentReference{Name: "inf-gw"})

	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		imp, err := b.importOf(ctx, ns, "llm")
		if err != nil || imp == nil || len(imp.Status.Clusters) != 1 || len(imp.Status.Clusters[0].Parents) != 1 {
			return false, fmt.Sprintf("err=%v imp=%+v", err, imp)
		}
		cl := imp.Status.Clusters[0]
		p := cl.Parents[0]
		ok := cl.Name == "cluster-c" && cl.RoutingMode == v1alpha1.RoutingModeParent &&
			p.Name == "inf-gw" && p.Namespace == ns && len(p.Service) == 1 &&
			strings.Join(p.Service[0].Addresses, ",") == "127.0.0.6" &&
			len(p.Service[0].Ports) == 1 && p.Service[0].Ports[0].Number == 80 &&
			conditionStatus(cl.Conditions, "Ready") == metav1.ConditionTrue
		return ok, fmt.Sprintf("%+v", cl)
	})
}

func TestSeveralExportersAreMergedAndEachClusterSeesTheOthers(t *testing.T) {
	ctx := context.Background()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns = "e2e-merge"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	a.createEPPService(t, ctx, ns, "127.0.0.7")
	a.setEPPEndpoint(t, ctx, ns, true)
	_, err := c.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "shared", v1alpha1.RoutingModeParent), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "shared", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)

	clusterNames := func(imp *v1alpha1.InferencePoolImport) string {
		var names []string
		for _, c := range imp.Status.Clusters {
			names = append(names, c.Name)
		}
		return strings.Join(names, ",")
	}
	for _, tc := range []struct {
		in   *cluster
		want string
	}{
		{b, "cluster-a,cluster-c"},
		{a, "cluster-c"},
		{c, "cluster-a"},
	} {
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := tc.in.importOf(ctx, ns, "shared")
			if err != nil || imp == nil {
				return false, fmt.Sprintf("%s: err=%v", tc.in.name, err)
			}
			return clusterNames(imp) == tc.want, tc.in.name + " sees " + clusterNames(imp)
		})
	}
	imp, err := b.importOf(ctx, ns, "shared")
	require.NoError(t, err)
	assert.Equal(t, metav1.ConditionTrue, conditionStatus(imp.Status.Conditions, "Ready"), "ready because cluster-a is, though cluster-c has no parent")
}

func TestInferencePoolExportSaysWhereThePoolIsImported(t *testing.T) {
	ctx := context.Background()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-export"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "good", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	bad := exportedPool(ns, "bad", "Sideways")
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, bad, metav1.CreateOptions{})
	require.NoError(t, err)

	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, "good", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		byName := map[string]v1alpha1.ExportTargetCluster{}
		for _, c := range exp.Status.Clusters {
			byName[c.Name] = c
		}
		ok := conditionStatus(exp.Status.Conditions, "Valid") == metav1.ConditionTrue &&
			byName["cluster-b"].Imported && !byName["cluster-c"].Imported &&
			byName["cluster-c"].Reason == v1alpha1.ReasonNamespaceNotFound
		return ok, fmt.Sprintf("%+v", exp.Status)
	})
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, "bad", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range exp.Status.Conditions {
			if c.Type == "Valid" {
				return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonInvalidExport && strings.Contains(c.Message, "Sideways"), c.Message
			}
		}
		return false, "no Valid condition"
	})
	// The importer lists the cluster, not Ready, with the exporter's
	// reason: its users see why a cluster they expected is not routable.
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		imp, err := b.importOf(ctx, ns, "bad")
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import: %v, %v", imp, err)
		}
		if len(imp.Status.Clusters) != 1 || imp.Status.Clusters[0].Name != "cluster-a" {
			return false, fmt.Sprintf("clusters %+v", imp.Status.Clusters)
		}
		c := meta.FindStatusCondition(imp.Status.Clusters[0].Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonInvalidExport && strings.Contains(c.Message, "Sideways"), fmt.Sprintf("%+v", c)
	})
}
