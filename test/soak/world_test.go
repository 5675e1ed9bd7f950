package soak

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
)

// world is what the soak arranged: which cluster exports which pool, and
// which (watcher, member) pairs a fault holds now. A view is judged
// against it: for a pair under a fault, the member's entries may lag or
// be flagged, so they are left out of the comparison until the heal.
type world struct {
	mu sync.Mutex
	// exports[cluster] are the "namespace/name" of the pools it exports.
	exports map[string]map[string]bool
	// faulted[watcher][member] counts the faults on the pair.
	faulted map[string]map[string]int
	// paused counts the pauses of each cluster's kube-apiserver: every
	// pair whose member it is is faulted, and its own views cannot be
	// read.
	paused map[string]int
	// changed is when each pool's export last changed, in any cluster.
	changed map[string]time.Time
	// since[watcher][member] is when the pair's faults began (a pause of
	// member counts for every watcher).
	since map[string]map[string]time.Time
	// absent[cluster] are the namespaces a member fault deleted there: a
	// cluster imports into a namespace of its own name only, so it
	// imports nothing into them until they are back.
	absent map[string]map[string]bool
	// settling[cluster] are the pools whose deletion there is under way
	// (their namespace terminating): a view may show them or not until
	// they are gone, so their entries from cluster are left out of every
	// comparison meanwhile.
	settling map[string]map[string]bool
}

func (w *world) setSettling(cluster, key string, settling bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if settling {
		w.settling[cluster][key] = true
	} else {
		delete(w.settling[cluster], key)
	}
}

func (w *world) setAbsent(cluster, ns string, absent bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if absent {
		w.absent[cluster][ns] = true
	} else {
		delete(w.absent[cluster], ns)
	}
}

// namespaceOf is the namespace of a "namespace/name" key.
func namespaceOf(key string) string {
	ns, _, _ := strings.Cut(key, "/")
	return ns
}

func newWorld(clusters []string) *world {
	w := &world{exports: map[string]map[string]bool{}, faulted: map[string]map[string]int{}, paused: map[string]int{}, changed: map[string]time.Time{}, since: map[string]map[string]time.Time{},
		absent: map[string]map[string]bool{}, settling: map[string]map[string]bool{}}
	for _, c := range clusters {
		w.absent[c] = map[string]bool{}
		w.settling[c] = map[string]bool{}
		w.exports[c] = map[string]bool{}
		w.faulted[c] = map[string]int{}
		w.since[c] = map[string]time.Time{}
	}
	return w
}

func (w *world) setExported(cluster, key string, exported bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changed[key] = time.Now()
	if exported {
		w.exports[cluster][key] = true
	} else {
		delete(w.exports[cluster], key)
	}
}

// touch records that key's export is about to change: a watcher may see
// the change before the call that made it returns.
func (w *world) touch(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.changed[key] = time.Now()
}

func (w *world) exported(cluster, key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.exports[cluster][key]
}

// unexpectedDelete says why an import of key leaving cluster in's view
// is wrong, or "" when it is not: another cluster exported the pool
// throughout the last settle (a member under a fault keeps its last
// known pools, flagged, so no fault is an excuse).
func (w *world) unexpectedDelete(in, key string, settle time.Duration) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Since(w.changed[key]) < settle || w.absent[in][namespaceOf(key)] {
		return ""
	}
	var by []string
	for c, pools := range w.exports {
		if c != in && pools[key] {
			if w.settling[c][key] {
				return "" // being deleted there
			}
			by = append(by, c)
		}
	}
	if len(by) == 0 {
		return ""
	}
	sort.Strings(by)
	var faults []string
	for _, m := range by {
		if w.faulted[in][m] > 0 {
			faults = append(faults, in+"->"+m+" under a link fault")
		}
		if w.paused[m] > 0 {
			faults = append(faults, m+" paused")
		}
	}
	return fmt.Sprintf("still exported by %s (%s)", strings.Join(by, ","), cmp.Or(strings.Join(faults, ", "), "no fault on those pairs"))
}

func (w *world) fault(watcher, member string, delta int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faulted[watcher][member] += delta
	w.began(watcher, member)
}

func (w *world) pause(cluster string, delta int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.paused[cluster] += delta
	for watcher := range w.since {
		w.began(watcher, cluster)
	}
}

