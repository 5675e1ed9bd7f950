package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/exportstatus"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

// gatewayController is another controller writing the pool's status: its
// entry must come through every change of mci's untouched.
const gatewayController = "example.com/gateway-controller"

// exportedEntry returns mci's Exported entry on the pool, nil when it has
// none, and the pool's other entries.
func exportedEntry(pool *poolv1.InferencePool) (own *poolv1.ParentStatus, others []poolv1.ParentStatus) {
	for i, p := range pool.Status.Parents {
		if p.ControllerName == v1alpha1.ControllerName && p.ParentRef.Kind == "InferencePoolImport" {
			own = &pool.Status.Parents[i]
			continue
		}
		others = append(others, p)
	}
	return own, others
}

// describeParents renders status.parents for failure messages.
func describeParents(pool *poolv1.InferencePool) string {
	var parts []string
	for _, p := range pool.Status.Parents {
		s := fmt.Sprintf("%s %s/%s by %s", p.ParentRef.Kind, p.ParentRef.Namespace, p.ParentRef.Name, p.ControllerName)
		for _, c := range p.Conditions {
			s += fmt.Sprintf(" [%s=%s %s: %s]", c.Type, c.Status, c.Reason, c.Message)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// waitExported waits until the pool's mci entry has the Exported condition
// with status and reason (status "" waits for the entry to be gone), and
// returns the pool.
func (c *cluster) waitExported(t *testing.T, ctx context.Context, namespace, name string, status metav1.ConditionStatus, reason string) *poolv1.InferencePool {
	t.Helper()
	return c.waitExportedWithin(t, ctx, convergence, namespace, name, status, reason)
}

func (c *cluster) waitExportedWithin(t *testing.T, ctx context.Context, timeout time.Duration, namespace, name string, status metav1.ConditionStatus, reason string) *poolv1.InferencePool {
	t.Helper()
	var pool *poolv1.InferencePool
	waitfor.Eventually(t, ctx, timeout, func(ctx context.Context) (bool, string) {
		var err error
		pool, err = c.mci.InferencePoolV1().InferencePools(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		own, _ := exportedEntry(pool)
		if status == "" {
			return own == nil, describeParents(pool)
		}
		if own == nil || len(own.Conditions) != 1 {
			return false, describeParents(pool)
		}
		cond := own.Conditions[0]
		return cond.Type == "Exported" && cond.Status == status && cond.Reason == reason, describeParents(pool)
	})
	return pool
}

// noWriteWindow is how long a test watches for a write of the Exported
// status that must not happen. The controller has no delay of its own
// between an event and its write: Notify queues the pool at once and the
// worker PATCHes it (its only timers are the rate limiter after a failed
// write and the retry while its cache is not ready), so a write an event
// causes lands within one watch event's delivery plus one PATCH on
// loopback: tens of milliseconds, well under this window even on a loaded
// machine.
const noWriteWindow = time.Second

// poolUnwritten holds while the pool's resourceVersion is still rv.
func poolUnwritten(pools interface {
	Get(context.Context, string, metav1.GetOptions) (*poolv1.InferencePool, error)
}, name, rv string) waitfor.Condition {
	return func(ctx context.Context) (bool, string) {
		pool, err := pools.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return pool.ResourceVersion == rv, fmt.Sprintf("the pool was written (resourceVersion %s, was %s): %s", pool.ResourceVersion, rv, describeParents(pool))
	}
}

// The exporting cluster's pool carries mci's parent entry for its
// InferencePoolImport, as proposal 1374 asks: False while a member lacks
// the namespace, True once every member imports it, gone when the export
// annotation is; EPP readiness flaps write nothing; a gateway's entry on
// the same pool is never touched.
func TestExportedStatusFollowsTheExportState(t *testing.T) {
	ctx := context.Background()
	a, b, c := clusterClients(t, "cluster-a"), clusterClients(t, "cluster-b"), clusterClients(t, "cluster-c")
	const ns, name = "e2e-exported", "llm"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	a.createEPPService(t, ctx, ns, "127.0.0.21")
	a.setEPPEndpoint(t, ctx, ns, true)
	pools := a.mci.InferencePoolV1().InferencePools(ns)
	_, err := pools.Create(ctx, exportedPool(ns, name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	a.setGatewayParents(t, ctx, ns, name, gatewayController, poolv1.ParentReference{Name: "inf-gw"})

	// cluster-c lacks the namespace.
	pool := a.waitExported(t, ctx, ns, name, metav1.ConditionFalse, v1alpha1.ReasonNamespaceNotFound)
	own, others := exportedEntry(pool)
	assert.Contains(t, own.Conditions[0].Message, "namespace e2e-exported does not exist in cluster cluster-c")
	assert.Equal(t, v1alpha1.GroupName, *own.ParentRef.Group)
	assert.Equal(t, ns, own.ParentRef.Namespace)
	assert.Equal(t, name, own.ParentRef.Name)
	assert.Equal(t, pool.Generation, own.Conditions[0].ObservedGeneration)
	require.Len(t, others, 1)
	gatewayEntry := others[0]
	assert.Equal(t, gatewayController, gatewayEntry.ControllerName)
	assert.True(t, managedBy(pool, exportstatus.FieldManager, "status"), "mci's field manager owns its status write")

	c.createNamespace(t, ctx, ns)
	pool = a.waitExported(t, ctx, ns, name, metav1.ConditionTrue, v1alpha1.ReasonExported)
	own, others = exportedEntry(pool)
	assert.Contains(t, own.Conditions[0].Message, "cluster-b, cluster-c")
	assert.Equal(t, []poolv1.ParentStatus{gatewayEntry}, others, "the gateway's entry is untouched")

	// Readiness flaps: cluster-b sees each one, the pool is not written.
	before := pool.ResourceVersion
	for i, ready := range []bool{false, true, false, true} {
		a.setEPPEndpoint(t, ctx, ns, ready)
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, name)
			if err != nil || imp == nil || len(imp.Status.Clusters) != 1 {
				return false, fmt.Sprintf("flap %d: err=%v imp=%+v", i, err, imp)
			}
			want := metav1.ConditionFalse
			if ready {
				want = metav1.ConditionTrue
			}
			return conditionStatus(imp.Status.Clusters[0].Conditions, "Ready") == want, fmt.Sprintf("flap %d: %+v", i, imp.Status.Clusters[0].Conditions)
		})
	}
	// EPP readiness flaps write nothing to the pool.
	waitfor.Consistently(t, ctx, noWriteWindow, poolUnwritten(pools, name, before))

	// The EPP Service is gone: the importers would get nowhere.
	require.NoError(t, a.kube.CoreV1().Services(ns).Delete(ctx, "epp", metav1.DeleteOptions{}))
	a.waitExported(t, ctx, ns, name, metav1.ConditionFalse, v1alpha1.ReasonEndpointPickerNotFound)
	a.createEPPService(t, ctx, ns, "127.0.0.21")
	a.waitExported(t, ctx, ns, name, metav1.ConditionTrue, v1alpha1.ReasonExported)

	// An invalid annotation.
	_, err = pools.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"inference.networking.x-k8s.io/export":"World"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	pool = a.waitExported(t, ctx, ns, name, metav1.ConditionFalse, v1alpha1.ReasonInvalidExport)
	own, _ = exportedEntry(pool)
	assert.Contains(t, own.Conditions[0].Message, `"World"`)

	// The annotations removed: the entry goes, the gateway's stays.
	_, err = pools.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"inference.networking.x-k8s.io/export":null,"inference.networking.x-k8s.io/export-mode":null}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	pool = a.waitExported(t, ctx, ns, name, "", "")
	_, others = exportedEntry(pool)
	assert.Equal(t, []poolv1.ParentStatus{gatewayEntry}, others, "the gateway's entry is untouched")
}

// managedBy says whether manager has written the pool's subresource.
func managedBy(pool *poolv1.InferencePool, manager, subresource string) bool {
	for _, f := range pool.ManagedFields {
		if f.Manager == manager && f.Subresource == subresource {
			return true
		}
	}
	return false
}

// With two mci-apiservers per cluster, exactly one writes the Exported
// status: the holder of the Lease in the exporting cluster, one write per
// change of export state; an importing cluster gets no write, not even a
// Lease. A member that hangs makes the pool not Exported until it answers
// again. When the leader stops, the other replica takes over.
func TestExportedStatusIsWrittenByOneReplica(t *testing.T) {
	ctx := t.Context()
	cs := startClusterSet(t, "mci-e2e-exported-", localclusterset.Options{
		Clusters: []string{"cluster-a", "cluster-b"},
		Replicas: 2,
	})
	a, b := clientsIn(t, cs, "cluster-a"), clientsIn(t, cs, "cluster-b")
	const ns, name = "e2e-exported-replicas", "llm"
	a.createNamespace(t, ctx, ns)
	b.createNamespace(t, ctx, ns)
	a.createEPPService(t, ctx, ns, "127.0.0.22")
	a.setEPPEndpoint(t, ctx, ns, true)
	pools := a.mci.InferencePoolV1().InferencePools(ns)
	_, err := pools.Create(ctx, exportedPool(ns, name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	a.waitExported(t, ctx, ns, name, metav1.ConditionTrue, v1alpha1.ReasonExported)

	replicasA, replicasB := replicaMetrics(t, cs, "cluster-a"), replicaMetrics(t, cs, "cluster-b")
	leader := -1
	for r, m := range replicasA {
		if m(t, ctx, "mci_exported_status_leader") == 1 {
			require.Equal(t, -1, leader, "two replicas of cluster-a lead")
			leader = r
		}
	}
	require.NotEqual(t, -1, leader, "no replica of cluster-a leads")
	writes := func() []float64 {
		out := make([]float64, len(replicasA))
		for r, m := range replicasA {
			out[r] = m(t, ctx, `mci_exported_status_writes_total{result="written"}`)
		}
		return out
	}
	// One write, or two when cluster-a saw the pool before cluster-b's
	// namespace (NamespaceNotFound, then Exported). The pool may show a
	// write a moment before the writer counts it.
	var initial []float64
	waitfor.Eventually(t, ctx, 5*time.Second, func(context.Context) (bool, string) {
		initial = writes()
		return initial[leader] >= 1, fmt.Sprintf("the leader (replica %d) has not counted the Exported status written: writes %v", leader, initial)
	})
	assert.Zero(t, initial[1-leader], "only the leader writes: %v", initial)
	for r, m := range replicasB {
		assert.Zero(t, m(t, ctx, "mci_exported_status_leader"), "cluster-b replica %d leads with nothing to write", r)
		assert.Zero(t, m(t, ctx, `mci_exported_status_writes_total{result="written"}`), "cluster-b replica %d wrote", r)
	}
	_, err = b.kube.CoordinationV1().Leases(localclusterset.MCIAPIServerNamespace).Get(ctx, exportstatus.LeaseName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "an importing cluster gets no Lease: %v", err)

	// Readiness flaps: no write. Each flap is waited for where cluster-b
	// imports it, so that the window below starts after the last one.
	pool, err := pools.Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	for i, ready := range []bool{false, true, false, true} {
		a.setEPPEndpoint(t, ctx, ns, ready)
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, name)
			if err != nil || imp == nil || len(imp.Status.Clusters) != 1 {
				return false, fmt.Sprintf("flap %d: err=%v imp=%+v", i, err, imp)
			}
			want := metav1.ConditionFalse
			if ready {
				want = metav1.ConditionTrue
			}
			return conditionStatus(imp.Status.Clusters[0].Conditions, "Ready") == want, fmt.Sprintf("flap %d: %+v", i, imp.Status.Clusters[0].Conditions)
		})
	}
	// The counts from here on are taken from now, when every write of the
	// initial state has long been counted (a flap's write would show in the
	// pool's resourceVersion).
	initial = writes()
	unwritten := poolUnwritten(pools, name, pool.ResourceVersion)
	waitfor.Consistently(t, ctx, noWriteWindow, func(ctx context.Context) (bool, string) {
		if ok, state := unwritten(ctx); !ok {
			return false, "readiness flaps write nothing: " + state
		}
		got := writes()
		return slices.Equal(got, initial), fmt.Sprintf("the replicas' writes went from %v to %v", initial, got)
	})

	// Two changes of export state: two writes, by the leader.
	for i, annotations := range []string{
		`{"inference.networking.x-k8s.io/export":null,"inference.networking.x-k8s.io/export-mode":null}`,
		`{"inference.networking.x-k8s.io/export":"ClusterSet"}`,
	} {
		_, err = pools.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":`+annotations+`}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		if i == 0 {
			a.waitExported(t, ctx, ns, name, "", "")
		} else {
			a.waitExported(t, ctx, ns, name, metav1.ConditionTrue, v1alpha1.ReasonExported)
		}
	}
	// The pool may show a write a moment before the writer counts it. A
	// write too many would show in the exact count of the next step.
	waitfor.Eventually(t, ctx, 5*time.Second, func(ctx context.Context) (bool, string) {
		got := writes()
		return got[leader] == initial[leader]+2 && got[1-leader] == initial[1-leader],
			fmt.Sprintf("writes %v, want one per change of export state (%v more by replica %d), none by the other", got, 2, leader)
	})

	// cluster-b hangs: past the unreachable threshold the pool is not
	// Exported any more, and is again once cluster-b answers.
	require.NoError(t, cs.PauseAPIServer("cluster-b"))
	paused := true
	t.Cleanup(func() {
		if paused {
			_ = cs.ResumeAPIServer("cluster-b")
		}
	})
	pool = a.waitExportedWithin(t, ctx, time.Minute, ns, name, metav1.ConditionFalse, v1alpha1.ReasonClusterUnreachable)
	own, _ := exportedEntry(pool)
	assert.Contains(t, own.Conditions[0].Message, "cluster cluster-b has been unreachable since")
	require.NoError(t, cs.ResumeAPIServer("cluster-b"))
	paused = false
	a.waitExportedWithin(t, ctx, time.Minute, ns, name, metav1.ConditionTrue, v1alpha1.ReasonExported)
	waitfor.Eventually(t, ctx, 5*time.Second, func(ctx context.Context) (bool, string) {
		got := writes()
		return got[leader] == initial[leader]+4, fmt.Sprintf("writes %v, want %v more by replica %d: one each way", got, 4, leader)
	})
	waitfor.Consistently(t, ctx, noWriteWindow, func(ctx context.Context) (bool, string) {
		got := writes()
		return got[leader] == initial[leader]+4 && got[1-leader] == initial[1-leader], fmt.Sprintf("writes %v after one each way, from %v", got, initial)
	})

	// The leader stops (SIGTERM releases the Lease): the other replica
	// takes over and writes the next change.
	require.NoError(t, cs.StopMCIAPIServerReplica("cluster-a", leader))
	other := replicasA[1-leader]
	waitfor.Eventually(t, ctx, time.Minute, func(ctx context.Context) (bool, string) {
		v := other(t, ctx, "mci_exported_status_leader")
		return v == 1, fmt.Sprintf("leader gauge %v", v)
	})
	taken := other(t, ctx, `mci_exported_status_writes_total{result="written"}`)
	_, err = pools.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"inference.networking.x-k8s.io/export":"World"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	a.waitExported(t, ctx, ns, name, metav1.ConditionFalse, v1alpha1.ReasonInvalidExport)
	// The pool may show the write a moment before the writer counts it.
	waitfor.Eventually(t, ctx, 5*time.Second, func(ctx context.Context) (bool, string) {
		v := other(t, ctx, `mci_exported_status_writes_total{result="written"}`)
		return v == taken+1, fmt.Sprintf("the new leader's writes went from %v to %v", taken, v)
	})
}

