package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mcilisters "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/informerhealth"
)

const stormNS = "storm"

// summaryWatcher is one reader of a member's summaries, as a summary-mode
// importer holds it: the export summaries' informer and its lister.
type summaryWatcher struct {
	exports  cache.SharedIndexInformer
	exported mcilisters.InferencePoolExportSummaryLister
	// reads counts the requests of every reader of the set (shared).
	reads *summaryReads
}

// summaryReads counts the readers' requests that read a summary resource
// whole: LISTs and streaming lists (watch=true&sendInitialEvents=true),
// which the server's request metrics count as WATCHes. Either is a relist;
// a reader that resumes sends neither.
type summaryReads struct {
	lists, streamingLists atomic.Int64
	// refused counts the watches resumed from a resourceVersion that the
	// server refused, by status code (410 Gone, 504 too large): what made
	// the readers relist.
	refused sync.Map // int -> *atomic.Int64
}

func (c *summaryReads) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "summaries") {
			q := req.URL.Query()
			switch {
			case q.Get("watch") != "true" && q.Get("watch") != "1":
				c.lists.Add(1)
			case q.Get("sendInitialEvents") == "true":
				c.streamingLists.Add(1)
			}
		}
		resp, err := rt.RoundTrip(req)
		if err == nil && resp.StatusCode >= 400 && req.URL.Query().Get("watch") == "true" && req.URL.Query().Get("resourceVersion") != "" {
			n, _ := c.refused.LoadOrStore(resp.StatusCode, &atomic.Int64{})
			n.(*atomic.Int64).Add(1)
		}
		return resp, err
	})
}

// refusals are the resumed watches refused so far, by status code.
func (c *summaryReads) refusals() map[int]int64 {
	out := map[int]int64{}
	c.refused.Range(func(code, n any) bool {
		out[code.(int)] = n.(*atomic.Int64).Load()
		return true
	})
	return out
}

