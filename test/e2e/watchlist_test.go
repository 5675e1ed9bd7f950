package e2e

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/test/waitfor"
)

// The streaming list client-go informers use by default: initial ADDED
// events, then a bookmark annotated k8s.io/initial-events-end.
func TestAStreamingListEndsWithTheInitialEventsBookmark(t *testing.T) {
	ctx := context.Background()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-watchlist"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	for _, name := range []string{"one", "two"} {
		_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
		require.NoError(t, err)
	}
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		l, err := b.mci.InferenceV1alpha1().InferencePoolImports(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 2, "waiting for two imports"
	})

	w, err := b.mci.InferenceV1alpha1().InferencePoolImports(ns).Watch(ctx, metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	require.NoError(t, err)
	defer w.Stop()
	var added []string
	for {
		select {
		case ev := <-w.ResultChan():
			imp := ev.Object.(*v1alpha1.InferencePoolImport)
			if ev.Type == watch.Added {
				added = append(added, imp.Name)
				continue
			}
			require.Equal(t, watch.Bookmark, ev.Type)
			assert.Equal(t, "true", imp.Annotations[metav1.InitialEventsAnnotationKey])
			assert.NotEmpty(t, imp.ResourceVersion)
			assert.ElementsMatch(t, []string{"one", "two"}, added)
			return
		case <-time.After(convergence):
			t.Fatalf("no initial-events-end bookmark; got %v", added)
		}
	}
}

func TestSelectorsNarrowListsAndWatches(t *testing.T) {
	ctx := context.Background()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-selectors"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	p := exportedPool(ns, "blue", v1alpha1.RoutingModeEndpoint)
	p.Labels = map[string]string{"color": "blue"}
	_, err := a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, p, metav1.CreateOptions{})
	require.NoError(t, err)
	p = exportedPool(ns, "green", v1alpha1.RoutingModeEndpoint)
	p.Labels = map[string]string{"color": "green"}
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, p, metav1.CreateOptions{})
	require.NoError(t, err)
	imports := b.mci.InferenceV1alpha1().InferencePoolImports(ns)
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		l, err := imports.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 2, "waiting for two imports"
	})

	tests := []struct {
		name string
		opts metav1.ListOptions
		want []string
	}{
		{"a label selector matches labels copied from the exporting pool", metav1.ListOptions{LabelSelector: "color=blue"}, []string{"blue"}},
		{"a set-based label selector", metav1.ListOptions{LabelSelector: "color notin (blue)"}, []string{"green"}},
		{"a field selector on the name", metav1.ListOptions{FieldSelector: "metadata.name=green"}, []string{"green"}},
		{"a field selector on the namespace", metav1.ListOptions{FieldSelector: "metadata.namespace=" + ns}, []string{"blue", "green"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := imports.List(ctx, tc.opts)
			require.NoError(t, err)
			var names []string
			for _, i := range l.Items {
				names = append(names, i.Name)
			}
			assert.Equal(t, tc.want, names)
		})
	}
	t.Run("an unsupported field selector is a clear bad request", func(t *testing.T) {
		_, err := imports.List(ctx, metav1.ListOptions{FieldSelector: "status.clusters=x"})
		require.True(t, apierrors.IsBadRequest(err), "%v", err)
		assert.Contains(t, err.Error(), `"metadata.name"`, "the error names the supported fields")
	})
}

func TestKubectlWatchShowsAnImportAppear(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*convergence)
	defer cancel()
	a, b := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b")
	const ns = "e2e-kubectl-watch"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	kb, err := clusters.Cluster("cluster-b")
	require.NoError(t, err)
	// -v=6 logs each request once its response headers are in: for the
	// watch, once the server has it open.
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", kb.Kubeconfig, "get", "ipimp", "-n", ns, "-w", "--no-headers", "-v=6")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	logs, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { cancel(); _ = cmd.Wait() }()

	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	watching := make(chan struct{})
	go func() {
		opened := watching
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			if l := sc.Text(); opened != nil && strings.Contains(l, "watch=true") && strings.Contains(l, "200 OK") {
				close(opened)
				opened = nil
			}
		}
	}()
	// The change comes after kubectl's watch is open, so what kubectl shows
	// is a watch event, not its first list.
	select {
	case <-watching:
	case <-ctx.Done():
		t.Fatal("kubectl never opened its watch")
	}
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, "watched", v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "kubectl -w ended")
			if strings.HasPrefix(line, "watched ") {
				assert.Contains(t, line, "cluster-a")
				return
			}
		case <-ctx.Done():
			t.Fatal("kubectl get -w never showed the import")
		}
	}
}
