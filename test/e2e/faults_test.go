package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterset"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/noserver"
	"github.com/mci-dev/mci/pkg/versionvector"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

// faultThreshold is --member-unreachable-after in the fault ClusterSet:
// short, so that the outage scenarios stay quick.
const faultThreshold = 3 * time.Second

// faultSet is a ClusterSet of its own for the fault scenarios: two
// clusters, each with two mci-apiserver replicas behind a front that plays
// the Service, so that one replica can die while the other serves. It is
// separate from the shared ClusterSet, whose servers the other tests
// expect to stay up.
type faultSet struct {
	// t is the test of all scenarios, which owns what outlives one.
	t        *testing.T
	cs       *localclusterset.ClusterSet
	a, b     *cluster
	bConfig  *rest.Config
	informer cache.SharedIndexInformer
	importReads
	// pools are the pools cluster-a exports, as the test made them: the
	// truth to compare with while cluster-a cannot be asked.
	pools map[string]bool
}

const faultNS = "faults"

// TestFaultsInAnHAClusterSet runs the fault scenarios one after the other
// against one informer in cluster-b that watches, through the aggregator,
// the imports of pools exported by cluster-a. After each fault the
// informer's store must equal a fresh LIST and the pools cluster-a really
// exports: no lost and no phantom import.
func TestFaultsInAnHAClusterSet(t *testing.T) {
	f := startFaultSet(t)
	ctx := t.Context()

	t.Run("a watch on a replica that stops resumes on the other without a relist", func(t *testing.T) {
		before := f.syncs.Load()
		for r := range 2 {
			f.waitForAWatchOlderThanASecond(t, ctx)
			require.NoError(t, f.cs.StopMCIAPIServerReplica("cluster-b", r))
			// A change while one replica is down reaches the informer
			// through the other.
			name := fmt.Sprintf("during-replica-%d-down", r)
			f.createPool(t, ctx, name)
			f.requireConsistent(t, ctx)
			require.NoError(t, f.cs.StartMCIAPIServerReplica(ctx, "cluster-b", r))
		}
		relists := f.syncs.Load() - before
		t.Logf("relists while replicas stopped in turn: %d", relists)
		assert.Zero(t, relists, "a watch must resume on the other replica from its resourceVersion")
	})

	// The exporter's server moves its version with changes that alter no
	// summary. A replica that restarts lists it there; the other, which
	// only watched, must learn it from the summaries' bookmarks, or a
	// watch moving to it from the restarted one's versions waits for the
	// exporter's next change and is refused.
	t.Run("a watch moves from a restarted replica to one that only watched while the exporter's version moved", func(t *testing.T) {
		before := f.listVersion(t, ctx, 1)
		_, err := f.a.kube.CoreV1().Services(faultNS).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "in-no-pool"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.NoError(t, f.cs.StopMCIAPIServerReplica("cluster-b", 0))
		require.NoError(t, f.cs.StartMCIAPIServerReplica(ctx, "cluster-b", 0))
		restarted := f.listVersion(t, ctx, 0)
		moved, err := versionvector.Component(restarted, "cluster-a")
		require.NoError(t, err)
		was, err := versionvector.Component(before, "cluster-a")
		require.NoError(t, err)
		require.Greater(t, moved, was, "the Service moves cluster-a's version with no summary changed: before %s, restarted replica %s", before, restarted)

		imports := mciclient.NewForConfigOrDie(replicaConfig(t, f.cs, "cluster-b", 1)).InferenceV1alpha1().InferencePoolImports(faultNS)
		waitfor.Eventually(t, ctx, 10*time.Second, func(ctx context.Context) (bool, string) {
			w, err := imports.Watch(ctx, metav1.ListOptions{ResourceVersion: restarted})
			if err != nil {
				return false, fmt.Sprintf("a watch from the restarted replica's %s: %v", restarted, err)
			}
			w.Stop()
			return true, ""
		})
		f.requireConsistent(t, ctx)
	})

	t.Run("a paused member is flagged ClusterUnreachable within the threshold and recovers", func(t *testing.T) {
		require.NoError(t, f.cs.PauseAPIServer("cluster-a"))
		paused := time.Now()
		resumed := false
		defer func() {
			if !resumed {
				_ = f.cs.ResumeAPIServer("cluster-a")
			}
		}()
		waitfor.Eventually(t, ctx, 4*faultThreshold+10*time.Second, func(ctx context.Context) (bool, string) {
			return f.allImportsReason(ctx, v1alpha1.ReasonClusterUnreachable)
		})
		flagged := time.Since(paused)
		t.Logf("member outage flagged after %s (threshold %s)", flagged.Round(10*time.Millisecond), faultThreshold)
		assert.LessOrEqual(t, flagged, faultThreshold+time.Second, "an outage is flagged within the threshold + 1s")
		f.requireConsistent(t, ctx)

		require.NoError(t, f.cs.ResumeAPIServer("cluster-a"))
		resumed = true
		waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
			return f.allImportsReason(ctx, "Ready")
		})
		f.createPool(t, ctx, "after-pause")
		f.requireConsistent(t, ctx)
	})

	// Before the kill: the kill proves that the server reconnects with the
	// rotated credentials, as the old ones are revoked in between.
	t.Run("a rotated member Secret is used without dropping the member", func(t *testing.T) {
		b := f.b
		secretWith := func(kubeconfig []byte) *corev1.Secret {
			return &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "member-cluster-a", Namespace: localclusterset.MCIAPIServerNamespace, Labels: map[string]string{clusterset.MemberClusterLabel: "cluster-a"}},
				Data:       map[string][]byte{clusterset.MemberKubeconfigKey: kubeconfig},
			}
		}
		// cluster-a moves from the kubeconfig directory to a Secret with
		// the token of a member-reader ServiceAccount, and the directory's
		// identity loses its permissions in cluster-a (open watches go on).
		joins := f.secretJoins(t)
		_, err := b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Create(ctx, secretWith(f.memberToken(t, ctx, "reader-1")), metav1.CreateOptions{})
		require.NoError(t, err)
		dirFile := filepath.Join(f.cs.MembersDir(), "cluster-a.kubeconfig")
		require.NoError(t, os.Rename(dirFile, filepath.Join(f.cs.Dir, "cluster-a.kubeconfig.parked")))
		require.NoError(t, f.a.kube.RbacV1().ClusterRoleBindings().Delete(ctx, "mci-member-reader", metav1.DeleteOptions{}))
		// The directory is read again every 10s.
		f.waitSecretJoins(t, joins)
		f.createPool(t, ctx, "from-secret")
		f.requireConsistent(t, ctx)

		// The rotation: a new ServiceAccount token, and the old
		// ServiceAccount deleted, which invalidates its tokens.
		rotated := secretWith(f.memberToken(t, ctx, "reader-2"))
		current, err := b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Get(ctx, rotated.Name, metav1.GetOptions{})
		require.NoError(t, err)
		rotated.ResourceVersion = current.ResourceVersion
		var deleted atomic.Int64
		handle, err := f.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { deleted.Add(1) }})
		require.NoError(t, err)
		joins = f.secretJoins(t)
		_, err = b.kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Update(ctx, rotated, metav1.UpdateOptions{})
		require.NoError(t, err)
		assert.Never(t, func() bool {
			ok, _ := f.allImportsReason(ctx, "Ready")
			return !ok
		}, 5*time.Second, 200*time.Millisecond, "rotating credentials must not flap the member's imports")
		f.waitSecretJoins(t, joins)
		assert.Zero(t, deleted.Load(), "no import may disappear while credentials rotate")
		require.NoError(t, f.informer.RemoveEventHandler(handle))
		f.a.deleteServiceAccount(t, ctx, "reader-1")
		f.createPool(t, ctx, "after-rotation")
		f.requireConsistent(t, ctx)
	})

	t.Run("a member kube-apiserver killed and restarted during watches", func(t *testing.T) {
		stopping := time.Now()
		require.NoError(t, f.cs.StopAPIServer("cluster-a"))
		stopped := time.Now()
		restarted := false
		defer func() {
			if !restarted {
				_ = f.cs.StartAPIServer(context.Background(), "cluster-a")
			}
		}()
		waitfor.Eventually(t, ctx, 4*faultThreshold+10*time.Second, func(ctx context.Context) (bool, string) {
			return f.allImportsReason(ctx, v1alpha1.ReasonClusterUnreachable)
		})
		t.Logf("member crash flagged %s after its kube-apiserver was gone (its graceful stop took %s; threshold %s)",
			time.Since(stopped).Round(10*time.Millisecond), stopped.Sub(stopping).Round(10*time.Millisecond), faultThreshold)
		f.requireConsistent(t, ctx)
		require.NoError(t, f.cs.StartAPIServer(ctx, "cluster-a"))
		restarted = true
		// Reconnecting needs the rotated credentials: the first ones are
		// gone.
		waitfor.Eventually(t, ctx, 2*convergence, func(ctx context.Context) (bool, string) {
			return f.allImportsReason(ctx, "Ready")
		})
		f.createPool(t, ctx, "after-restart")
		f.deletePool(t, ctx, "during-replica-0-down")
		f.requireConsistent(t, ctx)
	})

	// The importing cluster's own kube-apiserver restarts on a compacted
	// etcd while the exporter withdraws a pool: both replicas flag their
	// own cluster unreachable, then read it again, and the client's last
	// version names the view with it unreachable. An informer built as
	// mci-sidecar's resumes its watch through the restarted aggregator on
	// either replica, with no relist, and has the withdrawal soon after
	// the kube-apiserver serves again: its client asks again within a
	// second, not after the 5 s that the starting server asks for, and
	// neither the outage nor the view it names refuses the resume.
	t.Run("the importing cluster's kube-apiserver restarts on a compacted etcd while a pool is withdrawn", func(t *testing.T) {
		sidecarLike := f.startSidecarLikeInformer(t)
		for round := range 2 {
			name := fmt.Sprintf("withdrawn-during-restart-%d", round)
			f.createPool(t, ctx, name)
			f.requireConsistent(t, ctx)
			waitfor.Eventually(t, ctx, convergence, func(context.Context) (bool, string) {
				return slices.Contains(sidecarLike.names(), name), fmt.Sprintf("the sidecar-like informer has %v", sidecarLike.names())
			})
			sidecarLike.waitForAWatchOlderThanASecond(t, ctx)
			syncs := sidecarLike.syncs.Load()
			_, err := f.cs.CompactEtcd(ctx)
			require.NoError(t, err)
			require.NoError(t, f.cs.StopAPIServer("cluster-b"))
			f.deletePool(t, ctx, name)
			require.NoError(t, f.cs.StartAPIServer(ctx, "cluster-b"))
			serving := time.Now()
			waitfor.Eventually(t, ctx, convergence, func(context.Context) (bool, string) {
				return !slices.Contains(sidecarLike.names(), name), fmt.Sprintf("the sidecar-like informer still has %s: %v", name, sidecarLike.names())
			})
			took := time.Since(serving)
			t.Logf("round %d: the withdrawal reached the sidecar-like informer %s after the restarted kube-apiserver was ready", round, took.Round(time.Millisecond))
			assert.Equal(t, syncs, sidecarLike.syncs.Load(), "round %d: the watch must resume without a relist", round)
			assert.Less(t, took, 2*time.Second, "round %d: the withdrawal must reach the informer within 2 s of the restart (3.6 to 5.8 s before)", round)
			f.requireConsistent(t, ctx)
		}
	})

	t.Run("500 concurrent watchers through the aggregator", func(t *testing.T) {
		f.manyWatchers(t, ctx, 500, 5)
		f.requireConsistent(t, ctx)
	})
}

