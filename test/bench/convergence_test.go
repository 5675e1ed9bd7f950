package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/mci-dev/mci/test/bench/crdfanout"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/quantile"
)

// startBaseline runs the CRD fan-out controller for namespace ns, writing
// into targets (every member when nil), until the benchmark ends.
func (e *env) startBaseline(b *testing.B, ns string, targets []string) *crdfanout.Controller {
	b.Helper()
	var members []crdfanout.Member
	for _, name := range e.names {
		members = append(members, crdfanout.Member{Name: name, Config: e.cfg[name]})
	}
	ctrl, err := crdfanout.New(crdfanout.Options{
		ClusterSetName: localclusterset.ClusterSetName, Members: members, Targets: targets, Namespace: ns, Workers: 8,
	})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-ctrl.Synced():
	case err := <-done:
		b.Fatalf("the baseline controller stopped: %v", err)
	case <-time.After(2 * time.Minute):
		b.Fatal("the baseline controller's informers did not sync in 2m")
	}
	return ctrl
}

// watchFrom lists ri (for its resourceVersion) and watches from there, so
// that only changes arrive.
func watchFrom(b *testing.B, ri dynamic.ResourceInterface, opts metav1.ListOptions) watch.Interface {
	b.Helper()
	ctx := context.Background()
	l, err := ri.List(ctx, metav1.ListOptions{LabelSelector: opts.LabelSelector, FieldSelector: opts.FieldSelector, Limit: 1})
	require.NoError(b, err)
	opts.ResourceVersion = l.GetResourceVersion()
	w, err := ri.Watch(ctx, opts)
	require.NoError(b, err)
	b.Cleanup(w.Stop)
	return w
}

// eventAfter applies write and returns how long until w delivers an event
// that want accepts.
func eventAfter(w watch.Interface, write func() error, want func(watch.Event) bool) (time.Duration, error) {
	start := time.Now()
	if err := write(); err != nil {
		return 0, err
	}
	timeout := time.NewTimer(sampleTimeout)
	defer timeout.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return 0, errors.New("watch closed")
			}
			if ev.Type == watch.Error {
				return 0, fmt.Errorf("watch error: %+v", ev.Object)
			}
			if want(ev) {
				return time.Since(start), nil
			}
		case <-timeout.C:
			return 0, fmt.Errorf("no event within %s", sampleTimeout)
		}
	}
}

func named(ev watch.Event, name string) (*unstructured.Unstructured, bool) {
	u, ok := ev.Object.(*unstructured.Unstructured)
	return u, ok && u.GetName() == name
}

// importedFrom reports whether an import (mci's or the baseline's) lists
// cluster in status.clusters, and whether that entry is Ready.
func importedFrom(u *unstructured.Unstructured, cluster string) (listed, ready bool) {
	clusters, _, _ := unstructured.NestedSlice(u.Object, "status", "clusters")
	for _, c := range clusters {
		m, ok := c.(map[string]any)
		if !ok || m["name"] != cluster {
			continue
		}
		conds, _, _ := unstructured.NestedSlice(m, "conditions")
		for _, cd := range conds {
			if cm, ok := cd.(map[string]any); ok && cm["type"] == "Ready" {
				return true, cm["status"] == "True"
			}
		}
		return true, false
	}
	return false, false
}

// variant is one system under a latency comparison: how to make a change
// and how its observer recognises that the change arrived.
type variant struct {
	name   string
	w      watch.Interface
	change func(on bool) error
	seen   func(ev watch.Event, on bool) bool
	lat    []time.Duration
	// failed are the samples that did not arrive within sampleTimeout:
	// counted in lat as sampleTimeout (a lower bound) and reported, never
	// dropped.
	failed []string
}

// sampleTimeout bounds one convergence sample.
const sampleTimeout = 20 * time.Second

// interleave runs samples rounds; in each, every variant makes one change
// (on in even rounds, off in odd ones), in an order that rotates so that
// no variant always goes first.
func interleave(b *testing.B, samples int, vs []*variant) {
	b.Helper()
	for i := range samples {
		on := i%2 == 0
		for j := range vs {
			v := vs[(i+j)%len(vs)]
			d, err := eventAfter(v.w, func() error { return v.change(on) }, func(ev watch.Event) bool { return v.seen(ev, on) })
			if err != nil {
				logf("%s, sample %d (on=%v): %v", v.name, i, on, err)
				v.failed = append(v.failed, fmt.Sprintf("sample %d (on=%v): %v", i, on, err))
				d = sampleTimeout
			}
			v.lat = append(v.lat, d)
			time.Sleep(20 * time.Millisecond) // paces the samples
		}
	}
}