// relists are the LISTs and streaming lists counted so far.
func (c *summaryReads) relists() (lists, streamingLists int64) {
	return c.lists.Load(), c.streamingLists.Load()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// summaryReaders starts k readers of cluster-a's summaries as a
// summary-mode importer reads them (an informer of each of the two
// resources, through cluster-a's aggregator, made again in the call while
// no server answers as every informer of mci is: package noserver), each
// on connections of its own, and returns them once synced.
func (e *env) summaryReaders(b *testing.B, k int) []summaryWatcher {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	out := make([]summaryWatcher, k)
	reads := &summaryReads{}
	readers := informerhealth.NewTracker("bench_summary_reader")
	var synced []cache.InformerSynced
	for i := range out {
		cfg := rest.CopyConfig(e.cfg["cluster-a"])
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		cfg.Dial = d.DialContext
		cfg.Wrap(reads.wrap)
		client := mciclient.NewForConfigOrDie(cfg)
		summaries := client.InferenceV1alpha1()
		exports := readers.NewInformer("inferencepoolexportsummaries", informerhealth.ListWatch(client,
			summaries.InferencePoolExportSummaries("").List, summaries.InferencePoolExportSummaries("").Watch), &v1alpha1.InferencePoolExportSummary{})
		clusters := readers.NewInformer("inferenceclustersummaries", informerhealth.ListWatch(client,
			summaries.InferenceClusterSummaries().List, summaries.InferenceClusterSummaries().Watch), &v1alpha1.InferenceClusterSummary{})
		out[i] = summaryWatcher{exports: exports, exported: mcilisters.NewInferencePoolExportSummaryLister(exports.GetIndexer()), reads: reads}
		synced = append(synced, exports.HasSynced, clusters.HasSynced)
		go exports.RunWithContext(ctx)
		go clusters.RunWithContext(ctx)
	}
	syncCtx, done := context.WithTimeout(ctx, 2*time.Minute)
	defer done()
	require.True(b, cache.WaitForCacheSync(syncCtx.Done(), synced...), "%d summary readers of cluster-a did not sync", k)
	return out
}

// hasSummaryIn says whether a reader holds an export summary in ns.
func (r summaryWatcher) hasSummaryIn(ns string) bool {
	all, err := r.exported.InferencePoolExportSummaries(ns).List(labels.Everything())
	return err == nil && len(all) > 0
}

// benchReconnectStorm: cfg.Importers readers of cluster-a's summaries (as
// that many summary-mode importers would hold) are connected when
// cluster-a's mci-apiserver restarts.
func benchReconnectStorm(b *testing.B, e *env) {
	ctx := context.Background()
	e.namespaceEverywhere(b, stormNS)
	_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(stormNS).Create(ctx, pool(stormNS, "storm", true), metav1.CreateOptions{})
	require.NoError(b, err)
	e.reconnectStorm(b, stormNS, "storm", e.summaryReaders(b, max(cfg.Importers, 1)))
}

// reconnectStorm restarts cluster-a's mci-apiserver twice while readers
// are connected, with pool name in ns exported: first quietly, the pool
// withdrawn once the server is back, then with the pool exported again
// while it is down. A reader resumes its watches across the quiet restart
// (no LIST, no streaming list). A change made while the server was down
// costs each reader one list of each summary resource, by design: the
// restarted server cannot tell what its previous run had sent, and what
// was deleted meanwhile (docs/api.md, "Watches across replicas").
func (e *env) reconnectStorm(b *testing.B, ns, name string, readers []summaryWatcher) {
	k := len(readers)
	what := fmt.Sprintf("%d clusters, %d importers reconnecting at once to a restarted mci-apiserver", len(e.names), k)
	quiet := e.restartUnderReaders(b, ns, name, readers, false)
	results.check("member restart", what+": last one consistent", "s", quiet.consistent.Seconds(), "all importers", quiet.lost == nil, quiet.note)
	results.check("member restart", what+": LIST requests it served", "requests", quiet.lists, "0", quiet.lists == 0,
		fmt.Sprintf("every reader resumes its watches from its resourceVersion; the ClusterSet's own summary-mode replicas reconnect too; by resource and code: %v", quiet.listed))
	results.check("member restart", what+": relists by the importers", "requests", float64(quiet.relists()), "0", quiet.relists() == 0, quiet.relistNote())

	down := e.restartUnderReaders(b, ns, name, readers, true)
	what += ", the pool exported while it was down"
	results.check("member restart", what+": last one consistent", "s", down.consistent.Seconds(), "all importers", down.lost == nil, down.note)
	results.check("member restart", what+": relists by the importers", "requests", float64(down.relists()), "at most one of each summary resource a reader",
		down.relists() <= int64(2*k), down.relistNote()+"; the restarted server answers a version of its previous run 410 once it lists what changed meanwhile")
}

// restart is what one restart of cluster-a's mci-apiserver under readers
// cost and how long it took.
type restart struct {
	consistent            time.Duration
	lost                  error
	note                  string
	lists                 float64
	listed                map[string]float64
	readerLists, streamed int64
	// refused are the resumed watches the server refused, by status code.
	refused map[int]int64
}

func (r restart) relists() int64 { return r.readerLists + r.streamed }

func (r restart) relistNote() string {
	return fmt.Sprintf("counted by the readers from the stop to the end: %d LISTs and %d streaming lists (a streaming list is a WATCH to the server's request metrics, so the LIST count above cannot show it), after resumed watches refused %v (by status code)", r.readerLists, r.streamed, r.refused)
}

// restartUnderReaders restarts cluster-a's mci-apiserver while readers are
// connected and every one holds pool name in ns exported; the pool is
// withdrawn while the server is down (whileDown) or once it is Available.
// It measures how long until every reader has the withdrawal, how long
// until the server serves all their watches again, and what the
// reconnection cost it (its LIST and WATCH requests since its start, its
// CPU over the window) and the readers (their LISTs and streaming lists).
// It leaves the pool exported.
func (e *env) restartUnderReaders(b *testing.B, ns, name string, readers []summaryWatcher, whileDown bool) restart {
	ctx := context.Background()
	pools := e.mci["cluster-a"].InferencePoolV1().InferencePools(ns)
	everyReader := func(exported bool) func() bool {
		return func() bool {
			for _, r := range readers {
				if r.hasSummaryIn(ns) != exported {
					return false
				}
			}
			return true
		}
	}
	export := func(on bool) {
		_, err := pools.Patch(ctx, name, types.MergePatchType, exportPatch(on), metav1.PatchOptions{})
		require.NoError(b, err)
	}
	export(true)
	require.NoError(b, pollFor(time.Minute, everyReader(true)), "the %s pool's summary at every reader", name)
	served := e.mciWatchesServed(b, "cluster-a")
	listsBefore, streamingBefore := readers[0].reads.relists()
	refusedBefore := readers[0].reads.refusals()
	require.NoError(b, e.cs.StopMCIAPIServer("cluster-a"))
	if whileDown {
		export(false)
	}
	require.NoError(b, e.cs.StartMCIAPIServer(ctx, "cluster-a"))
	ready := time.Now()
	if !whileDown {
		export(false)
	}
	cpuBefore := e.cpuTime(b, "cluster-a")
	var out restart
	withdrawn := everyReader(false)
	out.lost = pollEvery(20*time.Millisecond, 2*time.Minute, func() bool {
		out.consistent = time.Since(ready)
		return withdrawn()
	})
	var back time.Duration
	wait := 2 * time.Minute
	if out.lost != nil {
		// The readers did not come back: neither will their watches.
		wait = 10 * time.Second
	}
	_ = pollFor(wait, func() bool {
		back = time.Since(ready)
		return e.mciWatchesServed(b, "cluster-a") >= served
	})
	cpu := e.cpuTime(b, "cluster-a") - cpuBefore
	lists, watches := e.mciRequests(b, "cluster-a")
	out.lists = lists
	out.note = fmt.Sprintf("%d readers of cluster-a's 2 summary resources (each with its own connections) connected when its mci-apiserver restarted; it served %.0f watches again %s after it was Available; since its start it served %.0f LIST and %.0f WATCH requests; %s of its CPU until then",
		len(readers), served, back.Round(time.Millisecond), lists, watches, cpu)
	if out.lost != nil {
		out.note = "NOT every reader had the change after 2 minutes; " + out.note
	}
	out.listed = map[string]float64{}
	for _, smp := range e.mciMetrics(b, "cluster-a").Samples("apiserver_request_total") {
		if smp.Labels["verb"] == "LIST" {
			out.listed[smp.Labels["resource"]+" "+smp.Labels["code"]] += smp.Value
		}
	}
	listsAfter, streamingAfter := readers[0].reads.relists()
	out.readerLists, out.streamed = listsAfter-listsBefore, streamingAfter-streamingBefore
	out.refused = readers[0].reads.refusals()
	for code, n := range refusedBefore {
		out.refused[code] -= n
	}
	export(true)
	return out
}

// mciRequests are the LIST and WATCH requests cluster's mci-apiserver has
// completed or holds since it started.
func (e *env) mciRequests(b *testing.B, cluster string) (lists, watches float64) {
	b.Helper()
	m := e.mciMetrics(b, cluster)
	lists = m.Sum("apiserver_request_total", map[string]string{"verb": "LIST"})
	watches = m.Sum("apiserver_request_total", map[string]string{"verb": "WATCH"}) + m.Sum("apiserver_longrunning_requests", map[string]string{"verb": "WATCH"})
	return lists, watches
}
