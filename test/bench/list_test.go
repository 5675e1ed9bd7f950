package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
)

const listSize = 10000

// parallel runs f for 0..n-1 on a few workers and returns the first error.
func parallel(n, workers int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil && !apierrors.IsAlreadyExists(err) {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

var copyGVR = schema.GroupVersionResource{Group: "bench.mci.x-k8s.io", Version: "v1", Resource: "inferencepoolimportcopies"}

// copyCRD is a CRD for objects shaped like InferencePoolImports, the way the
// proposal's reference design would store them.
func copyCRD() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]interface{}{"name": copyGVR.Resource + "." + copyGVR.Group},
		"spec": map[string]interface{}{
			"group": copyGVR.Group,
			"scope": "Namespaced",
			"names": map[string]interface{}{"plural": copyGVR.Resource, "singular": "inferencepoolimportcopy", "kind": "InferencePoolImportCopy", "listKind": "InferencePoolImportCopyList"},
			"versions": []interface{}{map[string]interface{}{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]interface{}{"openAPIV3Schema": map[string]interface{}{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
			}},
		},
	}}
}

// BenchmarkList10kImports: LIST of 10,000 InferencePoolImports (all
// namespaces) through cluster-b's kube-apiserver and the aggregator,
// against LIST of 10,000 custom resources with the same content served by
// the same kube-apiserver. Rounds alternate.
func BenchmarkList10kImports(b *testing.B) {
	ctx := context.Background()
	kubeA, mciA := clients(b, "cluster-a")
	kubeB, mciB := clients(b, "cluster-b")
	const ns = "bench-list"
	ensureNamespace(b, kubeA, ns)
	ensureNamespace(b, kubeB, ns)

	start := time.Now()
	require.NoError(b, parallel(listSize, 16, func(i int) error {
		_, err := mciA.InferencePoolV1().InferencePools(ns).Create(ctx, pool(ns, fmt.Sprintf("pool-%05d", i), true), metav1.CreateOptions{})
		return err
	}))
	b.Logf("created %d exported pools in %s", listSize, time.Since(start).Round(time.Millisecond))
	imports := mciB.InferenceV1alpha1().InferencePoolImports(ns)
	require.NoError(b, wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := imports.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) >= listSize, nil
	}))
	b.Logf("cluster-b served %d imports %s after the first create", listSize, time.Since(start).Round(time.Millisecond))

	c, err := clusters.Cluster("cluster-b")
	require.NoError(b, err)
	cfg := *c.Config
	cfg.QPS, cfg.Burst = 500, 1000
	dyn := dynamic.NewForConfigOrDie(&cfg)
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	_, err = crds.Create(ctx, copyCRD(), metav1.CreateOptions{})
	require.NoError(b, err)
	copies := dyn.Resource(copyGVR)
	require.NoError(b, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := copies.List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	}))
	list, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(b, err)
	require.NoError(b, parallel(len(list.Items), 16, func(i int) error {
		item := list.Items[i]
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&item)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{Object: map[string]interface{}{
			"apiVersion": copyGVR.GroupVersion().String(), "kind": "InferencePoolImportCopy",
			"metadata": map[string]interface{}{"name": item.Name, "namespace": item.Namespace},
			"spec":     u["spec"], "status": u["status"],
		}}
		_, err = copies.Namespace(item.Namespace).Create(ctx, obj, metav1.CreateOptions{})
		return err
	}))

	const rounds = 10
	var viaMCI, viaCRD []time.Duration
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		t0 := time.Now()
		l, err := imports.List(ctx, metav1.ListOptions{})
		viaMCI = append(viaMCI, time.Since(t0))
		require.NoError(b, err)
		require.Len(b, l.Items, listSize)

		t0 = time.Now()
		cl, err := copies.List(ctx, metav1.ListOptions{})
		viaCRD = append(viaCRD, time.Since(t0))
		require.NoError(b, err)
		require.Len(b, cl.Items, listSize)
	}
	b.StopTimer()
	mci, crd := median(viaMCI), median(viaCRD)
	b.ReportMetric(float64(mci.Milliseconds()), "mci-list-ms")
	b.ReportMetric(float64(crd.Milliseconds()), "crd-list-ms")
	b.ReportMetric(mci.Seconds()/crd.Seconds(), "ratio-to-crd")
	b.Logf("LIST of %d: imports through the aggregator median %s, custom resources median %s (ratio %.2f)", listSize, mci, crd, mci.Seconds()/crd.Seconds())
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
