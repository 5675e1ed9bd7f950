package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
)

// Both ways of reading the other members run side by side in every
// ClusterSet, so that one change is measured in both modes in the same run:
// cluster-b and every second cluster after it read the others through
// their summaries (--member-summaries=auto), cluster-a, cluster-c and every
// second cluster after them watch the others' objects (never). cluster-a
// exports; cluster-b observes summary mode and cluster-c full mode.
const (
	summaryReader = "cluster-b"
	fullReader    = "cluster-c"
	modeSummary   = "summary"
	modeFull      = "full"
)

// readerModes is each cluster's --member-summaries.
func readerModes(names []string) map[string]string {
	out := map[string]string{}
	for i, name := range names {
		out[name] = "never"
		if i%2 == 1 {
			out[name] = "auto"
		}
	}
	return out
}

// readersOf are the clusters other than exporter that read it in mode.
func readersOf(names []string, exporter, mode string) []string {
	modes := readerModes(names)
	var out []string
	for _, name := range names {
		if name == exporter {
			continue
		}
		if (modes[name] == "auto") == (mode == modeSummary) {
			out = append(out, name)
		}
	}
	return out
}

// observer is the cluster whose mci-apiserver is measured for mode.
func observer(mode string) string {
	if mode == modeSummary {
		return summaryReader
	}
	return fullReader
}

// watchCounts are the WATCH requests one kube-apiserver has open, by
// resource ("inferencepools.inference.networking.k8s.io/v1"), from its
// apiserver_longrunning_requests. kube-apiserver 1.36 no longer exposes
// apiserver_registered_watchers, and its longrunning gauge does not count
// the watches its aggregator proxies (they are not served by its resource
// handlers): those are counted where they land, by the member's
// mci-apiserver (mciWatchesServed).
type watchCounts struct {
	requests map[string]float64
}

func (e *env) watchCounts(b *testing.B, cluster string) watchCounts {
	b.Helper()
	m, err := e.apiServerMetrics(context.Background(), cluster)
	require.NoError(b, err)
	w := watchCounts{requests: map[string]float64{}}
	for _, s := range m.Samples("apiserver_longrunning_requests") {
		if s.Labels["verb"] == "WATCH" {
			w.requests[s.Labels["resource"]+"."+s.Labels["group"]+"/"+s.Labels["version"]] += s.Value
		}
	}
	return w
}

// aggregated says whether a resource key is in the group version the
// kube-apiserver proxies to the member's mci-apiserver (its APIService): a
// watch of it is none of the storage's. The group's other versions are
// custom resources (InferenceObjectives, ...) served from the storage.
func aggregated(key string) bool {
	return strings.HasSuffix(key, "."+localclusterset.MCIGroup+"/"+localclusterset.MCIVersion)
}

// split sums counts into the aggregated group's and the storage's.
func split(counts map[string]float64) (proxied, storage float64) {
	for k, v := range counts {
		if aggregated(k) {
			proxied += v
		} else {
			storage += v
		}
	}
	return proxied, storage
}

// minus is what a has more than b, by key, zeros left out.
func minus(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok && v != 0 {
			out[k] = -v
		}
	}
	return out
}

// mciWatchesServed is how many WATCH requests cluster's mci-apiserver
// serves (its own apiserver_longrunning_requests): the proxied watches of
// its summaries land there.
func (e *env) mciWatchesServed(b *testing.B, cluster string) float64 {
	b.Helper()
	return e.mciMetrics(b, cluster).Sum("apiserver_longrunning_requests", map[string]string{"verb": "WATCH"})
}

