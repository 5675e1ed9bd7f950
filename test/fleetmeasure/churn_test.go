package fleetmeasure

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/membermock"
	"github.com/mci-dev/mci/test/quantile"
	"github.com/mci-dev/mci/test/waitfor"
)

const (
	// churnPerMember is the fleet's export changes a second per member
	// (100 a second at 1,000 members); as many readiness flaps run beside
	// them.
	churnPerMember = 0.1
	// churnFor is how long the export changes run at each fleet size.
	churnFor = 20 * time.Second
	// churnSettle is how long a change may take to reach the importer's
	// watcher before it counts as unseen.
	churnSettle = 15 * time.Second
)

// exportChange is one pool's export made or withdrawn on one member.
type exportChange struct {
	member, pool string
	exported     bool
}

// churnFigures are what export changes at the fleet-wide rate cost the
// importer.
type churnFigures struct {
	changes, unseen int
	p50, p99        time.Duration
	// cpuPerChange is the importer's CPU over the churn beyond what it
	// spends idle (probes, bookmarks), flaps included, by export change;
	// idleCPU is what it spends idle a second.
	cpuPerChange, idleCPU time.Duration
	// cores are the cores each party used over the churn, idle included:
	// the importer's mci-apiserver, its kube-apiserver (whose aggregator
	// relays every watch event of the imports) and this process (the
	// mock fleet and the watcher that decodes every event).
	cores struct{ importer, kubeAPIServer, measuring float64 }
	// importBytes is one import's size as JSON after the churn, what every
	// change of any of its clusters sends each watcher whole.
	importBytes int
	// events is how many changed imports the watcher received over the
	// churn and until the changes were seen.
	events int
	// passes are the importer's over the churn.
	passes importPasses
}

// idleFor is how long the importer's idle CPU is read before the churn.
const idleFor = 5 * time.Second

// propagation is what the importer's watcher has seen of the changes
// made: each change is timed from just before its write to the member to
// the watch event that shows it in the import.
type propagation struct {
	mu        sync.Mutex
	clusters  map[string][]string // import name: its clusters, sorted
	pending   map[exportChange]time.Time
	latencies []time.Duration
	events    int
}

// seen takes the import's clusters from an event and times the changes
// they show.
func (p *propagation) seen(name string, clusters []string) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	before := p.clusters[name]
	for _, c := range clusters {
		if _, found := slices.BinarySearch(before, c); !found {
			p.timed(exportChange{member: c, pool: name, exported: true}, now)
		}
	}
	for _, c := range before {
		if _, found := slices.BinarySearch(clusters, c); !found {
			p.timed(exportChange{member: c, pool: name, exported: false}, now)
		}
	}
	p.clusters[name] = clusters
}

// received counts an event of a changed import.
func (p *propagation) received() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events++
}

func (p *propagation) timed(c exportChange, at time.Time) {
	if start, ok := p.pending[c]; ok {
		p.latencies = append(p.latencies, at.Sub(start))
		delete(p.pending, c)
	}
}

// start records a change about to be written; false when the pool's
// previous change has not been seen yet (the watcher could not tell the
// two apart).
func (p *propagation) start(c exportChange) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	undo := c
	undo.exported = !c.exported
	if _, ok := p.pending[undo]; ok {
		return false
	}
	p.pending[c] = time.Now()
	return true
}

func (p *propagation) unseen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

func clustersOf(imp *v1alpha1.InferencePoolImport) []string {
	names := make([]string, 0, len(imp.Status.Clusters))
	for _, c := range imp.Status.Clusters {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	return names
}

// watchImports follows the importer's imports, as its gateway's sidecar
// does, through its aggregator, from a LIST.
func watchImports(t *testing.T, ctx context.Context, client mciclient.Interface, p *propagation) {
	imports := client.InferenceV1alpha1().InferencePoolImports(namespace)
	l, err := imports.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for i := range l.Items {
		p.seen(l.Items[i].Name, clustersOf(&l.Items[i]))
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return imports.Watch(ctx, o)
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, lw)
	require.NoError(t, err)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			imp, ok := ev.Object.(*v1alpha1.InferencePoolImport)
			if !ok {
				// A bookmark, or an error the retry watcher reports: a
				// change it costs is never seen, and counts as unseen.
				continue
			}
			p.received()
			switch ev.Type {
			case watch.Deleted:
				p.seen(imp.Name, nil)
			case watch.Added, watch.Modified:
				p.seen(imp.Name, clustersOf(imp))
			}
		}
	}()
}

