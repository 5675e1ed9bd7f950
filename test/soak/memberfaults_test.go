package soak

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/promtext"
)

// The member faults' own namespace in each exporter: one pool, exported
// by every exporter under the same name, that a recreation deletes with
// its namespace and creates again. Its target port counts the
// recreations, so that an import still showing the old pool is seen.
const (
	recreatedNS   = "soak-recreated"
	recreatedPool = "pool"
	firstPort     = 8000
)

// generations is the target port of each exporter's current recreated
// pool.
type generations struct {
	mu   sync.Mutex
	port map[string]int32
}

func (g *generations) next(cluster string) int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.port == nil {
		g.port = map[string]int32{}
	}
	if g.port[cluster] == 0 {
		g.port[cluster] = firstPort
	}
	g.port[cluster]++
	return g.port[cluster]
}

func (g *generations) current(cluster string) int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(firstPort, g.port[cluster])
}

// createRecreated creates, in cluster, the namespace of the member
// faults, its EPP Service and its pool with target port port.
func createRecreated(ctx context.Context, kube kubernetes.Interface, mci mciclient.Interface, port int32) error {
	if err := createNamespace(ctx, kube, recreatedNS); err != nil {
		return err
	}
	if err := createEPPService(ctx, kube, recreatedNS); err != nil {
		return err
	}
	pool := exportedPool(recreatedNS, recreatedPool)
	pool.Spec.TargetPorts[0].Number = port
	_, err := mci.InferencePoolV1().InferencePools(recreatedNS).Create(ctx, pool, metav1.CreateOptions{})
	return err
}

// compact compacts the etcd to its revision and restarts Target's
// kube-apiserver. A compaction alone ends no watch that is caught up
// (etcd cancels only the watches behind the compacted revision, and the
// kube-apiserver's watch cache serves from memory); a kube-apiserver that
// starts after it begins its watch cache at the compacted revision, so
// every watch resuming on that member from an older resourceVersion (each
// mci-apiserver replica's, its EPP's, the soak's raw watchers through
// Target's aggregator) gets 410 Gone at once, as after a compaction in a
// cluster whose kube-apiserver restarts or whose watch cache falls behind.
// The member is paused in the world while its kube-apiserver is down.
func (in *injector) compact(ctx context.Context, f fault) (func() error, error) {
	rev, err := in.cs.CompactEtcd(ctx)
	if err != nil {
		return nil, err
	}
	in.log("fault %s: etcd compacted to revision %d", f, rev)
	in.w.pause(f.Target, 1)
	healed := func() error {
		in.w.pause(f.Target, -1)
		return nil
	}
	if err := in.cs.StopAPIServer(f.Target); err != nil {
		return healed, err
	}
	startCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return healed, in.cs.StartAPIServer(startCtx, f.Target)
}

// recreate deletes Target's recreatedNS, waits until it is gone, and
// returns what creates it again: namespace, Service and pool with new
// UIDs and resourceVersions, and a new target port.
func (in *injector) recreate(ctx context.Context, f fault) (func() error, error) {
	key := recreatedNS + "/" + recreatedPool
	kube := in.kube[f.Target]
	// While the namespace terminates, its pool is left out of every
	// comparison: the namespace controller deletes it when it gets to it
	// (seconds on the shared machine), and until then the pool is still
	// exported. Once the namespace is gone, the pool's leaving is an export
	// change, measured as the others.
	in.w.touch(key)
	in.w.setAbsent(f.Target, recreatedNS, true)
	in.w.setSettling(f.Target, key, true)
	defer in.w.setSettling(f.Target, key, false)
	// Deleted, then gone. A kube-apiserver that another fault restarted
	// longer than its schedule said is waited for.
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		last = kube.CoreV1().Namespaces().Delete(ctx, recreatedNS, metav1.DeleteOptions{})
		return last == nil || apierrors.IsNotFound(last), nil
	})
	if err != nil {
		in.w.setAbsent(f.Target, recreatedNS, false)
		return nil, fmt.Errorf("deleting %s: %w (%v)", recreatedNS, err, last)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().Namespaces().Get(ctx, recreatedNS, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return nil, fmt.Errorf("namespace %s of %s not gone: %w", recreatedNS, f.Target, err)
	}
	in.w.setExported(f.Target, key, false)
	in.mon.await("export", fmt.Sprintf("%s deleted in %s", recreatedNS, f.Target), f.ID, true)
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		in.w.touch(key)
		if err := createRecreated(ctx, kube, in.mci[f.Target], in.gens.next(f.Target)); err != nil {
			return fmt.Errorf("recreating %s: %w", recreatedNS, err)
		}
		in.w.setExported(f.Target, key, true)
		in.w.setAbsent(f.Target, recreatedNS, false)
		return nil
	}, nil
}