func startFaultSet(t *testing.T) *faultSet {
	t.Helper()
	cs := startClusterSet(t, "mci-e2e-faults-", localclusterset.Options{
		Clusters:               []string{"cluster-a", "cluster-b"},
		Replicas:               2,
		MemberUnreachableAfter: faultThreshold,
	})

	f := &faultSet{cs: cs, a: clientsIn(t, cs, "cluster-a"), b: clientsIn(t, cs, "cluster-b"), pools: map[string]bool{}, t: t}
	kb, err := cs.Cluster("cluster-b")
	require.NoError(t, err)
	f.bConfig = rest.CopyConfig(kb.Config)
	ctx := t.Context()
	f.a.createNamespace(t, ctx, faultNS)
	f.b.createNamespace(t, ctx, faultNS)
	f.a.createEPPService(t, ctx, faultNS, "127.0.0.9")
	f.a.setEPPEndpoint(t, ctx, faultNS, true)
	for _, name := range []string{"first", "second"} {
		f.createPool(t, ctx, name)
	}
	f.startInformer(t)
	f.requireConsistent(t, ctx)
	return f
}

// clientsIn returns the clients of one cluster of cs.
func clientsIn(t *testing.T, cs *localclusterset.ClusterSet, name string) *cluster {
	t.Helper()
	c, err := cs.Cluster(name)
	require.NoError(t, err)
	return &cluster{name: name, kube: kubernetes.NewForConfigOrDie(c.Config), mci: mciclient.NewForConfigOrDie(c.Config)}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startInformer starts the informer under test in cluster-b, as a client
// such as mci-sidecar builds it (with client-go's default streaming list),
// counting the full lists it makes.
func (f *faultSet) startInformer(t *testing.T) {
	t.Helper()
	lw := countedImports(t, f.b.mci, &f.importReads)
	f.informer = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, f.b.mci), &v1alpha1.InferencePoolImport{}, cache.SharedIndexInformerOptions{})
	runUntilSynced(t, f.informer, "the informer")
}

