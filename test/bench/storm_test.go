package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mciinformers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
	mcilisters "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha1"
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
type summaryReads struct{ lists, streamingLists atomic.Int64 }

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
		return rt.RoundTrip(req)
	})
}

// relists are the LISTs and streaming lists counted so far.
func (c *summaryReads) relists() (lists, streamingLists int64) {
	return c.lists.Load(), c.streamingLists.Load()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// summaryReaders starts k readers of cluster-a's summaries as a
// summary-mode importer reads them (an informer of each of the two
// resources, through cluster-a's aggregator), each on connections of its
// own, and returns them once synced.
func (e *env) summaryReaders(b *testing.B, k int) []summaryWatcher {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	out := make([]summaryWatcher, k)
	reads := &summaryReads{}
	var synced []cache.InformerSynced
	for i := range out {
		cfg := rest.CopyConfig(e.cfg["cluster-a"])
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		cfg.Dial = d.DialContext
		cfg.Wrap(reads.wrap)
		f := mciinformers.NewSharedInformerFactory(mciclient.NewForConfigOrDie(cfg), 0)
		exports := f.Inference().V1alpha1().InferencePoolExportSummaries()
		clusters := f.Inference().V1alpha1().InferenceClusterSummaries()
		out[i] = summaryWatcher{exports: exports.Informer(), exported: exports.Lister(), reads: reads}
		synced = append(synced, exports.Informer().HasSynced, clusters.Informer().HasSynced)
		f.Start(ctx.Done())
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

// reconnectStorm restarts cluster-a's mci-apiserver while readers are
// connected, with pool name in ns exported before and withdrawn while the
// server is down: how long until every reader has the change, how long
// until the server serves all their watches again, and what the
// reconnection cost it (its LIST and WATCH requests since its start, its
// CPU over the window). A LIST means a reader could not resume its watch
// from its resourceVersion and read everything again.
func (e *env) reconnectStorm(b *testing.B, ns, name string, readers []summaryWatcher) {
	ctx := context.Background()
	k := len(readers)
	pools := e.mci["cluster-a"].InferencePoolV1().InferencePools(ns)
	_, err := pools.Patch(ctx, name, types.MergePatchType, exportPatch(true), metav1.PatchOptions{})
	require.NoError(b, err)
	require.NoError(b, pollFor(time.Minute, func() bool {
		for _, r := range readers {
			if !r.hasSummaryIn(ns) {
				return false
			}
		}
		return true
	}), "the %s pool's summary at every reader", name)
	served := e.mciWatchesServed(b, "cluster-a")
	listsBefore, streamingBefore := readers[0].reads.relists()
	require.NoError(b, e.cs.StopMCIAPIServer("cluster-a"))
	_, err = pools.Patch(ctx, name, types.MergePatchType, exportPatch(false), metav1.PatchOptions{})
	require.NoError(b, err)
	require.NoError(b, e.cs.StartMCIAPIServer(ctx, "cluster-a"))
	ready := time.Now()
	cpuBefore := e.cpuTime(b, "cluster-a")
	var consistent, back time.Duration
	lost := pollEvery(20*time.Millisecond, 2*time.Minute, func() bool {
		for _, r := range readers {
			if r.hasSummaryIn(ns) {
				return false
			}
		}
		consistent = time.Since(ready)
		return true
	})
	_ = pollFor(2*time.Minute, func() bool {
		back = time.Since(ready)
		return e.mciWatchesServed(b, "cluster-a") >= served
	})
	cpu := e.cpuTime(b, "cluster-a") - cpuBefore
	lists, watches := e.mciRequests(b, "cluster-a")
	note := fmt.Sprintf("%d readers of cluster-a's 2 summary resources (each with its own connections) connected when its mci-apiserver restarted; it served %.0f watches again %s after it was Available; since its start it served %.0f LIST and %.0f WATCH requests; %s of its CPU until then",
		k, served, back.Round(time.Millisecond), lists, watches, cpu)
	if lost != nil {
		note = "NOT every reader had the change after 2 minutes; " + note
	}
	what := fmt.Sprintf("%d clusters, %d importers reconnecting at once to a restarted mci-apiserver", len(e.names), k)
	results.check("member restart", what+": last one consistent", "s", consistent.Seconds(), "all importers", lost == nil, note)
	listed := map[string]float64{}
	for _, smp := range e.mciMetrics(b, "cluster-a").Samples("apiserver_request_total") {
		if smp.Labels["verb"] == "LIST" {
			listed[smp.Labels["resource"]+" "+smp.Labels["code"]] += smp.Value
		}
	}
	results.check("member restart", what+": LIST requests it served", "requests", lists, "0", lists == 0,
		fmt.Sprintf("every reader resumes its watches from its resourceVersion; the ClusterSet's own summary-mode replicas reconnect too; by resource and code: %v", listed))
	listsAfter, streamingAfter := readers[0].reads.relists()
	relists := (listsAfter - listsBefore) + (streamingAfter - streamingBefore)
	results.check("member restart", what+": relists by the importers", "requests", float64(relists), "0", relists == 0,
		fmt.Sprintf("counted by the readers from the stop to the end: %d LISTs and %d streaming lists (a streaming list is a WATCH to the server's request metrics, so the LIST count above cannot show it)", listsAfter-listsBefore, streamingAfter-streamingBefore))
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