// measureChurn changes the fleet's exports at churnPerMember a second
// per member, with as many readiness flaps, for churnFor, and times each
// export change to the importer's watcher.
func measureChurn(t *testing.T, ctx context.Context, fleet *membermock.Fleet, client mciclient.Interface, importer importerServer) churnFigures {
	p := &propagation{clusters: map[string][]string{}, pending: map[exportChange]time.Time{}}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchImports(t, wctx, client, p)

	names := fleet.Names()
	rate := churnPerMember * float64(len(names))
	withdrawn := map[exportChange]bool{} // the pools withdrawn now; every pool starts exported
	idleFrom := importer.cpu(t, ctx)
	idleProfiled := make(chan error, 1)
	go func() { idleProfiled <- importer.profileCPU(ctx, "idle", idleFor-time.Second) }()
	time.Sleep(idleFor)
	require.NoError(t, <-idleProfiled)
	cpuBefore := importer.cpu(t, ctx)
	idle := (cpuBefore - idleFrom) / idleFor.Seconds()
	kubeBefore, selfBefore, passesBefore := importer.kubeAPIServerCPU(t, ctx), processCPU(t), importer.passes(t, ctx)
	cctx, stopChurn := context.WithTimeout(ctx, churnFor)
	defer stopChurn()
	fleet.RunChurn(cctx, membermock.Churn{Namespace: namespace, Pools: pools, Flaps: rate})
	churnStart := time.Now()
	profiled := make(chan error, 1)
	go func() { profiled <- importer.profileCPU(ctx, "churn", churnFor-time.Second) }()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	changes := 0
	for cctx.Err() == nil {
		select {
		case <-cctx.Done():
		case <-tick.C:
			member, pool := names[rand.IntN(len(names))], membermock.PoolName(rand.IntN(pools))
			key := exportChange{member: member, pool: pool}
			change := exportChange{member: member, pool: pool, exported: withdrawn[key]}
			if !p.start(change) {
				continue
			}
			withdrawn[key] = !change.exported
			require.NoError(t, fleet.Member(member).Apply(membermock.ExportedPool(namespace, pool, change.exported)))
			changes++
		}
	}
	churned := time.Since(churnStart).Seconds()
	var f churnFigures
	f.cores.importer = (importer.cpu(t, ctx) - cpuBefore) / churned
	f.cores.kubeAPIServer = (importer.kubeAPIServerCPU(t, ctx) - kubeBefore) / churned
	f.cores.measuring = (processCPU(t) - selfBefore) / churned
	passesAfter := importer.passes(t, ctx)
	f.passes = importPasses{objects: passesAfter.objects - passesBefore.objects, took: passesAfter.took - passesBefore.took, versions: passesAfter.versions - passesBefore.versions}
	require.NoError(t, <-profiled)
	deadline := time.Now().Add(churnSettle)
	for p.unseen() > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	f.changes, f.unseen, f.idleCPU = changes, p.unseen(), time.Duration(idle*float64(time.Second))
	if changes > 0 {
		busy := (f.cores.importer - idle) * churned
		f.cpuPerChange = time.Duration(busy / float64(changes) * float64(time.Second))
	}
	imp, err := client.InferenceV1alpha1().InferencePoolImports(namespace).Get(ctx, membermock.PoolName(0), metav1.GetOptions{})
	require.NoError(t, err)
	encoded, err := json.Marshal(imp)
	require.NoError(t, err)
	f.importBytes = len(encoded)
	p.mu.Lock()
	defer p.mu.Unlock()
	f.events = p.events
	f.p50, f.p99 = quantile.Nearest(p.latencies, 50), quantile.Nearest(p.latencies, 99)
	return f
}

// restartFigures are what a restart of many members at once costs their
// reader.
type restartFigures struct {
	members        int
	lists, watches int
	back           time.Duration
}

// memberRestarts is how many members restart at once (fewer when the
// fleet is smaller).
const memberRestarts = 100

// measureMemberRestart restarts memberRestarts members at once, the
// fleet quiet, and counts the summary reads the importer sends them until
// each has both its summary watches again, and for 2 s more.
func measureMemberRestart(t *testing.T, ctx context.Context, fleet *membermock.Fleet) restartFigures {
	names := fleet.Names()
	restarted := names[:min(memberRestarts, len(names))]
	before := fleet.Reads()
	started := time.Now()
	for _, name := range restarted {
		require.NoError(t, fleet.Restart(name))
	}
	f := restartFigures{members: len(restarted)}
	back := func(context.Context) (bool, string) {
		now := fleet.Reads()
		for _, name := range restarted {
			if reads := now[name].Watches + now[name].Lists - before[name].Watches - before[name].Lists; reads < 2 {
				return false, fmt.Sprintf("%s: %d summary reads since its restart", name, reads)
			}
		}
		return true, ""
	}
	waitfor.EventuallyEvery(t, ctx, 50*time.Millisecond, time.Minute, back)
	f.back = time.Since(started)
	time.Sleep(2 * time.Second)
	now := fleet.Reads()
	for _, name := range restarted {
		f.lists += now[name].Lists - before[name].Lists
		f.watches += now[name].Watches - before[name].Watches
	}
	return f
}

// processCPU is this process's CPU time so far, in seconds.
func processCPU(t *testing.T) float64 {
	var u syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &u))
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}
