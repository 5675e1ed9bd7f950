package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const resyncNS = "resync"

// benchResync restarts, with every importer connected, first cluster-a's
// mci-apiserver (what summary-mode importers read cluster-a through),
// changing cluster-a's export while it is down, then cluster-a's
// kube-apiserver (what every importer reads cluster-a through, the
// summaries proxied by it), changing the export as soon as it is back; and
// times, per importer, until its import through its own aggregator says
// what cluster-a exports. Every importer reconnects to cluster-a at once:
// the second restart is the reconnect storm of a member restart.
func benchResync(b *testing.B, e *env) {
	ctx := context.Background()
	n := len(e.names)
	e.namespaceEverywhere(b, resyncNS)
	_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(resyncNS).Create(ctx, pool(resyncNS, "resync", true), metav1.CreateOptions{})
	require.NoError(b, err)
	importers := e.names[1:]
	listed := func(want bool) func(string) bool {
		return func(c string) bool { return e.listsClusterA(ctx, c, resyncNS, "resync") == want }
	}
	if _, missing := untilAll(importers, time.Now(), listed(true)); len(missing) > 0 {
		logf("resync: importers %v never listed cluster-a's pool before the restarts", missing)
	}
	setExport := func(on bool) {
		_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(resyncNS).Patch(ctx, "resync", types.MergePatchType, exportPatch(on), metav1.PatchOptions{})
		require.NoError(b, err)
	}
	const sec = "member restart"

	// 1. cluster-a's mci-apiserver.
	served := e.mciWatchesServed(b, "cluster-a")
	require.NoError(b, e.cs.StopMCIAPIServer("cluster-a"))
	changed := time.Now()
	setExport(false)
	t0 := time.Now()
	require.NoError(b, e.cs.StartMCIAPIServer(ctx, "cluster-a"))
	ready := time.Now()
	got, missing := untilAll(importers, ready, listed(false))
	var back time.Duration
	_ = pollFor(time.Minute, func() bool {
		back = time.Since(ready)
		return e.mciWatchesServed(b, "cluster-a") >= served
	})
	perMode := byMode(e, got)
	note := fmt.Sprintf("cluster-a's export withdrawn while its mci-apiserver was down; it started in %s; it serves %.0f watches again %s after it was Available; %s",
		ready.Sub(t0).Round(time.Millisecond), served, back.Round(time.Millisecond), missingNote(missing))
	results.check(sec, fmt.Sprintf("%d clusters: mci-apiserver of a member restarted, last summary-mode importer consistent", n), "s", perMode[modeSummary].Seconds(),
		"all importers", len(missing) == 0, note+" (from when the server was Available)")
	results.add(sec, fmt.Sprintf("%d clusters: mci-apiserver of a member restarted, last full-mode importer consistent", n), "s", perMode[modeFull].Seconds(),
		fmt.Sprintf("from when the server was Available; full mode does not read it and follows the change (made %s before) from cluster-a's kube-apiserver", ready.Sub(changed).Round(time.Millisecond)))

	// 2. cluster-a's kube-apiserver: every importer reconnects at once.
	before, storageBefore := split(e.watchCounts(b, "cluster-a").requests)
	require.NoError(b, e.cs.StopAPIServer("cluster-a"))
	t0 = time.Now()
	require.NoError(b, e.cs.StartAPIServer(ctx, "cluster-a"))
	ready = time.Now()
	setExport(true)
	got, missing = untilAll(importers, ready, listed(true))
	var rewatch time.Duration
	_ = pollFor(2*time.Minute, func() bool {
		rewatch = time.Since(ready)
		p, s := split(e.watchCounts(b, "cluster-a").requests)
		return p >= before && s >= storageBefore
	})
	perMode = byMode(e, got)
	note = fmt.Sprintf("restarted in %s; export restored once it was ready; its WATCH requests back to %.0f proxied + %.0f storage %s after it was ready (%d importers reconnecting at once); %s",
		ready.Sub(t0).Round(time.Millisecond), before, storageBefore, rewatch.Round(time.Millisecond), len(importers), missingNote(missing))
	for _, mode := range []string{modeSummary, modeFull} {
		results.check(sec, fmt.Sprintf("%d clusters: kube-apiserver of a member restarted, last %s-mode importer consistent", n, mode), "s", perMode[mode].Seconds(),
			"all importers", len(missing) == 0, note)
	}
}

func missingNote(missing []string) string {
	if len(missing) == 0 {
		return "every importer consistent"
	}
	return fmt.Sprintf("NOT consistent after a minute: %s", strings.Join(missing, ", "))
}
