package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

// With --member-summaries=auto, and every member running mci-apiserver,
// each server reads the others through the summaries they publish
// (summary mode), with an identity that may read those summaries only
// (SummaryReaderOnly): a server that still watched a member's
// InferencePools, Services, EndpointSlices, Gateways or Namespaces would be
// refused and never list it. An export, a readiness flap and the
// namespaces of the importers reach the other clusters all the same.
func TestMembersAreReadThroughTheirSummaries(t *testing.T) {
	cs := startClusterSet(t, "mci-e2e-summaries-", localclusterset.Options{
		Clusters:          []string{"cluster-a", "cluster-b", "cluster-c"},
		MemberSummaries:   "auto",
		SummaryReaderOnly: true,
	})
	exportReachesTheOtherMembers(t, cs, true)
}

// With --member-summaries=never, every server watches the other members'
// objects (full mode, as it does a member without mci-apiserver), and
// serves the same.
func TestMembersAreReadThroughTheirObjectsInFullMode(t *testing.T) {
	cs := startClusterSet(t, "mci-e2e-fullmode-", localclusterset.Options{
		Clusters:        []string{"cluster-a", "cluster-b", "cluster-c"},
		MemberSummaries: "never",
	})
	exportReachesTheOtherMembers(t, cs, false)
}

// exportReachesTheOtherMembers exports a pool from cluster-a, imported
// where the namespace is (cluster-b, later cluster-c), and follows it
// through a readiness flap; summaries says in which mode the servers read
// each other.
func exportReachesTheOtherMembers(t *testing.T, cs *localclusterset.ClusterSet, summaries bool) {
	ctx := context.Background()
	a, b, c := clientsIn(t, cs, "cluster-a"), clientsIn(t, cs, "cluster-b"), clientsIn(t, cs, "cluster-c")
	const ns = "e2e-summaries"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	// cluster-c's namespace comes later, in a step; created with this t,
	// it lasts until the test ends (createNamespace deletes it then).
	cNamespace := func() { c.createNamespace(t, ctx, ns) }
	a.createEPPService(t, ctx, ns, "127.0.0.5")
	a.setEPPEndpoint(t, ctx, ns, true)
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "llm", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)

	t.Run("every server reads every other member in the mode asked for", func(t *testing.T) {
		for _, cluster := range []string{"cluster-a", "cluster-b", "cluster-c"} {
			metrics := replicaMetrics(t, cs, cluster)[0]
			for _, other := range []string{"cluster-a", "cluster-b", "cluster-c"} {
				want := 1.0
				if other == cluster || !summaries {
					want = 0 // its own objects are what it summarizes
				}
				series := fmt.Sprintf(`mci_clusterset_member_summary_mode{member=%q}`, other)
				require.Equal(t, want, metrics(t, ctx, series), "%s: %s", cluster, series)
			}
		}
	})

	t.Run("cluster-a publishes the summary of its export", func(t *testing.T) {
		s, err := a.mci.InferenceV1alpha1().InferencePoolExportSummaries(ns).Get(ctx, "llm", metav1.GetOptions{})
		require.NoError(t, err)
		require.Equal(t, v1alpha1.RoutingModeEndpoint, s.Status.RoutingMode)
		require.NotNil(t, s.Status.EndpointPicker)
		require.Equal(t, metav1.ConditionTrue, conditionStatus(s.Status.Conditions, v1alpha1.ConditionReady))
		cs, err := b.mci.InferenceV1alpha1().InferenceClusterSummaries().Get(ctx, "cluster-b", metav1.GetOptions{})
		require.NoError(t, err)
		require.Contains(t, cs.Status.Namespaces, ns)
	})

	t.Run("cluster-b imports it from the summary, cluster-c lacks the namespace", func(t *testing.T) {
		b.waitImport(t, ctx, ns, "llm", true)
		imp, err := b.importOf(ctx, ns, "llm")
		require.NoError(t, err)
		require.Len(t, imp.Status.Clusters, 1)
		require.Equal(t, "cluster-a", imp.Status.Clusters[0].Name)
		require.Equal(t, []v1alpha1.ServiceImport{{Type: "LoadBalancer", Addresses: []string{"127.0.0.5"}, Ports: []v1alpha1.Port{{Number: 9002}}}}, imp.Status.Clusters[0].EndpointPicker.Service)
		c.waitImport(t, ctx, ns, "llm", false)
	})

	t.Run("the export reports cluster-b's namespace, read from its cluster summary", func(t *testing.T) {
		waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
			exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, "llm", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			imported := map[string]bool{}
			for _, tc := range exp.Status.Clusters {
				imported[tc.Name] = tc.Imported
			}
			return imported["cluster-b"] && !imported["cluster-c"], fmt.Sprintf("export clusters: %+v", exp.Status.Clusters)
		})
	})

	t.Run("a namespace created in cluster-c reaches the export and makes the import there", func(t *testing.T) {
		cNamespace()
		c.waitImport(t, ctx, ns, "llm", true)
		waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
			exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, "llm", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, tc := range exp.Status.Clusters {
				if tc.Name == "cluster-c" {
					return tc.Imported, fmt.Sprintf("cluster-c: %+v", tc)
				}
			}
			return false, "cluster-c not listed"
		})
	})

	flap := func(t *testing.T) {
		a.setEPPEndpoint(t, ctx, ns, false)
		for _, cl := range []*cluster{b, c} {
			waitImportReady(t, ctx, cl, ns, "llm", metav1.ConditionFalse)
		}
		a.setEPPEndpoint(t, ctx, ns, true)
		for _, cl := range []*cluster{b, c} {
			waitImportReady(t, ctx, cl, ns, "llm", metav1.ConditionTrue)
		}
	}
	t.Run("a readiness flap reaches the importers", flap)

	// The importers' summary watches of cluster-a break with its server;
	// they keep serving what they had, then resume (or relist) once it is
	// back, and follow the next flap.
	t.Run("the importers resume after the exporter's mci-apiserver restarts", func(t *testing.T) {
		require.NoError(t, cs.StopMCIAPIServer("cluster-a"))
		for _, cl := range []*cluster{b, c} {
			imp, err := cl.importOf(ctx, ns, "llm")
			require.NoError(t, err)
			require.NotNil(t, imp, "%s keeps the import while cluster-a's server is down", cl.name)
		}
		require.NoError(t, cs.StartMCIAPIServer(ctx, "cluster-a"))
		flap(t)
	})
}

// waitImportReady waits until the import's Ready condition has status.
func waitImportReady(t *testing.T, ctx context.Context, c *cluster, namespace, name string, status metav1.ConditionStatus) {
	t.Helper()
	waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
		imp, err := c.importOf(ctx, namespace, name)
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import %s/%s in %s: %v (served: %v)", namespace, name, c.name, err, imp != nil)
		}
		got := conditionStatus(imp.Status.Conditions, v1alpha1.ConditionReady)
		return got == status, fmt.Sprintf("Ready is %q", got)
	})
}