// runUntilSynced runs informer until the test ends, and waits until it
// has synced through the aggregator.
func runUntilSynced(t *testing.T, informer cache.SharedIndexInformer, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go informer.RunWithContext(ctx)
	syncCtx, syncCancel := context.WithTimeout(ctx, convergence)
	defer syncCancel()
	require.True(t, cache.WaitForCacheSync(syncCtx.Done(), informer.HasSynced), "%s must sync through the aggregator", what)
}

// importReads is what an informer of the imports asked for
// (countedImports).
type importReads struct {
	// syncs counts full lists: LISTs and watches with sendInitialEvents.
	// After the first, each is a relist.
	syncs atomic.Int64
	// watchSent is when the latest watch was sent (Unix nanoseconds).
	watchSent atomic.Int64
}

// waitForAWatchOlderThanASecond waits until the informer's latest watch
// was sent more than a second ago. client-go's reflector takes a watch
// that ends within a second of its start, having delivered nothing, for
// a failure ("very short watch") and lists again: a fault that ends a
// watch just moved to another replica would make it relist whatever the
// servers do, which is not what these scenarios test.
func (r *importReads) waitForAWatchOlderThanASecond(t *testing.T, ctx context.Context) {
	t.Helper()
	waitfor.Eventually(t, ctx, 10*time.Second, func(context.Context) (bool, string) {
		age := time.Since(time.Unix(0, r.watchSent.Load()))
		return age > 1200*time.Millisecond, fmt.Sprintf("the informer's latest watch was sent %s ago", age.Round(time.Millisecond))
	})
}