// mciMetrics reads cluster's mci-apiserver /metrics, as the admin.
func (e *env) mciMetrics(b *testing.B, cluster string) promtext.Metrics {
	b.Helper()
	c, err := e.cs.Cluster(cluster)
	require.NoError(b, err)
	resp, err := e.mciHTTP(b).Get(fmt.Sprintf("https://127.0.0.1:%d/metrics", c.MCIAPIServerReplicaPorts[0]))
	require.NoError(b, err)
	defer resp.Body.Close()
	require.Equal(b, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(b, err)
	m, err := promtext.Parse(body)
	require.NoError(b, err)
	return m
}

// waitWatchesBack waits until cluster-a's kube-apiserver serves at least
// want WATCH requests again, after a reader came back.
func (e *env) waitWatchesBack(b *testing.B, want float64) {
	b.Helper()
	_ = pollFor(time.Minute, func() bool {
		p, s := split(e.watchCounts(b, "cluster-a").requests)
		return p+s >= want
	})
}

// benchWatchOrigins attributes cluster-a's watches to their origin by
// taking one reader away: cluster-b's mci-apiserver (summary mode) is
// stopped, cluster-a's kube-apiserver metrics read before and after, then
// the same for cluster-c's (full mode). The difference is exactly what
// that one replica held on cluster-a, by resource; the identities are the
// same for every reader here, so the metrics could not tell them apart
// otherwise. Whether a watch reaches the storage is told by resource: mci's
// own group is proxied to cluster-a's mci-apiserver, every other group is
// served from cluster-a's storage.
func benchWatchOrigins(b *testing.B, e *env) {
	ctx := context.Background()
	n := len(e.names)
	const sec = "watches by origin"
	total := e.watchCounts(b, "cluster-a")
	proxied, storage := split(total.requests)
	pools, err := e.mci["cluster-a"].InferencePoolV1().InferencePools("").List(ctx, metav1.ListOptions{})
	require.NoError(b, err)
	poolNS := map[string]bool{}
	for _, p := range pools.Items {
		poolNS[p.Namespace] = true
	}
	results.fact(factPoolNamespacesAtOrigins, float64(len(poolNS)))
	results.add(sec, fmt.Sprintf("%d clusters: WATCH requests on cluster-a's kube-apiserver from its storage (proxied to its mci-apiserver in the note)", n), "watches", storage,
		fmt.Sprintf("%.0f served by cluster-a's mci-apiserver (proxied; apiserver_longrunning_requests counts %.0f of them); readers of cluster-a: %d in summary mode, %d in full mode, its own mci-apiserver, kube-controller-manager; %d namespaces of cluster-a hold pools",
			e.mciWatchesServed(b, "cluster-a"), proxied, len(readersOf(e.names, "cluster-a", modeSummary)), len(readersOf(e.names, "cluster-a", modeFull)), len(poolNS)))
	for _, mode := range []string{modeSummary, modeFull} {
		reader := observer(mode)
		before := e.watchCounts(b, "cluster-a")
		servedBefore := e.mciWatchesServed(b, "cluster-a")
		require.NoError(b, e.cs.StopMCIAPIServer(reader))
		time.Sleep(2 * time.Second) // the connections close with the process; the metrics follow
		after := e.watchCounts(b, "cluster-a")
		servedAfter := e.mciWatchesServed(b, "cluster-a")
		require.NoError(b, e.cs.StartMCIAPIServer(ctx, reader))
		byRes := minus(before.requests, after.requests)
		kp, s := split(byRes)
		p := servedBefore - servedAfter
		logf("watches of %s (%s mode) on cluster-a: kube-apiserver requests %v, served by cluster-a's mci-apiserver %+.0f", reader, mode, byRes, p)
		results.fact(fmt.Sprintf("%s.%s", mode, factWatchesStorage), s)
		results.fact(fmt.Sprintf("%s.%s", mode, factWatchesProxied), p)
		note := fmt.Sprintf("%s's mci-apiserver stopped: cluster-a's kube-apiserver WATCH requests by resource: %s (%.0f of them in mci's group); proxied to and served by cluster-a's mci-apiserver: %.0f", reader, formatCounts(byRes), kp, p)
		if mode == modeSummary {
			results.check(sec, fmt.Sprintf("%d clusters, %s mode: storage watches of one remote replica on a member", n, mode), "watches", s, "0", s == 0, note)
			results.check(sec, fmt.Sprintf("%d clusters, %s mode: proxied watches of one remote replica on a member", n, mode), "watches", p, "<= 2", p <= 2, note)
		} else {
			results.add(sec, fmt.Sprintf("%d clusters, %s mode: storage watches of one remote replica on a member", n, mode), "watches", s, note)
		}
		e.waitWatchesBack(b, func() float64 { x, y := split(before.requests); return x + y }())
	}
}

func formatCounts(m map[string]float64) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %+.0f", strings.SplitN(k, ".", 2)[0], v))
	}
	if len(parts) == 0 {
		return "none"
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