// replicaMetric reads one metric (name with its labels, as exposed) of one
// mci-apiserver replica; 0 when absent.
type replicaMetric func(t *testing.T, ctx context.Context, series string) float64

// replicaMetrics returns a reader of each mci-apiserver replica of cluster,
// talking to the replica directly (not through the aggregator) as the
// cluster's admin: /metrics is authorized by the cluster like any request.
func replicaMetrics(t *testing.T, cs *localclusterset.ClusterSet, cluster string) []replicaMetric {
	t.Helper()
	c, err := cs.Cluster(cluster)
	require.NoError(t, err)
	var out []replicaMetric
	for r := range c.MCIAPIServerReplicaPorts {
		client, err := kubernetes.NewForConfig(replicaConfig(t, cs, cluster, r))
		require.NoError(t, err)
		out = append(out, func(t *testing.T, ctx context.Context, series string) float64 {
			t.Helper()
			body, err := client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
			require.NoError(t, err, "reading the metrics of replica %d", r)
			return seriesValue(t, body, series)
		})
	}
	return out
}

// replicaConfig is the admin configuration of cluster's mci-apiserver
// replica r, talked to directly (not through the aggregator): the
// replica authorizes the cluster's admin like the aggregator's requests.
func replicaConfig(t *testing.T, cs *localclusterset.ClusterSet, cluster string, r int) *rest.Config {
	t.Helper()
	c, err := cs.Cluster(cluster)
	require.NoError(t, err)
	require.Less(t, r, len(c.MCIAPIServerReplicaPorts), "%s runs %d replicas", cluster, len(c.MCIAPIServerReplicaPorts))
	config := rest.CopyConfig(c.Config)
	config.Host = fmt.Sprintf("https://127.0.0.1:%d", c.MCIAPIServerReplicaPorts[r])
	config.TLSClientConfig.CAData = nil
	config.TLSClientConfig.CAFile = filepath.Join(cs.Dir, "pki", "mci-serving-ca.crt")
	return config
}
