package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
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
		// The pool was created a moment ago: its summary is computed
		// from cluster-a's watch of it, not at once.
		var s *v1alpha1.InferencePoolExportSummary
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			var err error
			s, err = a.mci.InferenceV1alpha1().InferencePoolExportSummaries(ns).Get(ctx, "llm", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return conditionStatus(s.Status.Conditions, v1alpha1.ConditionReady) == metav1.ConditionTrue, fmt.Sprintf("conditions %v", s.Status.Conditions)
		})
		require.Equal(t, v1alpha1.RoutingModeEndpoint, s.Status.RoutingMode)
		require.NotNil(t, s.Status.EndpointPicker)
		require.Equal(t, metav1.ConditionTrue, conditionStatus(s.Status.Conditions, v1alpha1.ConditionReady))
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			cs, err := b.mci.InferenceV1alpha1().InferenceClusterSummaries().Get(ctx, "cluster-b", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return slices.Contains(cs.Status.Namespaces, ns), fmt.Sprintf("namespaces %v", cs.Status.Namespaces)
		})
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

// A pool exported to cluster-b only (mci.x-k8s.io/export-to) is imported
// there and nowhere else, and in summary mode cluster-a's server does not
// send its summary to cluster-c at all: read with the identity cluster-c's
// server reads cluster-a with, the summary is absent from a LIST, a GET
// and a WATCH; with cluster-b's it is there. A scope moved to cluster-c
// reaches both streams as a DELETED and an ADDED event.
func TestAScopedExportIsNotSentOutsideItsScope(t *testing.T) {
	cs := startClusterSet(t, "mci-e2e-scope-", localclusterset.Options{
		Clusters:          []string{"cluster-a", "cluster-b", "cluster-c"},
		MemberSummaries:   "auto",
		SummaryReaderOnly: true,
		ReaderIdentities:  true,
	})
	ctx := context.Background()
	a, b, c := clientsIn(t, cs, "cluster-a"), clientsIn(t, cs, "cluster-b"), clientsIn(t, cs, "cluster-c")
	const ns = "e2e-scope"
	for _, cl := range []*cluster{a, b, c} {
		cl.createNamespace(t, ctx, ns)
	}
	a.createEPPService(t, ctx, ns, "127.0.0.5")
	a.setEPPEndpoint(t, ctx, ns, true)
	p := exportedPool(ns, "llm", v1alpha1.RoutingModeEndpoint)
	p.Annotations[v1alpha1.ExportToAnnotation] = `{"clusters": ["cluster-b"]}`
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, p, metav1.CreateOptions{})
	require.NoError(t, err)

	// What each importer's server reads cluster-a with.
	readerOf := func(importer string) mciclient.Interface {
		cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(cs.MemberKubeconfigDir(importer), "cluster-a.kubeconfig"))
		require.NoError(t, err)
		return mciclient.NewForConfigOrDie(cfg)
	}
	fromB, fromC := readerOf("cluster-b"), readerOf("cluster-c")
	names := func(t *testing.T, r mciclient.Interface) []string {
		l, err := r.InferenceV1alpha1().InferencePoolExportSummaries(ns).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		var out []string
		for _, s := range l.Items {
			out = append(out, s.Name)
		}
		return out
	}

	t.Run("cluster-b imports the pool, cluster-c does not", func(t *testing.T) {
		b.waitImport(t, ctx, ns, "llm", true)
		c.waitImport(t, ctx, ns, "llm", false)
	})

	t.Run("the summary stream sends the export to cluster-b only", func(t *testing.T) {
		require.Equal(t, []string{"llm"}, names(t, fromB))
		require.Empty(t, names(t, fromC))
		_, err := fromC.InferenceV1alpha1().InferencePoolExportSummaries(ns).Get(ctx, "llm", metav1.GetOptions{})
		require.True(t, apierrors.IsNotFound(err), "GET as cluster-c: %v", err)
	})

	t.Run("cluster-a's InferencePoolExport lists cluster-c as outside the scope", func(t *testing.T) {
		waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
			exp, err := a.mci.InferenceV1alpha1().InferencePoolExports(ns).Get(ctx, "llm", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			reasons := map[string]string{}
			for _, tc := range exp.Status.Clusters {
				reasons[tc.Name] = tc.Reason
			}
			return reasons["cluster-b"] == v1alpha1.ReasonImported && reasons["cluster-c"] == v1alpha1.ReasonOutsideExportScope,
				fmt.Sprintf("export clusters: %+v", exp.Status.Clusters)
		})
	})

	t.Run("a scope moved to cluster-c is DELETED for cluster-b and ADDED for cluster-c", func(t *testing.T) {
		watchAs := func(r mciclient.Interface) watch.Interface {
			l, err := r.InferenceV1alpha1().InferencePoolExportSummaries(ns).List(ctx, metav1.ListOptions{})
			require.NoError(t, err)
			w, err := r.InferenceV1alpha1().InferencePoolExportSummaries(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
			require.NoError(t, err)
			t.Cleanup(w.Stop)
			return w
		}
		wb, wc := watchAs(fromB), watchAs(fromC)
		a.editPool(t, ctx, ns, "llm", func(p *poolv1.InferencePool) {
			p.Annotations[v1alpha1.ExportToAnnotation] = `{"clusters": ["cluster-c"]}`
		})
		next := func(w watch.Interface) watch.EventType {
			select {
			case ev := <-w.ResultChan():
				return ev.Type
			case <-time.After(30 * time.Second):
				return "none within 30s"
			}
		}
		require.Equal(t, watch.Deleted, next(wb), "cluster-b's stream")
		require.Equal(t, watch.Added, next(wc), "cluster-c's stream")
		c.waitImport(t, ctx, ns, "llm", true)
		b.waitImport(t, ctx, ns, "llm", false)
	})
}