// countedImports lists and watches the imports of faultNS with client,
// counting in syncs the full lists made (LISTs, and watches with
// sendInitialEvents: after the first, each is a relist) and logging what
// made a watch fail or end, which is what made an informer relist, if it
// does.
func countedImports(t *testing.T, client mciclient.Interface, reads *importReads) *cache.ListWatch {
	imports := client.InferenceV1alpha1().InferencePoolImports(faultNS)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			reads.syncs.Add(1)
			return imports.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			reads.watchSent.Store(time.Now().UnixNano())
			if ptr.Deref(o.SendInitialEvents, false) {
				reads.syncs.Add(1)
			}
			w, err := imports.Watch(ctx, o)
			if err != nil {
				t.Logf("watch from resourceVersion %q: %v", o.ResourceVersion, err)
				return nil, err
			}
			return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				// Not once the informer is stopping: its watch ends with a
				// cancellation then, and the test may be over.
				if ev.Type == watch.Error && ctx.Err() == nil {
					t.Logf("watch from resourceVersion %q ended with an error event: %v", o.ResourceVersion, apierrors.FromObject(ev.Object))
				}
				return ev, true
			}), nil
		},
	}
}

// sidecarLike is an informer of the imports in cluster-b built as
// mci-sidecar builds its own (informerhealth, and a client that does not
// wait out a 503's Retry-After), counting its full lists.
type sidecarLike struct {
	informer cache.SharedIndexInformer
	importReads
}

func (s *sidecarLike) names() []string {
	var out []string
	for _, o := range s.informer.GetStore().List() {
		out = append(out, o.(*v1alpha1.InferencePoolImport).Name)
	}
	return out
}

