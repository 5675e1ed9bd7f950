package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
)

// soakNS holds the pools the export changes create, delete and annotate.
const soakNS = "soak"

// anchorPool is a pool of soakNS that every exporter exports from the start
// to the end, untouched by the changes: mci-apiserver watches Services and
// EndpointSlices only in namespaces that have pools, so a namespace whose
// last pool comes and goes would start and stop watches, and the runtime
// figures would swing with it.
const anchorPool = "anchor"

// withdrawal is one withdrawal of the data path pool's export by one
// cluster, until it exported it again.
type withdrawal struct {
	Cluster   string    `json:"cluster"`
	At        time.Time `json:"at"`
	Restored  time.Time `json:"restored"`
	Converged bool      `json:"converged"`
	// Gone is how long after At the gateway cluster's import (a fresh
	// LIST) stopped listing the cluster: the measured convergence.
	Gone time.Duration `json:"gone"`
}

// exporter makes the export changes of the soak: in the exporting
// clusters, pools of soakNS created, deleted, their export withdrawn and
// restored, on a seeded schedule of their own; and the data path's pool
// withdrawn by one exporter at a time and restored, as the schedule's plan
// says (planWithdrawals).
type exporter struct {
	rng       *rand.Rand
	clients   map[string]mciclient.Interface
	exporters []string
	gateway   mciclient.Interface
	dpNS      string
	dpPool    string
	w         *world
	mon       *monitor
	logf      func(format string, args ...any)
	// gone is the bound of the wait for a withdrawal to leave the gateway
	// cluster's import.
	gone time.Duration
	// plan are the withdrawals of the data path pool, counted from start,
	// the start of the fault phase.
	plan  []plannedWithdrawal
	start time.Time

	mu          sync.Mutex
	withdrawals []*withdrawal
	next        int
	changes     int
}

// run changes the pools of soakNS every 4-10s, and makes the planned
// withdrawals of the data path pool, until ctx ends; a withdrawal open
// then is restored.
func (e *exporter) run(ctx context.Context) {
	var planned sync.WaitGroup
	planned.Go(func() { e.runPlan(ctx) })
	defer planned.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(4*time.Second + time.Duration(e.rng.Int64N(int64(6*time.Second)))):
		}
		e.changePool(ctx, e.exporters[e.rng.IntN(len(e.exporters))])
	}
}

// runPlan makes the planned withdrawals of the data path pool, on its own
// goroutine: a pool change that waits on a paused kube-apiserver does not
// delay them.
func (e *exporter) runPlan(ctx context.Context) {
	for _, p := range e.plan {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(e.start.Add(p.At))):
		}
		wd := e.withdraw(ctx, p.Cluster)
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(e.start.Add(p.Restore))):
		}
		// Restored even when a withdrawal failed: the patch may have
		// reached the kube-apiserver all the same.
		e.restore(p.Cluster, wd)
	}
}

// changePool creates a pool in cluster (up to four), deletes one, or
// toggles the export of one.
func (e *exporter) changePool(ctx context.Context, cluster string) {
	pools := e.clients[cluster].InferencePoolV1().InferencePools(soakNS)
	list, err := pools.List(ctx, metav1.ListOptions{})
	if err != nil {
		e.logf("export change in %s: listing pools: %v", cluster, err)
		return
	}
	list.Items = slices.DeleteFunc(list.Items, func(p poolv1.InferencePool) bool { return p.Name == anchorPool })
	op := e.rng.IntN(3)
	if len(list.Items) == 0 {
		op = 0
	} else if op == 0 && len(list.Items) >= 4 {
		op = 1 + e.rng.IntN(2)
	}
	var name, what string
	var exported bool
	switch op {
	case 0:
		e.mu.Lock()
		e.next++
		name = fmt.Sprintf("p-%d", e.next)
		e.mu.Unlock()
		what, exported = "create", true
		e.w.touch(soakNS + "/" + name)
		_, err = pools.Create(ctx, exportedPool(soakNS, name), metav1.CreateOptions{})
	case 1:
		p := list.Items[e.rng.IntN(len(list.Items))]
		name, what = p.Name, "delete"
		e.w.touch(soakNS + "/" + name)
		err = pools.Delete(ctx, name, metav1.DeleteOptions{})
	default:
		p := list.Items[e.rng.IntN(len(list.Items))]
		name = p.Name
		exported = p.Annotations[v1alpha1.ExportAnnotation] == ""
		what = map[bool]string{true: "export", false: "withdraw"}[exported]
		e.w.touch(soakNS + "/" + name)
		err = e.annotateExport(ctx, pools.Patch, name, exported)
	}
	if err != nil {
		e.logf("export change in %s: %s %s/%s: %v", cluster, what, soakNS, name, err)
		return
	}
	e.w.setExported(cluster, soakNS+"/"+name, exported)
	e.changed(fmt.Sprintf("%s %s/%s in %s", what, soakNS, name, cluster))
}

