package bench

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"k8s.io/client-go/kubernetes"
)

func clients(b *testing.B, name string) (kubernetes.Interface, mciclient.Interface) {
	b.Helper()
	c, err := clusters.Cluster(name)
	require.NoError(b, err)
	cfg := *c.Config
	cfg.QPS, cfg.Burst = 500, 1000
	return kubernetes.NewForConfigOrDie(&cfg), mciclient.NewForConfigOrDie(&cfg)
}

func ensureNamespace(b *testing.B, kube kubernetes.Interface, ns string) {
	b.Helper()
	_, _ = kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
}

func pool(ns, name string, exported bool) *poolv1.InferencePool {
	p := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: name + "-epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
	if exported {
		p.Annotations = map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
	}
	return p
}

// exportPatch sets or removes the export annotation.
func exportPatch(on bool) []byte {
	if on {
		return []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.ExportAnnotation, v1alpha1.ExportScopeClusterSet))
	}
	return []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, v1alpha1.ExportAnnotation))
}

// timeToEvent applies write and returns how long until w delivers an event
// that want accepts.
func timeToEvent(b *testing.B, w watch.Interface, write func() error, want func(watch.Event) bool) time.Duration {
	b.Helper()
	start := time.Now()
	require.NoError(b, write())
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			require.True(b, ok, "watch closed")
			require.NotEqual(b, watch.Error, ev.Type, "watch error: %+v", ev.Object)
			if want(ev) {
				return time.Since(start)
			}
		case <-timeout:
			b.Fatal("no event within 30s")
		}
	}
}

// BenchmarkConvergence: from an export annotation change in cluster-a to
// the watch event seen by a client of cluster-b's kube-apiserver, against
// the single-hop floor: a write to cluster-a and a watch on cluster-a's
// own kube-apiserver. The two alternate, sample by sample.
func BenchmarkConvergence(b *testing.B) {
	ctx := context.Background()
	kubeA, mciA := clients(b, "cluster-a")
	kubeB, mciB := clients(b, "cluster-b")
	const ns = "bench-convergence"
	ensureNamespace(b, kubeA, ns)
	ensureNamespace(b, kubeB, ns)
	pools := mciA.InferencePoolV1().InferencePools(ns)
	_, err := pools.Create(ctx, pool(ns, "mci", false), metav1.CreateOptions{})
	require.NoError(b, err)
	_, err = pools.Create(ctx, pool(ns, "floor", false), metav1.CreateOptions{})
	require.NoError(b, err)

	imports, err := mciB.InferenceV1alpha1().InferencePoolImports(ns).Watch(ctx, metav1.ListOptions{})
	require.NoError(b, err)
	defer imports.Stop()
	floorWatch, err := pools.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=floor"})
	require.NoError(b, err)
	defer floorWatch.Stop()
	// Drain the floor watch's initial ADDED.
	timeToEvent(b, floorWatch, func() error { return nil }, func(watch.Event) bool { return true })

	var viaMCI, floor []time.Duration
	samples := b.N
	if samples < 20 {
		samples = 200
	}
	b.ResetTimer()
	for i := 0; i < samples; i++ {
		on := i%2 == 0
		viaMCI = append(viaMCI, timeToEvent(b, imports, func() error {
			_, err := pools.Patch(ctx, "mci", types.MergePatchType, exportPatch(on), metav1.PatchOptions{})
			return err
		}, func(ev watch.Event) bool {
			if on {
				return ev.Type == watch.Added
			}
			return ev.Type == watch.Deleted
		}))
		floor = append(floor, timeToEvent(b, floorWatch, func() error {
			_, err := pools.Patch(ctx, "floor", types.MergePatchType, exportPatch(on), metav1.PatchOptions{})
			return err
		}, func(ev watch.Event) bool { return ev.Type == watch.Modified }))
	}
	b.StopTimer()
	report(b, "mci", viaMCI)
	report(b, "floor", floor)
	b.ReportMetric(percentile(viaMCI, 99).Seconds()/percentile(floor, 99).Seconds(), "p99-ratio-to-floor")
	b.Logf("convergence over %d samples: mci p50 %s p99 %s; single-hop floor p50 %s p99 %s",
		samples, percentile(viaMCI, 50), percentile(viaMCI, 99), percentile(floor, 50), percentile(floor, 99))
}

func percentile(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := (len(s)*p + 99) / 100
	if idx > 0 {
		idx--
	}
	return s[idx]
}

func report(b *testing.B, name string, d []time.Duration) {
	b.ReportMetric(float64(percentile(d, 50).Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(float64(percentile(d, 99).Microseconds())/1000, name+"-p99-ms")
}