// samplesNote says how many samples a figure has and which did not arrive.
func samplesNote(vs ...*variant) string {
	note := fmt.Sprintf("%d samples each", len(vs[0].lat))
	for _, v := range vs {
		if len(v.failed) > 0 {
			note += fmt.Sprintf("; %s: %d samples did not converge within %s (counted as %s): %s", v.name, len(v.failed), sampleTimeout, sampleTimeout, strings.Join(v.failed[:min(3, len(v.failed))], "; "))
		}
	}
	return note
}

// convergenceP50 is mci's median convergence by ClusterSet size and mode.
var convergenceP50 = map[string]map[int]float64{}

// reportAgainstFloor adds p50 and p99 rows of v against the floor (and the
// baseline when there is one) to sec.
func reportAgainstFloor(sec, prefix string, v, floor, base *variant) {
	note := samplesNote(v, floor)
	results.compare(sec, prefix+"p50 vs single-hop floor", "ms", ms(median(v.lat)), "floor", ms(median(floor.lat)), "", false, note)
	results.compare(sec, prefix+"p99 vs single-hop floor", "ms", ms(quantile.Nearest(v.lat, 99)), "floor", ms(quantile.Nearest(floor.lat, 99)),
		"<= 2x floor", len(v.failed) == 0 && quantile.Nearest(v.lat, 99) <= 2*quantile.Nearest(floor.lat, 99), note)
	if base == nil {
		return
	}
	note = samplesNote(v, base)
	results.compare(sec, prefix+"p50 vs CRD fan-out", "ms", ms(median(v.lat)), "CRD fan-out", ms(median(base.lat)), "", false, note)
	results.compare(sec, prefix+"p99 vs CRD fan-out", "ms", ms(quantile.Nearest(v.lat, 99)), "CRD fan-out", ms(quantile.Nearest(base.lat, 99)),
		"< baseline", len(v.failed) == 0 && quantile.Nearest(v.lat, 99) < quantile.Nearest(base.lat, 99), note)
}

// importSeen recognises the import of name in an observer's watch: listing
// cluster-a when on, deleted when off.
func importSeen(name string) func(watch.Event, bool) bool {
	return func(ev watch.Event, on bool) bool {
		u, ok := named(ev, name)
		if !ok {
			return false
		}
		if !on {
			return ev.Type == watch.Deleted
		}
		listed, _ := importedFrom(u, "cluster-a")
		return ev.Type != watch.Deleted && listed
	}
}

// benchConvergence: an export annotation change in cluster-a until a client
// of an observer's kube-apiserver sees it, for mci in summary mode (the
// import through cluster-b's aggregator), mci in full mode (through
// cluster-c's), the single-hop floor (the pool's own watch on cluster-a)
// and the CRD fan-out baseline (its custom resource in cluster-b, counted
// once its status lists cluster-a: a client cannot route before that).
// Summary mode is two hops: cluster-a's kube-apiserver to its
// mci-apiserver (the summary), then to the observer's.
func benchConvergence(b *testing.B, e *env) {
	ctx := context.Background()
	n := len(e.names)
	const mciNS, baseNS = "conv-mci", "conv-baseline"
	e.namespaceEverywhere(b, mciNS)
	e.namespaceEverywhere(b, baseNS)
	poolsA := e.mci["cluster-a"].InferencePoolV1()
	for _, p := range []struct{ ns, name string }{{mciNS, "summary"}, {mciNS, "full"}, {mciNS, "floor"}, {baseNS, "baseline"}} {
		_, err := poolsA.InferencePools(p.ns).Create(ctx, pool(p.ns, p.name, false), metav1.CreateOptions{})
		require.NoError(b, err)
	}
	e.startBaseline(b, baseNS, nil)
	logf("convergence at %d clusters: %d samples per variant", n, cfg.ConvergenceSamples)

	patch := func(ns, name string) func(bool) error {
		return func(on bool) error {
			_, err := poolsA.InferencePools(ns).Patch(ctx, name, types.MergePatchType, exportPatch(on), metav1.PatchOptions{})
			return err
		}
	}
	vs := []*variant{
		{name: "mci, summary mode", w: watchFrom(b, e.dyn[summaryReader].Resource(importGVR).Namespace(mciNS), metav1.ListOptions{}),
			change: patch(mciNS, "summary"), seen: importSeen("summary")},
		{name: "mci, full mode", w: watchFrom(b, e.dyn[fullReader].Resource(importGVR).Namespace(mciNS), metav1.ListOptions{}),
			change: patch(mciNS, "full"), seen: importSeen("full")},
		{
			name:   "floor",
			w:      watchFrom(b, e.dyn["cluster-a"].Resource(poolGVR).Namespace(mciNS), metav1.ListOptions{FieldSelector: "metadata.name=floor"}),
			change: patch(mciNS, "floor"),
			seen: func(ev watch.Event, _ bool) bool {
				_, ok := named(ev, "floor")
				return ok && ev.Type == watch.Modified
			},
		},
		{name: "baseline", w: watchFrom(b, e.dyn[summaryReader].Resource(crdfanout.GVR).Namespace(baseNS), metav1.ListOptions{}),
			change: patch(baseNS, "baseline"), seen: importSeen("baseline")},
	}
	interleave(b, cfg.ConvergenceSamples, vs)
	floor, base := vs[2], vs[3]
	// Sizes run smallest first: the largest one's figures stay.
	results.fact(factConvClusters, float64(n))
	results.fact(factConvFloorP99, ms(quantile.Nearest(floor.lat, 99)))
	results.fact(factConvBaseP99, ms(quantile.Nearest(base.lat, 99)))
	for i, mode := range []string{modeSummary, modeFull} {
		v := vs[i]
		results.fact(mode+"."+factConvP99, ms(quantile.Nearest(v.lat, 99)))
		if convergenceP50[mode] == nil {
			convergenceP50[mode] = map[int]float64{}
		}
		convergenceP50[mode][n] = ms(median(v.lat))
		reportAgainstFloor("convergence", fmt.Sprintf("%d clusters, %s mode, export change: ", n, mode), v, floor, base)
	}
}