type patcher func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*poolv1.InferencePool, error)

// annotateExport sets or removes the export annotation of a pool.
func (e *exporter) annotateExport(ctx context.Context, patch patcher, name string, exported bool) error {
	var value any // null removes it
	if exported {
		value = v1alpha1.ExportScopeClusterSet
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.ExportAnnotation: value}}})
	if err != nil {
		return err
	}
	_, err = patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}

// withdraw removes cluster's export of the data path pool and measures
// how long the gateway cluster's import takes to stop listing it.
func (e *exporter) withdraw(ctx context.Context, cluster string) *withdrawal {
	pools := e.clients[cluster].InferencePoolV1().InferencePools(e.dpNS)
	e.w.touch(e.dpNS + "/" + e.dpPool)
	patchCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := e.annotateExport(patchCtx, pools.Patch, e.dpPool, false); err != nil {
		e.logf("export change: withdrawing %s/%s in %s: %v", e.dpNS, e.dpPool, cluster, err)
		return nil
	}
	wd := &withdrawal{Cluster: cluster, At: time.Now()}
	e.w.setExported(cluster, e.dpNS+"/"+e.dpPool, false)
	e.changed(fmt.Sprintf("withdraw %s/%s (data path) in %s", e.dpNS, e.dpPool, cluster))
	e.mu.Lock()
	e.withdrawals = append(e.withdrawals, wd)
	e.mu.Unlock()
	go func() {
		// Polled every 100ms, the resolution of the figure; not converged
		// when it is still listed at the deadline.
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Until(wd.At.Add(e.gone)), true, func(ctx context.Context) (bool, error) {
			listed, err := e.importLists(ctx, cluster)
			if err != nil || listed {
				return false, nil
			}
			e.mu.Lock()
			wd.Converged, wd.Gone = true, time.Since(wd.At)
			e.mu.Unlock()
			return true, nil
		})
	}()
	return wd
}

// restoreWithin bounds the retries of a restore: the longest a planned
// fault keeps a kube-apiserver from answering, and more.
const restoreWithin = 2 * time.Minute

// restore exports the data path pool from cluster again, retrying each
// second while its kube-apiserver does not answer (a pause, a restart
// the schedule did not foresee): a restore given up would leave the
// cluster out of the data path to the end of the soak.
func (e *exporter) restore(cluster string, wd *withdrawal) {
	pools := e.clients[cluster].InferencePoolV1().InferencePools(e.dpNS)
	e.w.touch(e.dpNS + "/" + e.dpPool)
	ctx, cancel := context.WithTimeout(context.Background(), restoreWithin)
	defer cancel()
	failures := 0
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		patchCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := e.annotateExport(patchCtx, pools.Patch, e.dpPool, true); err != nil {
			if failures == 0 {
				e.logf("export change: restoring %s/%s in %s: %v (retrying)", e.dpNS, e.dpPool, cluster, err)
			}
			failures++
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		e.logf("export change: restoring %s/%s in %s: not restored within %s", e.dpNS, e.dpPool, cluster, restoreWithin)
		return
	}
	if wd != nil {
		e.mu.Lock()
		wd.Restored = time.Now()
		e.mu.Unlock()
	}
	e.w.setExported(cluster, e.dpNS+"/"+e.dpPool, true)
	what := fmt.Sprintf("restore %s/%s (data path) in %s", e.dpNS, e.dpPool, cluster)
	if failures > 0 {
		what += fmt.Sprintf(" (after %d failed attempts)", failures)
	}
	e.changed(what)
}

// importLists reports whether the gateway cluster's import of the data
// path pool lists cluster.
func (e *exporter) importLists(ctx context.Context, cluster string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	imp, err := e.gateway.InferenceV1alpha1().InferencePoolImports(e.dpNS).Get(ctx, e.dpPool, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(imp.Status.Clusters, func(c v1alpha1.ImportedCluster) bool { return c.Name == cluster }), nil
}

func (e *exporter) changed(what string) {
	e.mu.Lock()
	e.changes++
	e.mu.Unlock()
	during := false
	j := e.w.snapshot()
	for _, members := range j.skip {
		during = during || len(members) > 0
	}
	e.logf("export change: %s", what)
	e.mon.await("export", what, 0, during)
}

func (e *exporter) result() ([]withdrawal, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]withdrawal, 0, len(e.withdrawals))
	for _, w := range e.withdrawals {
		out = append(out, *w)
	}
	return out, e.changes
}

// exportedPool is an InferencePool exported to the ClusterSet in
// EndpointMode, whose EPP is the Service "epp".
func exportedPool(namespace, name string) *poolv1.InferencePool {
	return &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace,
			Annotations: map[string]string{
				v1alpha1.ExportAnnotation:     v1alpha1.ExportScopeClusterSet,
				v1alpha1.ExportModeAnnotation: string(v1alpha1.RoutingModeEndpoint),
			},
		},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
}