// began records when the pair's faults began, or forgets it once none
// holds it.
func (w *world) began(watcher, member string) {
	held := w.faulted[watcher][member] > 0 || w.paused[member] > 0
	_, had := w.since[watcher][member]
	switch {
	case held && !had:
		w.since[watcher][member] = time.Now()
	case !held:
		delete(w.since[watcher], member)
	}
}

// judged is a copy of the world for one comparison.
type judged struct {
	exports map[string]map[string]bool
	skip    map[string]map[string]bool // [in][member]: left out
	unread  map[string]bool            // clusters whose views cannot be read
	// kept[in][member] are the pools the member exported, unchanged, since
	// before the faults on the pair began: in's LIST must still list the
	// member in their imports, Ready or flagged.
	kept map[string]map[string][]string
	// absent[in] are the namespaces deleted in in.
	absent map[string]map[string]bool
	// settling[exporter] are the pools being deleted there.
	settling map[string]map[string]bool
}

func (w *world) snapshot() judged {
	w.mu.Lock()
	defer w.mu.Unlock()
	j := judged{exports: map[string]map[string]bool{}, skip: map[string]map[string]bool{}, unread: map[string]bool{}, kept: map[string]map[string][]string{},
		absent: map[string]map[string]bool{}, settling: map[string]map[string]bool{}}
	for c, ns := range w.absent {
		j.absent[c] = maps.Clone(ns)
	}
	for c, keys := range w.settling {
		j.settling[c] = maps.Clone(keys)
	}
	for c, pools := range w.exports {
		j.exports[c] = maps.Clone(pools)
		j.skip[c] = map[string]bool{}
	}
	for in, members := range w.faulted {
		for m, n := range members {
			if n > 0 {
				j.skip[in][m] = true
			}
		}
	}
	for c, n := range w.paused {
		if n > 0 {
			j.unread[c] = true
			for in := range j.skip {
				j.skip[in][c] = true
			}
		}
	}
	for in, members := range w.since {
		j.kept[in] = map[string][]string{}
		for m, since := range members {
			for key := range w.exports[m] {
				// A change made just before the fault may not have
				// reached in yet.
				if w.changed[key].Before(since.Add(-3*time.Second)) && !w.settling[m][key] {
					j.kept[in][m] = append(j.kept[in][m], key)
				}
			}
		}
	}
	return j
}

// keptThroughout is j with only the kept pools that after keeps too: a
// LIST taken between the two snapshots may rightly leave out a pool whose
// export changed meanwhile (a withdrawal held up by a pause and made as
// it ended, say), which j alone would count as lost.
func (j judged) keptThroughout(after judged) judged {
	out := j
	out.kept = map[string]map[string][]string{}
	for in, members := range j.kept {
		out.kept[in] = map[string][]string{}
		for m, keys := range members {
			for _, key := range keys {
				if slices.Contains(after.kept[in][m], key) {
					out.kept[in][m] = append(out.kept[in][m], key)
				}
			}
		}
	}
	return out
}

// lost lists the pools of members under a fault that cluster in's
// imports no longer list: a member that cannot be reached keeps its last
// known pools, flagged ClusterUnreachable.
func (j judged) lost(in string, imps []*v1alpha1.InferencePoolImport) []string {
	listed := map[string]map[string]bool{}
	for _, imp := range imps {
		key := imp.Namespace + "/" + imp.Name
		listed[key] = map[string]bool{}
		for _, c := range imp.Status.Clusters {
			listed[key][c.Name] = true
		}
	}
	var out []string
	for m, keys := range j.kept[in] {
		for _, key := range keys {
			if !listed[key][m] && !j.absent[in][namespaceOf(key)] {
				out = append(out, fmt.Sprintf("%s's import %s without %s", in, key, m))
			}
		}
	}
	sort.Strings(out)
	return out
}