// checkAfterHeal checks the invariants of a member fault that the
// monitor's heal measurement does not (that every view equals a fresh LIST
// and the exports is the heal row of the report).
func (in *injector) checkAfterHeal(ctx context.Context, f fault, healed time.Time) []check {
	switch f.Kind {
	case compaction:
		return []check{in.checkRelists(ctx, f, healed)}
	case recreated:
		return []check{in.checkRecreated(ctx, f, healed)}
	case upgrade:
		return append(in.recordedChecks(f.ID), in.checkReplicasAgree(ctx, f, healed))
	case certRenewal, nameFailure:
		return in.recordedChecks(f.ID)
	}
	return nil
}

// relistSettle is how long after a compaction's heal its relists are
// counted: a reflector that met the kube-apiserver down backs off up to
// 30s before it tries again.
const relistSettle = 30 * time.Second

// checkRelists counts, on Target's restarted kube-apiserver (its counters
// start with it), the pool reads at cluster scope from its start to
// relistSettle after the heal: LISTs and watch-lists (a reflector's relist
// is one or the other), as apiserver_request_total and
// apiserver_watch_list_duration_seconds count them. The readers at that
// scope are Target's own mci-apiserver replicas (the other clusters' read
// Target's summaries from them, in summary mode) and its
// kube-controller-manager's informers (its garbage collector's and quota's,
// counted as two); each may relist once after its 410, and once more if
// its first attempt met the kube-apiserver still starting: 2 per reader is
// the bound. A relist loop would exceed it many times over.
func (in *injector) checkRelists(ctx context.Context, f fault, healed time.Time) check {
	readers := in.mciReplicas[f.Target] + 2
	c := check{Target: fmt.Sprintf("#%d %s %s: pool relists at cluster scope on its restarted kube-apiserver within %s of the heal <= 2 per reader (%d readers)", f.ID, f.Kind, f.Target, relistSettle, readers)}
	time.Sleep(time.Until(healed.Add(relistSettle)))
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	body, err := in.kube[f.Target].CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		c.Figure = "reading the kube-apiserver's metrics: " + err.Error()
		return c
	}
	m, err := promtext.Parse(body)
	if err != nil {
		c.Figure = err.Error()
		return c
	}
	pools := map[string]string{"group": "inference.networking.k8s.io", "resource": "inferencepools", "scope": "cluster"}
	lists := m.Sum("apiserver_request_total", merged(pools, "verb", "LIST"))
	watches := m.Sum("apiserver_request_total", merged(pools, "verb", "WATCH"))
	var watchLists uint64
	for _, x := range m["apiserver_watch_list_duration_seconds"].GetMetric() {
		labels := map[string]string{}
		for _, l := range x.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["group"] == pools["group"] && labels["resource"] == pools["resource"] && labels["scope"] == pools["scope"] {
			watchLists += x.GetHistogram().GetSampleCount()
		}
	}
	relists := int(lists) + int(watchLists)
	c.OK = relists <= 2*readers
	c.Figure = fmt.Sprintf("%d relists (%.0f LISTs, %d watch-lists); %.0f watches ended (the 410s among them)", relists, lists, watchLists, watches)
	return c
}

