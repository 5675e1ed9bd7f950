package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/waitfor"
)

// TestSidecarKeepsItsTableAndSaysSoWhileItCannotWatchImports runs the
// sidecar data path (loopback blocks 127.0.211-213.x) and stops every
// replica of cluster-b's mci-apiserver, as when they all crash or are cut
// off: the aggregated API of InferencePoolImports then answers 503 to the
// sidecar's informer, which pkg/informerhealth retries every second at
// most. The sidecar says so once, in one log line and
// mci_sidecar_watch_reachable going to 0 (mci_sidecar_watch_failures_total
// +1), however many times the list or watch is tried; requests meanwhile are routed on the last table; once the
// mci-apiserver is back, the gauge returns to 1 and one line says for how
// long the watch was lost. The exporting clusters' mci-epp report their
// informers' mci_epp_watch_reachable too.
func TestSidecarKeepsItsTableAndSaysSoWhileItCannotWatchImports(t *testing.T) {
	const (
		imports  = "inferencepoolimports.inference.networking.x-k8s.io"
		services = "services"
	)
	// Verbosity 3 keeps the reflector's "Listing and watching" line of
	// every list and watch, and informerhealth's line of every call it
	// tries again, to count the attempts.
	logs := &capturedLogs{}
	logger := funcr.New(func(_, args string) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		logs.lines = append(logs.lines, args)
	}, funcr.Options{Verbosity: 3})
	s := newSidecarSetupWith(t, "e2e-watch-health", sidecarOptions{blockA: 211, blockC: 213, sidecarIP: "127.0.212.1", logger: &logger})
	ctx := t.Context()
	s.expect(t, "the import is routed", http.StatusOK)
	s.waitWatch(t, imports, 1, 15*time.Second)
	// The exporting clusters' mci-epp (Kubernetes mode) report their
	// informers the same way.
	for name, e := range s.epps {
		v, err := e.eppSeries(ctx, "mci_epp_watch_reachable", `resource="inferencepools.inference.networking.k8s.io"`)
		require.NoError(t, err)
		assert.Equal(t, 1.0, v, "%s's mci-epp watches its InferencePool", name)
	}
	failuresBefore := s.watchSeries(t, "mci_sidecar_watch_failures_total", imports)
	tableBefore := s.sidecar.Router().Table()
	attemptsOfImports := func() int {
		return logs.count("Listing and watching", "InferencePoolImport") + logs.count("No server answers the list or watch", imports)
	}
	attemptsBefore := attemptsOfImports()

	require.NoError(t, clusters.StopMCIAPIServer("cluster-b"))
	stopped := time.Now()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			assert.NoError(t, clusters.StartMCIAPIServer(context.Background(), "cluster-b"), "restarting cluster-b's mci-apiserver")
		}
	})
	s.waitWatch(t, imports, 0, 30*time.Second)
	t.Logf("mci_sidecar_watch_reachable of imports is 0 %s after cluster-b's mci-apiserver stopped", time.Since(stopped).Round(time.Millisecond))

	// The outage lasts until the imports' list or watch has been tried
	// three times (at most 1.5 s apart); requests are routed on the last
	// table meanwhile.
	var served, attempts int
	for attempts < 3 {
		require.Less(t, time.Since(stopped), 30*time.Second, "the imports were tried %d times in 30s of outage, want several", attempts)
		code, _, err := s.try(ctx)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "a request while the imports cannot be watched")
		served++
		time.Sleep(200 * time.Millisecond) // paces the requests; not a wait
		attempts = attemptsOfImports() - attemptsBefore
	}
	assert.Equal(t, tableBefore.Generation, s.sidecar.Router().Table().Generation, "the table is the last one built before the loss")
	assert.Equal(t, 1, logs.count("Cannot list or watch a resource", imports), "one log line for the loss, for %d list-and-watch attempts", attempts)
	assert.Equal(t, failuresBefore+1, s.watchSeries(t, "mci_sidecar_watch_failures_total", imports))
	assert.Equal(t, 1.0, s.watchSeries(t, "mci_sidecar_watch_reachable", services), "the kube-apiserver's resources stay reachable")
	t.Logf("%d requests routed during the outage, %d list-and-watch attempts of imports, one log line", served, attempts)

	require.NoError(t, clusters.StartMCIAPIServer(ctx, "cluster-b"))
	restarted = true
	back := time.Now()
	// The aggregator answers once it sees the APIService available again;
	// the next try follows within 1.5 s.
	s.waitWatch(t, imports, 1, 90*time.Second)
	t.Logf("mci_sidecar_watch_reachable of imports is 1 %s after cluster-b's mci-apiserver was Available again", time.Since(back).Round(time.Millisecond))
	// The tracker sets the gauge, then logs the recovery.
	waitfor.Eventually(t, ctx, 5*time.Second, func(context.Context) (bool, string) {
		n := logs.count("Listing and watching a resource again", imports, "failedFor")
		return n > 0, "no log line for the recovery"
	})
	assert.Equal(t, 1, logs.count("Listing and watching a resource again", imports, "failedFor"))
	assert.Equal(t, 1, logs.count("Cannot list or watch a resource", imports), "no more loss lines")
	assert.Equal(t, failuresBefore+1, s.watchSeries(t, "mci_sidecar_watch_failures_total", imports))
	s.expect(t, "the import is routed after the recovery", http.StatusOK)
	for _, l := range logs.matching(imports) {
		t.Logf("sidecar log: %s", l)
	}
}

// matching returns the lines that contain part.
func (c *capturedLogs) matching(part string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		if strings.Contains(l, part) {
			out = append(out, l)
		}
	}
	return out
}

// waitWatch waits until the sidecar's mci_sidecar_watch_reachable of
// resource is want.
func (s *sidecarSetup) waitWatch(t *testing.T, resource string, want float64, timeout time.Duration) {
	t.Helper()
	waitfor.Eventually(t, t.Context(), timeout, func(ctx context.Context) (bool, string) {
		v, err := s.series(ctx, "mci_sidecar_watch_reachable", resource)
		return err == nil && v == want, fmt.Sprintf("mci_sidecar_watch_reachable{resource=%q} = %v (err=%v), want %v", resource, v, err, want)
	})
}

// watchSeries reads the sidecar's series name{resource=...}.
func (s *sidecarSetup) watchSeries(t *testing.T, name, resource string) float64 {
	t.Helper()
	v, err := s.series(t.Context(), name, resource)
	require.NoError(t, err)
	return v
}

// series reads the value of name{resource="resource"} on the sidecar's
// /metrics.
func (s *sidecarSetup) series(ctx context.Context, name, resource string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := promtext.Get(ctx, "http://"+s.sidecar.MetricsAddr()+"/metrics")
	if err != nil {
		return 0, err
	}
	series := fmt.Sprintf("%s{resource=%q}", name, resource)
	v, found, err := m.Lookup(series)
	if err == nil && !found {
		err = fmt.Errorf("no series %s", series)
	}
	return v, err
}