// want is what cluster in must serve: for each pool another cluster
// exports, an import listing each exporter Ready, leaving out the
// skipped members.
func (j judged) want(in string) string {
	entries := map[string][]string{}
	for exporter, pools := range j.exports {
		if exporter == in || j.skip[in][exporter] {
			continue
		}
		for key := range pools {
			if j.absent[in][namespaceOf(key)] || j.settling[exporter][key] {
				continue
			}
			entries[key] = append(entries[key], exporter+":"+v1alpha1.ReasonReady)
		}
	}
	var lines []string
	for key, e := range entries {
		sort.Strings(e)
		lines = append(lines, key+"="+strings.Join(e, ","))
	}
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// state is a set of imports as "namespace/name=cluster:reason,..." lines,
// leaving out the entries of skipped members and of pools settling in
// their exporter (and imports left with no entry). Times are left out:
// each replica stamps its own.
func state(imps []*v1alpha1.InferencePoolImport, skip map[string]bool, settling map[string]map[string]bool) string {
	var lines []string
	for _, imp := range imps {
		var parts []string
		for _, c := range imp.Status.Clusters {
			if skip[c.Name] || settling[c.Name][imp.Namespace+"/"+imp.Name] {
				continue
			}
			reason := ""
			for _, cond := range c.Conditions {
				if cond.Type == "Ready" {
					reason = cond.Reason
				}
			}
			parts = append(parts, c.Name+":"+reason)
		}
		if len(parts) == 0 {
			continue
		}
		sort.Strings(parts)
		lines = append(lines, imp.Namespace+"/"+imp.Name+"="+strings.Join(parts, ","))
	}
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// view is one cluster's imports seen two ways: a fresh LIST through its
// aggregator, and an informer that watches them through it, as
// mci-sidecar does.
type view struct {
	cluster  string
	client   mciclient.Interface
	informer cache.SharedIndexInformer
	// replicas reach each mci-apiserver replica of the cluster directly:
	// the aggregator keeps one connection to the front, so its requests
	// all land on one replica.
	replicas []mciclient.Interface
}

// replicaLost lists, for each replica of v's cluster that says it is
// ready, the pools of members under a fault its LIST leaves out (kept in
// j and in w from before to after the LIST). A replica that does not
// answer is not serving: the front skips it.
func (v *view) replicaLost(ctx context.Context, w *world, j judged) []string {
	var out []string
	for r, client := range v.replicas {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil {
			var list *v1alpha1.InferencePoolImportList
			if list, err = client.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err == nil {
				imps := make([]*v1alpha1.InferencePoolImport, 0, len(list.Items))
				for i := range list.Items {
					imps = append(imps, &list.Items[i])
				}
				for _, l := range j.keptThroughout(w.snapshot()).lost(v.cluster, imps) {
					out = append(out, fmt.Sprintf("replica %d: %s", r, l))
				}
			}
		}
		cancel()
	}
	return out
}

func (v *view) list(ctx context.Context) ([]*v1alpha1.InferencePoolImport, error) {
	return listImports(ctx, v.client)
}

// listImports is a fresh LIST of every import client serves.
func listImports(ctx context.Context, client mciclient.Interface) ([]*v1alpha1.InferencePoolImport, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	list, err := client.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.InferencePoolImport, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}

func (v *view) informed() []*v1alpha1.InferencePoolImport {
	var out []*v1alpha1.InferencePoolImport
	for _, o := range v.informer.GetStore().List() {
		out = append(out, o.(*v1alpha1.InferencePoolImport))
	}
	return out
}

// deletion is an import that left an informer while another cluster
// still exported its pool.
type deletion struct {
	At      time.Time `json:"at"`
	Cluster string    `json:"cluster"`
	Import  string    `json:"import"`
	Why     string    `json:"why"`
}

// watchDeletes records in out every import that leaves v's informer while
// the world says it should stay.
func (v *view) watchDeletes(w *world, record func(deletion)) error {
	_, err := v.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		imp, ok := obj.(*v1alpha1.InferencePoolImport)
		if !ok {
			return
		}
		key := imp.Namespace + "/" + imp.Name
		if why := w.unexpectedDelete(v.cluster, key, 3*time.Second); why != "" {
			record(deletion{At: time.Now(), Cluster: v.cluster, Import: key, Why: why})
		}
	}})
	return err
}