func (f *faultSet) startSidecarLikeInformer(t *testing.T) *sidecarLike {
	t.Helper()
	config := rest.CopyConfig(f.bConfig)
	config.Wrap(noserver.WithoutRetryAfter)
	client := mciclient.NewForConfigOrDie(config)
	s := &sidecarLike{}
	lw := countedImports(t, client, &s.importReads)
	s.informer = informerhealth.NewTracker("e2e_sidecar_like").NewInformer(faultNS+"/inferencepoolimports", cache.ToListWatcherWithWatchListSemantics(lw, client), &v1alpha1.InferencePoolImport{})
	runUntilSynced(t, s.informer, "the sidecar-like informer")
	return s
}

// listVersion is the resourceVersion of a LIST of the imports served by
// cluster-b's replica r alone.
func (f *faultSet) listVersion(t *testing.T, ctx context.Context, r int) string {
	t.Helper()
	list, err := mciclient.NewForConfigOrDie(replicaConfig(t, f.cs, "cluster-b", r)).InferenceV1alpha1().InferencePoolImports(faultNS).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	return list.ResourceVersion
}

func (f *faultSet) createPool(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	_, err := f.a.mci.InferencePoolV1().InferencePools(faultNS).Create(ctx, exportedPool(faultNS, name, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	f.pools[name] = true
}

func (f *faultSet) deletePool(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	require.NoError(t, f.a.mci.InferencePoolV1().InferencePools(faultNS).Delete(ctx, name, metav1.DeleteOptions{}))
	delete(f.pools, name)
}

// importState is what must agree between the informer, a LIST and the
// exported pools: the imports by name, with each exporting cluster's
// readiness. Times are left out: each replica stamps its own.
func importState(objs []*v1alpha1.InferencePoolImport) string {
	var lines []string
	for _, imp := range objs {
		lines = append(lines, imp.Name+"="+importClusters(imp))
	}
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// requireConsistent waits until the informer's store equals a fresh LIST
// and both hold exactly one import per pool cluster-a exports.
func (f *faultSet) requireConsistent(t *testing.T, ctx context.Context) {
	t.Helper()
	var want []string
	for name := range f.pools {
		want = append(want, name)
	}
	waitfor.Eventually(t, ctx, convergence, func(ctx context.Context) (bool, string) {
		list, err := f.b.mci.InferenceV1alpha1().InferencePoolImports(faultNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "listing imports: " + err.Error()
		}
		listed := make([]*v1alpha1.InferencePoolImport, 0, len(list.Items))
		var got []string
		for i := range list.Items {
			listed = append(listed, &list.Items[i])
			got = append(got, list.Items[i].Name)
		}
		var stored []*v1alpha1.InferencePoolImport
		for _, o := range f.informer.GetStore().List() {
			stored = append(stored, o.(*v1alpha1.InferencePoolImport))
		}
		slices.Sort(want)
		slices.Sort(got)
		inStore, inList := importState(stored), importState(listed)
		return slices.Equal(want, got) && inStore == inList,
			fmt.Sprintf("pools %v; LIST %s; informer %s", want, inList, inStore)
	})
}

// allImportsReason reports whether every import in cluster-b says of
// cluster-a that it is Ready with reason.
func (f *faultSet) allImportsReason(ctx context.Context, reason string) (bool, string) {
	list, err := f.b.mci.InferenceV1alpha1().InferencePoolImports(faultNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	var states []string
	ok := len(list.Items) > 0
	for i := range list.Items {
		s := importClusters(&list.Items[i])
		states = append(states, list.Items[i].Name+"="+s)
		ok = ok && s == "cluster-a:"+reason
	}
	return ok, strings.Join(states, " ")
}

// memberToken returns a kubeconfig for cluster-a with the token of a new
// ServiceAccount there that is bound to the member reader role.
func (f *faultSet) memberToken(t *testing.T, ctx context.Context, name string) []byte {
	t.Helper()
	ka, err := f.cs.Cluster("cluster-a")
	require.NoError(t, err)
	return tokenKubeconfig(t, "cluster-a", ka.Server, ka.Config.CAData, memberReaderToken(t, ctx, f.a, name, f.t))
}

// secretJoins counts, in the log of each of cluster-b's mci-apiserver
// replicas, the connections to cluster-a made from a member Secret.
func (f *faultSet) secretJoins(t *testing.T) []int {
	t.Helper()
	return secretJoinsIn(t, f.cs, "cluster-b", "cluster-a")
}

// waitSecretJoins waits until every replica connected to cluster-a from a
// Secret again since before was counted.
func (f *faultSet) waitSecretJoins(t *testing.T, before []int) {
	t.Helper()
	waitSecretJoinsIn(t, f.cs, "cluster-b", "cluster-a", before)
}

func (c *cluster) deleteServiceAccount(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	require.NoError(t, c.kube.CoreV1().ServiceAccounts(localclusterset.MCIAPIServerNamespace).Delete(ctx, name, metav1.DeleteOptions{}))
}

// manyWatchers opens n watches on the imports of cluster-b through the
// aggregator, changes an exported pool rounds times, and measures how long
// each change takes to reach every watcher, and the memory of cluster-b's
// mci-apiservers meanwhile.
func (f *faultSet) manyWatchers(t *testing.T, ctx context.Context, n, rounds int) {
	t.Helper()
	cfg := rest.CopyConfig(f.bConfig)
	cfg.QPS, cfg.Burst = 1000, 1000
	imports := mciclient.NewForConfigOrDie(cfg).InferenceV1alpha1().InferencePoolImports(faultNS)
	list, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	rssBefore := f.mciRSS(t)

	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	// seen[w] receives the name of each import watcher w sees added.
	seen := make([]chan string, n)
	opened := make(chan error, n)
	for w := range n {
		seen[w] = make(chan string, rounds+8)
		go func() {
			wi, err := imports.Watch(watchCtx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
			opened <- err
			if err != nil {
				return
			}
			defer wi.Stop()
			for ev := range wi.ResultChan() {
				if imp, ok := ev.Object.(*v1alpha1.InferencePoolImport); ok && ev.Type == watch.Added {
					select {
					case seen[w] <- imp.Name:
					default:
					}
				}
			}
		}()
	}
	openStart := time.Now()
	for range n {
		require.NoError(t, <-opened)
	}
	t.Logf("%d watches open in %s", n, time.Since(openStart).Round(time.Millisecond))
	rssOpen := f.mciRSS(t)

	var latencies []time.Duration
	for r := range rounds {
		name := fmt.Sprintf("load-%d", r)
		changed := time.Now()
		f.createPool(t, ctx, name)
		deadline := time.After(convergence)
		for w := range n {
		wait:
			for {
				select {
				case got := <-seen[w]:
					if got == name {
						break wait
					}
				case <-deadline:
					t.Fatalf("round %d: watcher %d did not see %s within %s (%d watchers done)", r, w, name, convergence, w)
				}
			}
			latencies = append(latencies, time.Since(changed))
		}
	}
	// The loop above reads the watchers in turn, so a latency is an upper
	// bound of when the event arrived, never less.
	slices.Sort(latencies)
	p := func(q float64) time.Duration { return latencies[int(q*float64(len(latencies)-1))] }
	rssAfter := f.mciRSS(t)
	t.Logf("event delivery to %d watchers over %d changes: p50 %s, p99 %s, max %s (target p99 < 100ms)",
		n, rounds, p(0.50).Round(time.Millisecond), p(0.99).Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
	t.Logf("cluster-b mci-apiserver RSS (MiB, per replica) before %v, %d watches open %v, after %d changes %v (target < 200)", rssBefore, n, rssOpen, rounds, rssAfter)
	for i, rss := range rssAfter {
		assert.Less(t, max(rss, rssOpen[i]), 200, "mci-apiserver replica %d RSS in MiB with %d watchers", i, n)
	}
	assert.Less(t, p(0.99), time.Second, "p99 event delivery far beyond the 100ms target")
}

// mciRSS reads the resident memory (VmRSS, in MiB) of each of cluster-b's
// mci-apiserver replicas.
func (f *faultSet) mciRSS(t *testing.T) []int {
	t.Helper()
	var rss []int
	for _, p := range f.cs.Processes() {
		if !strings.HasPrefix(p.Name, "cluster-b-mci-apiserver") {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
		require.NoError(t, err)
		var kb int
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				_, err := fmt.Sscanf(strings.TrimPrefix(l, "VmRSS:"), "%d", &kb)
				require.NoError(t, err)
			}
		}
		rss = append(rss, kb/1024)
	}
	return rss
}