// benchWriteAmplification counts the writes that member kube-apiservers
// serve (apiserver_request_total, write verbs, background writes excluded,
// the benchmark's own change subtracted) per export change and per EPP
// readiness flap in cluster-a, mci and the baseline in alternating
// windows, apart for the exporting cluster (cluster-a) and the importing
// ones. mci's one write is the Exported status of the exported pool in
// cluster-a (inferencepools/status); it writes it on the baseline's pool
// too, which is exported as well, so that resource is left out of the
// baseline's windows: the baseline's figures are its own writes.
func benchWriteAmplification(b *testing.B, e *env) {
	ctx := context.Background()
	const mciNS, baseNS = "writes-mci", "writes-baseline"
	const exporting = "cluster-a"
	a := e.kube[exporting]
	for _, ns := range []string{mciNS, baseNS} {
		e.namespaceEverywhere(b, ns)
		_, err := e.mci[exporting].InferencePoolV1().InferencePools(ns).Create(ctx, pool(ns, "flap", true), metav1.CreateOptions{})
		require.NoError(b, err)
		require.NoError(b, createEPPService(ctx, a, ns, "flap-epp", "", true))
	}
	ctrl := e.startBaseline(b, baseNS, nil)

	type system struct {
		name string
		ns   string
		w    watch.Interface
	}
	systems := []*system{
		{name: "mci", ns: mciNS, w: watchFrom(b, e.dyn["cluster-b"].Resource(importGVR).Namespace(mciNS), metav1.ListOptions{})},
		{name: "CRD fan-out", ns: baseNS, w: watchFrom(b, e.dyn["cluster-b"].Resource(crdfanout.GVR).Namespace(baseNS), metav1.ListOptions{})},
	}
	// Both imports are served and Ready before counting starts, and mci's
	// Exported status is written.
	for _, s := range systems {
		ri := e.dyn["cluster-b"].Resource(importGVR)
		if s.ns == baseNS {
			ri = e.dyn["cluster-b"].Resource(crdfanout.GVR)
		}
		require.NoError(b, pollFor(time.Minute, func() bool {
			u, err := ri.Namespace(s.ns).Get(ctx, "flap", metav1.GetOptions{})
			if err != nil {
				return false
			}
			_, ready := importedFrom(u, exporting)
			return ready
		}), "%s: the import in cluster-b is not Ready", s.name)
	}
	require.NoError(b, pollFor(time.Minute, func() bool {
		p, err := e.mci[exporting].InferencePoolV1().InferencePools(mciNS).Get(ctx, "flap", metav1.GetOptions{})
		return err == nil && len(p.Status.Parents) == 1
	}), "mci: the pool in cluster-a has no Exported status")

	changes := max(cfg.WriteChanges, 1)
	settle := 2 * time.Second
	if cfg.Profile == "smoke" {
		settle = 500 * time.Millisecond
	}
	// figures[system][kind][where] are the per-window writes per change.
	figures := map[string]map[string]map[string][]float64{}
	baselineOwn := map[string][]float64{}
	window := func(s *system, kind string) {
		before := e.writeCounts(b)
		ownBefore := ctrl.Writes()
		for i := range changes {
			// Off then on, so the window ends where it started.
			on := i%2 == 1
			var write func() error
			seen := func(ev watch.Event) bool {
				u, ok := named(ev, "flap")
				if !ok {
					return false
				}
				listed, ready := importedFrom(u, exporting)
				if kind == "export" {
					if on {
						return ev.Type != watch.Deleted && listed
					}
					return ev.Type == watch.Deleted
				}
				return ev.Type == watch.Modified && listed && ready == on
			}
			if kind == "export" {
				write = func() error {
					_, err := e.mci[exporting].InferencePoolV1().InferencePools(s.ns).Patch(ctx, "flap", types.MergePatchType, exportPatch(on), metav1.PatchOptions{})
					return err
				}
			} else {
				write = func() error { return setEndpointReady(ctx, a, s.ns, "flap-epp", on) }
			}
			_, err := eventAfter(s.w, write, seen)
			require.NoError(b, err, "%s: %s change %d", s.name, kind, i)
			if s.name == "mci" && kind == "export" {
				// Each state is written before the next change, so that
				// an off-on pair is not coalesced into no write at all
				// (which the controller, level-triggered, would do).
				require.NoError(b, pollFor(time.Minute, func() bool {
					p, err := e.mci[exporting].InferencePoolV1().InferencePools(s.ns).Get(ctx, "flap", metav1.GetOptions{})
					return err == nil && (len(p.Status.Parents) == 1) == on
				}), "mci: the Exported status of change %d is not written", i)
			}
		}
		if changes%2 == 1 { // back to exported and Ready
			if kind == "export" {
				_, err := e.mci[exporting].InferencePoolV1().InferencePools(s.ns).Patch(ctx, "flap", types.MergePatchType, exportPatch(true), metav1.PatchOptions{})
				require.NoError(b, err)
			} else {
				require.NoError(b, setEndpointReady(ctx, a, s.ns, "flap-epp", true))
			}
		}
		time.Sleep(settle) // the baseline's writes to the other members land
		after := e.writeCounts(b)
		own := float64(changes + changes%2)
		if figures[s.name] == nil {
			figures[s.name] = map[string]map[string][]float64{}
		}
		if figures[s.name][kind] == nil {
			figures[s.name][kind] = map[string][]float64{}
		}
		for _, cluster := range e.names {
			total, by := diffCounts(before[cluster], after[cluster])
			if s.name != "mci" {
				// mci's Exported status on the baseline's pool.
				total -= by[exportedStatusKey]
				delete(by, exportedStatusKey)
			}
			where := "importing"
			if cluster == exporting {
				where = "exporting"
				total -= own
			}
			logf("write amplification, %s, %s, %s: %.1f writes per change (%v)", s.name, kind, cluster, total/float64(changes), by)
			figures[s.name][kind][where] = append(figures[s.name][kind][where], total/float64(changes))
		}
		if s.name != "mci" {
			baselineOwn[kind] = append(baselineOwn[kind], float64(ctrl.Writes()-ownBefore)/float64(changes))
		}
	}
	for round := range 2 {
		for j := range systems {
			window(systems[(round+j)%2], "export")
		}
		for j := range systems {
			window(systems[(round+j)%2], "flap")
		}
	}
	n := len(e.names)
	const sec = "write amplification"
	note := func(kind string) string {
		return fmt.Sprintf("%d clusters, %d changes x 2 windows; the controller itself counted %.1f", n, changes, medianFloat(baselineOwn[kind]))
	}
	// figure sums a system's per-window writes over the importing clusters
	// of each window (or takes the exporting cluster's) and gives the median.
	figure := func(system, kind, where string) float64 {
		per := figures[system][kind][where]
		if where == "exporting" {
			return medianFloat(per)
		}
		windows := len(per) / (n - 1)
		sums := make([]float64, windows)
		for i, v := range per {
			sums[i/(n-1)] += v
		}
		return medianFloat(sums)
	}
	baseAll := figure("CRD fan-out", "export", "exporting") + figure("CRD fan-out", "export", "importing")
	results.fact(factBaseWritesPerChange, baseAll/float64(n-1))
	results.fact(factBaseWritesPerFlap, (figure("CRD fan-out", "flap", "exporting")+figure("CRD fan-out", "flap", "importing"))/float64(n-1))
	for _, row := range []struct {
		kind, where, name, target string
		want                      float64
	}{
		{"export", "importing", "writes to importing clusters per export change", "0", 0},
		{"flap", "importing", "writes to importing clusters per EPP readiness flap", "0", 0},
		{"export", "exporting", "writes to the exporting cluster per export change (Exported status)", "1", 1},
		{"flap", "exporting", "writes to the exporting cluster per EPP readiness flap", "0", 0},
	} {
		m, base := figure("mci", row.kind, row.where), figure("CRD fan-out", row.kind, row.where)
		results.compare(sec, row.name, "writes", m, "CRD fan-out", base, row.target, m == row.want, note(row.kind))
	}
}

// exportedStatusKey is mci's one write, as writeCounts keys it.
const exportedStatusKey = "inferencepools/status.inference.networking.k8s.io"

func pollFor(timeout time.Duration, cond func() bool) error {
	return pollEvery(200*time.Millisecond, timeout, cond)
}