func merged(labels map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for a, b := range labels {
		out[a] = b
	}
	return out
}

// checkRecreated waits until every other cluster's view, both its fresh
// LIST and its informer, shows Target's entry of the recreated pool with
// the new target port: nothing of the deleted pool lingers. Bound: the
// heal target, counted for each view from the heal or, when a fault of
// its own link to Target (a partition, a blackhole, a name that does not
// resolve) ended later, from then: the view cannot read the change before.
func (in *injector) checkRecreated(ctx context.Context, f fault, healed time.Time) check {
	want := in.gens.current(f.Target)
	c := check{Target: fmt.Sprintf("#%d %s %s: every other view shows only the recreated pool (target port %d) within %s of the heal or of its link's", f.ID, f.Kind, f.Target, want, in.healBound)}
	var last string
	seen := map[string]time.Time{}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		done := true
		for _, v := range in.mon.views {
			if v.cluster == f.Target || !seen[v.cluster].IsZero() {
				continue
			}
			if ok, state := v.showsPort(ctx, f.Target, want); !ok {
				last, done = state, false
				continue
			}
			seen[v.cluster] = time.Now()
		}
		return done, nil
	})
	if err != nil {
		c.Figure = fmt.Sprintf("not in %s: %s", time.Since(healed).Round(time.Second), last)
		return c
	}
	var worst time.Duration
	var figures []string
	for _, v := range in.mon.views {
		at, ok := seen[v.cluster]
		if !ok {
			continue
		}
		from := in.linkBack(v.cluster, f.Target, healed)
		took := at.Sub(from)
		worst = max(worst, took)
		figures = append(figures, fmt.Sprintf("%s %.2fs after %s", v.cluster, took.Seconds(), map[bool]string{true: "the heal", false: "its link's heal"}[from.Equal(healed)]))
	}
	c.OK = worst <= in.healBound
	c.Figure = strings.Join(figures, ", ")
	return c
}

// showsPort reports whether both the view's fresh LIST and its informer
// show the target port want in cluster's entry of the recreated pool,
// and if not what they show.
func (v *view) showsPort(ctx context.Context, cluster string, want int32) (bool, string) {
	list, err := v.list(ctx)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", v.cluster, err)
	}
	for how, imps := range map[string][]*v1alpha1.InferencePoolImport{"LIST": list, "informer": v.informed()} {
		if got := portOf(imps, cluster); got != want {
			return false, fmt.Sprintf("%s's %s shows target port %d", v.cluster, how, got)
		}
	}
	return true, ""
}

// linkBack is the later of since and the end of the last fault that kept
// watcher from reading target (a partition, a blackhole, a name that does
// not resolve).
func (in *injector) linkBack(watcher, target string, since time.Time) time.Time {
	in.mu.Lock()
	defer in.mu.Unlock()
	back := since
	for _, w := range in.windows {
		switch w.fault.Kind {
		case partition, blackhole, nameFailure:
		default:
			continue
		}
		if w.fault.Watcher == watcher && w.fault.Target == target && w.Healed.After(back) {
			back = w.Healed
		}
	}
	return back
}

// portOf is the target port of cluster's entry in the import of the
// recreated pool; 0 when there is none.
func portOf(imps []*v1alpha1.InferencePoolImport, cluster string) int32 {
	i := slices.IndexFunc(imps, func(imp *v1alpha1.InferencePoolImport) bool {
		return imp.Namespace == recreatedNS && imp.Name == recreatedPool
	})
	if i < 0 {
		return 0
	}
	for _, c := range imps[i].Status.Clusters {
		if c.Name == cluster {
			return c.TargetPortNumber
		}
	}
	return 0
}