// converged reports whether, in every cluster whose views can be read,
// the informer equals a fresh LIST and both equal what the soak arranged
// (outside the pairs under a fault), with what differs.
func converged(ctx context.Context, w *world, views []*view, replicas bool) (ok bool, why string, lost []string) {
	j := w.snapshot()
	var bad []string
	for _, v := range views {
		if j.unread[v.cluster] {
			continue
		}
		imps, err := v.list(ctx)
		if err != nil {
			bad = append(bad, v.cluster+": LIST: "+err.Error())
			continue
		}
		lost = append(lost, j.keptThroughout(w.snapshot()).lost(v.cluster, imps)...)
		if replicas {
			lost = append(lost, v.replicaLost(ctx, w, j)...)
		}
		skip := j.skip[v.cluster]
		listed, informed, want := state(imps, skip, j.settling), state(v.informed(), skip, j.settling), j.want(v.cluster)
		if listed != want || informed != listed {
			bad = append(bad, fmt.Sprintf("%s: want [%s] LIST [%s] informer [%s]", v.cluster, want, listed, informed))
		}
	}
	return len(bad) == 0, strings.Join(bad, "; "), lost
}

// measurement is one wait for convergence: after a heal or an export
// change.
type measurement struct {
	Label   string        `json:"label"`
	Kind    string        `json:"kind"` // "heal" or "export"
	FaultID int           `json:"fault_id,omitempty"`
	Since   time.Time     `json:"since"`
	Took    time.Duration `json:"took"`
	// During says the change was made while a fault held a pair of
	// clusters (its figure then includes waiting for that heal).
	During bool `json:"during_fault,omitempty"`
	// Failed: not converged within the monitor's timeout; Last says how
	// the views differed.
	Failed bool   `json:"failed,omitempty"`
	Last   string `json:"last,omitempty"`
	// Behind is what the last poll before convergence found behind (the
	// view that took longest, and how it differed): where a heal's time
	// went.
	Behind string `json:"behind,omitempty"`
}

// monitor polls convergence and resolves the measurements waiting on it:
// each at the first poll, begun after it started, that finds every view
// converged.
type monitor struct {
	w       *world
	views   []*view
	timeout time.Duration
	logf    func(format string, args ...any)

	mu      sync.Mutex
	pending []*measurement
	done    []*measurement
	last    string
	// losses are the polls that found a member's kept pools missing.
	losses []loss
}

// loss is a LIST that left out the pools of a member under a fault.
type loss struct {
	At   time.Time `json:"at"`
	What []string  `json:"what"`
}

func (m *monitor) await(kind, label string, faultID int, during bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending = append(m.pending, &measurement{Label: label, Kind: kind, FaultID: faultID, Since: time.Now(), During: during})
}

func (m *monitor) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		began := time.Now()
		// Each replica is asked directly once a second.
		ok, why, lost := converged(ctx, m.w, m.views, n%4 == 0)
		m.mu.Lock()
		behind := m.last
		if len(lost) > 0 {
			if len(m.losses) == 0 || time.Since(m.losses[len(m.losses)-1].At) > 5*time.Second {
				m.logf("UNEXPECTED: pools of a member under a fault are gone: %s", strings.Join(lost, "; "))
			}
			m.losses = append(m.losses, loss{At: time.Now(), What: lost})
		}
		m.last = why
		m.pending = slices.DeleteFunc(m.pending, func(p *measurement) bool {
			switch {
			case ok && p.Since.Before(began):
				p.Took = time.Since(p.Since)
				if behind != "" && p.Took > 500*time.Millisecond {
					p.Behind = behind
				}
			case time.Since(p.Since) > m.timeout:
				p.Took, p.Failed, p.Last = time.Since(p.Since), true, why
			default:
				return false
			}
			m.done = append(m.done, p)
			if p.Kind == "heal" || p.Failed {
				verdict := "every view = a fresh LIST"
				if p.Failed {
					verdict = "NOT CONVERGED: " + p.Last
				}
				if p.Behind != "" {
					verdict += " (behind until then: " + p.Behind + ")"
				}
				m.logf("%s %s: %s after %s", p.Kind, p.Label, verdict, p.Took.Round(10*time.Millisecond))
			}
			return true
		})
		m.mu.Unlock()
	}
}

// settle waits until nothing is pending (or timeout) and returns every
// measurement.
func (m *monitor) settle(timeout time.Duration) []*measurement {
	// What is still pending at the timeout is a failed measurement.
	_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.pending) == 0, nil
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.pending {
		p.Took, p.Failed, p.Last = time.Since(p.Since), true, m.last
		m.done = append(m.done, p)
	}
	m.pending = nil
	return slices.Clone(m.done)
}
