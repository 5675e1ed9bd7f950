package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/sidecar"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/waitfor"
)

// These tests put faults on the link from mci-sidecar to one EPP
// (ClusterSet.EPPLink) while requests run through the data path of `make
// run`: the mci-sidecar, mci-epp, simulator and gateway binaries, cluster-b
// the gateway's cluster, cluster-a and cluster-c exporting the pool. The
// sidecar runs with its defaults (HealthBased, FailClose, a 2s attempt
// timeout, health checks every 1s with a 500ms timeout), and the tests
// check what pkg/sidecar's documentation says of them. Loopback blocks
// 127.0.191-193.x are theirs.

const eppLinkBlock = 191

// eppLinkTokenTime is the simulators' decode time per output token: a
// streamed answer of streamTokens tokens lasts about 2s, long enough to
// stall its link mid-stream.
const (
	eppLinkTokenTime = 20 * time.Millisecond
	streamTokens     = 100
)

// eppLinkSet is the data path with links, and what the tests read of its
// sidecar: its metrics and its log.
type eppLinkSet struct {
	cs         *localclusterset.ClusterSet
	dp         *localclusterset.DataPath
	metricsURL string
	sidecarLog string
}

// served is one request through the gateway: its status, the cluster
// whose model server answered, how long it took in all and to the first
// byte of the body, and whether a streamed body ended as it should.
type served struct {
	start     time.Time
	code      int
	cluster   string
	took      time.Duration
	firstByte time.Duration
	complete  bool
	err       error
}

func (s served) String() string {
	return fmt.Sprintf("%d from %q in %s (first byte %s, complete %v, err %v)", s.code, s.cluster, s.took.Round(time.Millisecond), s.firstByte.Round(time.Millisecond), s.complete, s.err)
}

func startEPPLinkSet(t *testing.T) *eppLinkSet {
	t.Helper()
	cs := startClusterSet(t, "mci-e2e-epplinks-", localclusterset.Options{
		Clusters: []string{"cluster-a", "cluster-b", "cluster-c"},
		Links:    true,
	})
	start := time.Now()
	dp, err := cs.StartDataPath(t.Context(), localclusterset.DataPathOptions{
		BinDir:        dataPathBinaries(t),
		LoopbackBlock: eppLinkBlock,
		ModelServers:  1,
		Log:           testWriter{t},
		SimulatorArgs: func(string) []string {
			return []string{"--cost-model", "--prefill-base=2ms", "--decode-per-token=" + eppLinkTokenTime.String(), "--stream-chunk-tokens=5"}
		},
	})
	require.NoError(t, err)
	t.Logf("data path with EPP links up in %s", time.Since(start).Round(time.Millisecond))
	u, err := url.Parse(dp.GatewayURL)
	require.NoError(t, err)
	s := &eppLinkSet{cs: cs, dp: dp, metricsURL: "http://" + net.JoinHostPort(u.Hostname(), "9090") + "/metrics"}
	for _, srv := range cs.DataPathServers() {
		if srv.Name == dp.GatewayCluster+"-mci-sidecar" {
			s.sidecarLog = srv.Log
		}
	}
	require.NotEmpty(t, s.sidecarLog, "the sidecar's log")
	return s
}

// dataPathBinaries returns a directory with what StartDataPath runs:
// mci-epp and mci-sidecar of MCI_BIN_DIR (`make build`), and the test's
// simulator and gateway built from the current source, which `make build`
// does not build.
func dataPathBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []string{"mci-epp", "mci-sidecar"} {
		require.NoError(t, os.Symlink(binary(t, b), filepath.Join(dir, b)))
	}
	out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/mci-dev/mci/test/cmd/simulator", "github.com/mci-dev/mci/test/cmd/gateway").CombinedOutput()
	require.NoError(t, err, "building the test servers: %s", out)
	return dir
}

// send sends one completion request of maxTokens output tokens through the
// gateway, streamed or not, and reads its answer whole.
func (s *eppLinkSet) send(ctx context.Context, maxTokens int, stream bool) served {
	return s.sendNotifying(ctx, maxTokens, stream, func() {})
}

// sendNotifying is send that calls started once the first byte of the
// body is in (the request phase and the response headers went through
// the EPP), or once the request has failed before it.
func (s *eppLinkSet) sendNotifying(ctx context.Context, maxTokens int, stream bool, started func()) served {
	var once sync.Once
	defer once.Do(started)
	out := served{start: time.Now()}
	body, _ := json.Marshal(map[string]any{"model": s.dp.Model, "prompt": "Say hello", "max_tokens": maxTokens, "stream": stream})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.dp.CompletionURL(), bytes.NewReader(body))
	if err != nil {
		out.err = err
		return out
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := noProxyClient.Do(req)
	if err != nil {
		out.err, out.took = err, time.Since(out.start)
		return out
	}
	defer func() { _ = resp.Body.Close() }()
	out.code = resp.StatusCode
	out.cluster, _, _ = strings.Cut(resp.Header.Get("X-Simulator-Instance"), "/")
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 && got.Len() == 0 {
			out.firstByte = time.Since(out.start)
			once.Do(started)
		}
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			out.err = err
			break
		}
	}
	out.took = time.Since(out.start)
	if stream {
		out.complete = out.err == nil && bytes.Contains(got.Bytes(), []byte("data: [DONE]"))
	} else {
		out.complete = out.err == nil && json.Valid(got.Bytes())
	}
	return out
}

// sendFor sends short requests one after the other for d, each waiting for
// the last, and returns them.
func (s *eppLinkSet) sendFor(ctx context.Context, d time.Duration) []served {
	var out []served
	for end := time.Now().Add(d); time.Now().Before(end); {
		out = append(out, s.send(ctx, 1, false))
	}
	return out
}

// metric reads one series of the sidecar's /metrics ("name{labels}");
// 0 when absent.
func (s *eppLinkSet) metric(t *testing.T, ctx context.Context, series string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := promtext.Get(ctx, s.metricsURL)
	require.NoError(t, err)
	v, _, err := m.Lookup(series)
	require.NoError(t, err)
	return v
}

// logLines returns the sidecar's log lines that contain every one of
// parts.
func (s *eppLinkSet) logLines(t *testing.T, parts ...string) []string {
	t.Helper()
	b, err := os.ReadFile(s.sidecarLog)
	require.NoError(t, err)
	var out []string
next:
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// unreachableLogged returns the lines the sidecar logged at level 0 (as
// errors: klog's "E" lines; the data path's sidecar runs at -v=2), since
// it had logged before of them, that say cluster's EPP cannot be reached.
func (s *eppLinkSet) unreachableLogged(t *testing.T, cluster string, before int) []string {
	t.Helper()
	var out []string
	for _, l := range s.logLines(t, "EPP port unreachable", eppHost(s.dp.EPPs[cluster])) {
		if strings.HasPrefix(l, "E") {
			out = append(out, l)
		}
	}
	return out[before:]
}

// responseOutcomes reads mci_sidecar_epp_response_phase_total of cluster
// by outcome.
func (s *eppLinkSet) responseOutcomes(t *testing.T, ctx context.Context, cluster string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, o := range []string{sidecar.ResponseCompleted, sidecar.ResponseCanceled, sidecar.ResponseImmediate, sidecar.ResponseFailed, sidecar.ResponseTimeout, sidecar.ResponseEnded} {
		out[o] = s.metric(t, ctx, fmt.Sprintf(`mci_sidecar_epp_response_phase_total{cluster=%q,outcome=%q}`, cluster, o))
	}
	return out
}

// since is what changed from before to now, leaving out what did not.
func since(before, now map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range now {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// settle waits until the sidecar holds no stream, to the gateway or to an
// EPP, and its goroutines are back to the baseline, and says how long it
// took: whatever a fault did, nothing leaks.
func (s *eppLinkSet) settle(t *testing.T, ctx context.Context, baseline float64) {
	t.Helper()
	start := time.Now()
	var streams, eppStreams, goroutines float64
	waitfor.Eventually(t, ctx, 20*time.Second, func(ctx context.Context) (bool, string) {
		streams = s.metric(t, ctx, "mci_sidecar_ext_proc_streams")
		eppStreams = s.metric(t, ctx, "mci_sidecar_epp_streams")
		goroutines = s.metric(t, ctx, "go_goroutines")
		return streams == 0 && eppStreams == 0 && goroutines <= baseline+leakSlack,
			fmt.Sprintf("gateway streams %v, EPP streams %v, goroutines %v (baseline %v)", streams, eppStreams, goroutines, baseline)
	})
	t.Logf("settled in %s: gateway streams %v, EPP streams %v, goroutines %v (baseline %v)", time.Since(start).Round(time.Millisecond), streams, eppStreams, goroutines, baseline)
}

// leakSlack is how many goroutines above the baseline the sidecar may
// keep: gRPC's and net/http's idle workers come and go.
const leakSlack = 8

// firstFrom sends short requests until one is served by cluster and
// returns how long that took.
func (s *eppLinkSet) firstFrom(t *testing.T, ctx context.Context, cluster string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var last served
	for time.Since(start) < within {
		last = s.send(ctx, 1, false)
		require.Equal(t, http.StatusOK, last.code, "%s", last)
		if last.cluster == cluster {
			return time.Since(start)
		}
	}
	t.Fatalf("no request was served by %s within %s of the heal (last: %s)", cluster, within, last)
	return 0
}

// eppHost is the address of an EPP without its port: the sidecar logs
// its ext_proc, health and metrics ports alike.
func eppHost(addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	return host
}

func failed(rs []served) []served {
	var out []served
	for _, r := range rs {
		if r.code != http.StatusOK || !r.complete {
			out = append(out, r)
		}
	}
	return out
}

func longest(rs []served) time.Duration {
	var d time.Duration
	for _, r := range rs {
		d = max(d, r.took)
	}
	return d
}

func byCluster(rs []served) map[string]int {
	out := map[string]int{}
	for _, r := range rs {
		out[r.cluster]++
	}
	return out
}

// lastFrom is when the last request served by cluster started, relative
// to from; 0 when none was.
func lastFrom(rs []served, cluster string, from time.Time) time.Duration {
	var d time.Duration
	for _, r := range rs {
		if r.cluster == cluster {
			d = max(d, r.start.Sub(from))
		}
	}
	return d
}

// The failures of cluster-a's EPP ports, as the sidecar counts them.
const (
	healthFailures = `mci_sidecar_epp_connection_failures_total{cluster="cluster-a",port="health",transport="plaintext"}`
	relayFailures  = `mci_sidecar_epp_connection_failures_total{cluster="cluster-a",port="ext-proc",transport="plaintext"}`
)

func TestEPPLinkFaults(t *testing.T) {
	s := startEPPLinkSet(t)
	ctx := t.Context()
	link, err := s.cs.EPPLink("cluster-a")
	require.NoError(t, err)
	t.Cleanup(func() { _ = link.Heal() })

	// Warm up: both clusters serve (HealthBased takes turns among serving
	// clusters), so that both EPP connections are in the baseline.
	warm := s.sendFor(ctx, 2*time.Second)
	require.Empty(t, failed(warm))
	require.Equal(t, []string{"cluster-a", "cluster-c"}, slices.Sorted(maps.Keys(byCluster(warm))), "both clusters serve before the faults: %v", byCluster(warm))
	normal := longest(warm)
	// The baseline is taken once no stream is open (no bound on
	// goroutines yet).
	s.settle(t, ctx, math.Inf(1))
	baseline := s.metric(t, ctx, "go_goroutines")
	t.Logf("baseline: %d requests, longest %s, served %v, sidecar goroutines %v", len(warm), normal.Round(time.Millisecond), byCluster(warm), baseline)

	attempt := sidecar.DefaultAttemptTimeout
	probe := eppprobe.DefaultHealthInterval + eppprobe.DefaultHealthTimeout
	// healBound: a healed EPP serves again once its connections are back
	// (reconnect backoff at most 1s) and its next probe answers SERVING.
	const healBound = 5 * time.Second

	t.Run("an EPP behind a 1s link is probed out and its cluster's requests go to the other", func(t *testing.T) {
		outcomesBefore := s.responseOutcomes(t, ctx, "cluster-a")
		logsBefore := len(s.unreachableLogged(t, "cluster-a", 0))
		probeFailuresBefore := s.metric(t, ctx, healthFailures)
		require.NoError(t, link.Latency(time.Second, 0))
		faultAt := time.Now()
		rs := s.sendFor(ctx, 8*time.Second)
		assert.Empty(t, failed(rs), "no request fails behind a slow link")
		var slow []time.Duration
		for _, r := range rs {
			if r.cluster == "cluster-a" {
				slow = append(slow, r.took)
			}
		}
		leftAfter := lastFrom(rs, "cluster-a", faultAt)
		outcomes := since(outcomesBefore, s.responseOutcomes(t, ctx, "cluster-a"))
		logs := s.unreachableLogged(t, "cluster-a", logsBefore)
		t.Logf("1s link: %d requests %v, longest %s; those served by cluster-a took %v, their response phases %v; the last one to cluster-a started %s after the fault; unreachable logged %d times: %q",
			len(rs), byCluster(rs), longest(rs).Round(time.Millisecond), slow, outcomes, leftAfter.Round(time.Millisecond), len(logs), logs)
		// Each of cluster-a's answers (request phase; response headers and
		// the streamed body, answered together) comes 1s late, each within
		// the attempt timeout: such a request is slow, not failed, and its
		// EPP sees its response through.
		for _, d := range slow {
			assert.Greater(t, d, time.Second, "a request served over the 1s link pays its latency")
		}
		// The EPP answers every response message in time. The end of its
		// stream comes 1s after the gateway ended its own, when the test
		// gateway (test/envoyclient's Exchange.Close lingers 1s) has reset
		// the stream already: the response phase was complete all the
		// same.
		assert.Equal(t, map[string]float64{sidecar.ResponseCompleted: float64(len(slow))}, outcomes, "the slow EPP answers every response phase in time")
		// The health check (500ms timeout) cannot answer over the link:
		// HealthBased leaves cluster-a at its next probe.
		assert.Less(t, leftAfter, probe+attempt+time.Second, "cluster-a is left once its probe times out")
		assert.Equal(t, 0.0, s.metric(t, ctx, `mci_sidecar_epp_healthy{cluster="cluster-a",pool="demo/llm-pool"}`), "cluster-a's EPP is reported not serving")
		assert.Greater(t, byCluster(rs)["cluster-c"], len(rs)/2, "the other cluster takes the traffic")
		assert.NotEmpty(t, logs, "the EPP whose probes time out is logged")
		assert.Positive(t, s.metric(t, ctx, healthFailures)-probeFailuresBefore, "and its probes that time out are counted")
		assert.Less(t, len(logs), 4, "once per change, not once per probe")

		require.NoError(t, link.Heal())
		t.Logf("1s link healed: cluster-a serves again %s later", s.firstFrom(t, ctx, "cluster-a", healBound).Round(time.Millisecond))
		s.settle(t, ctx, baseline)
	})

	t.Run("an EPP whose connections reset fails over at once", func(t *testing.T) {
		failuresBefore := s.metric(t, ctx, `mci_sidecar_epp_failures_total{cluster="cluster-a"}`)
		logsBefore := len(s.unreachableLogged(t, "cluster-a", 0))
		require.NoError(t, link.ResetPeer(0))
		faultAt := time.Now()
		rs := s.sendFor(ctx, 6*time.Second)
		assert.Empty(t, failed(rs), "a reset EPP's requests fail over to the other cluster")
		assert.Less(t, longest(rs), attempt, "failing over from a reset does not wait for the attempt timeout")
		assert.Zero(t, byCluster(rs)["cluster-a"], "no request is served through a link that resets")
		failures := s.metric(t, ctx, `mci_sidecar_epp_failures_total{cluster="cluster-a"}`) - failuresBefore
		logs := s.unreachableLogged(t, "cluster-a", logsBefore)
		t.Logf("reset link: %d requests %v, longest %s (baseline %s); %v requests failed over from cluster-a; cluster-a left %s after the fault; unreachable logged %d times: %q",
			len(rs), byCluster(rs), longest(rs).Round(time.Millisecond), normal.Round(time.Millisecond), failures, lastFrom(rs, "cluster-a", faultAt), len(logs), logs)
		assert.NotEmpty(t, logs, "the unreachable EPP is logged")
		assert.LessOrEqual(t, len(logs), 4, "once per port and gRPC code, not once per probe, request or message")

		require.NoError(t, link.Heal())
		t.Logf("reset link healed: cluster-a serves again %s later", s.firstFrom(t, ctx, "cluster-a", healBound).Round(time.Millisecond))
		s.settle(t, ctx, baseline)
	})

	// inFlight starts n streamed requests, 50ms apart, and returns once
	// each has its first tokens: the request phase and the response
	// headers answered by its EPP.
	inFlight := func(t *testing.T, n int) (streams []served, wait func()) {
		t.Helper()
		streams = make([]served, n)
		var done, started sync.WaitGroup
		for i := range n {
			done.Add(1)
			started.Add(1)
			go func() {
				defer done.Done()
				streams[i] = s.sendNotifying(ctx, streamTokens, true, started.Done)
			}()
			// Pacing, not waiting: the streams arrive one after the
			// other, as separate clients' would.
			time.Sleep(50 * time.Millisecond)
		}
		allStarted := make(chan struct{})
		go func() { started.Wait(); close(allStarted) }()
		select {
		case <-allStarted:
		case <-time.After(10 * time.Second):
			t.Fatalf("the %d streams had not all had their first tokens within 10s", n)
		}
		return streams, done.Wait
	}
	streamed := streamTokens * eppLinkTokenTime

	t.Run("an EPP that stalls mid-stream: the responses go on, new requests fail over", func(t *testing.T) {
		outcomesBefore := s.responseOutcomes(t, ctx, "cluster-a")
		logsBefore := len(s.unreachableLogged(t, "cluster-a", 0))
		relayFailuresBefore := s.metric(t, ctx, relayFailures)
		streams, wait := inFlight(t, 4)
		require.NoError(t, link.Blackhole())
		stallAt := time.Now()
		rs := s.sendFor(ctx, 6*time.Second)
		wait()

		onA := 0
		for _, r := range streams {
			assert.Equal(t, http.StatusOK, r.code, "%s", r)
			assert.True(t, r.complete, "a stream whose EPP stalled goes on to its end: %s", r)
			if r.cluster == "cluster-a" {
				onA++
				// Its EPP does not stream the body back: the sidecar waits
				// for it the attempt timeout once the body has ended, then
				// answers the rest itself.
				assert.Less(t, r.took, streamed+attempt+2*time.Second, "the stall costs at most the attempt timeout: %s", r)
			}
		}
		// Each response phase on cluster-a is counted once, as a timeout,
		// or, when its EPP still got to answer it whole, as completed:
		// under load (stress-ng on both cores) about one run in four
		// counted one of its two streams completed with no takeover
		// logged, that is, with every answer of its EPP back; the race of
		// a stalled EPP's linger with the gateway's reset, which made a
		// stall look completed, is pinned by pkg/sidecar's unit test
		// (an EPP that stalls until the linger, as the gateway resets).
		outcomes := since(outcomesBefore, s.responseOutcomes(t, ctx, "cluster-a"))
		require.Positive(t, onA, "streams went to cluster-a, whose link stalls")
		assert.Positive(t, outcomes[sidecar.ResponseTimeout], "a stalled response phase is counted as a timeout: %v", outcomes)
		assert.Equal(t, float64(onA), outcomes[sidecar.ResponseTimeout]+outcomes[sidecar.ResponseCompleted], "each response phase on cluster-a is counted once: %v", outcomes)
		others := maps.Clone(outcomes)
		delete(others, sidecar.ResponseTimeout)
		delete(others, sidecar.ResponseCompleted)
		assert.Empty(t, others, "no response phase failed, was canceled or ended early")

		assert.Empty(t, failed(rs), "requests during the stall fail over")
		assert.Less(t, longest(rs), attempt+normal+time.Second, "a request whose EPP stalls waits the attempt timeout, then fails over")
		var waited int
		for _, r := range rs {
			if r.took > attempt {
				waited++
			}
		}
		logs := s.unreachableLogged(t, "cluster-a", logsBefore)
		t.Logf("stalled link: %d streams in flight, %d on cluster-a, response phases %v: %v; %d new requests %v, longest %s, %d waited the %s attempt timeout; cluster-a left %s after the stall; unreachable logged %d times: %q",
			len(streams), onA, outcomes, streams, len(rs), byCluster(rs), longest(rs).Round(time.Millisecond), waited, attempt, lastFrom(rs, "cluster-a", stallAt), len(logs), logs)
		assert.Zero(t, byCluster(rs)["cluster-a"], "no new request is served through a stalled link")
		assert.NotEmpty(t, logs, "the EPP that cannot be reached is logged")
		assert.Equal(t, float64(waited), s.metric(t, ctx, relayFailures)-relayFailuresBefore, "each attempt that timed out is counted")
		assert.LessOrEqual(t, len(logs), 4, "once per port and gRPC code, not once per probe or request")

		require.NoError(t, link.Heal())
		t.Logf("stalled link healed: cluster-a serves again %s later", s.firstFrom(t, ctx, "cluster-a", healBound).Round(time.Millisecond))
		s.settle(t, ctx, baseline)
	})

	t.Run("an EPP whose answers are cut mid-message: the responses go on, new requests fail over", func(t *testing.T) {
		outcomesBefore := s.responseOutcomes(t, ctx, "cluster-a")
		failuresBefore := s.metric(t, ctx, `mci_sidecar_epp_failures_total{cluster="cluster-a"}`)
		streams, wait := inFlight(t, 4)
		// Each connection of the link closes once the EPP has sent 1500
		// more bytes over it: in the middle of a streamed body's answers,
		// or of a later request's.
		require.NoError(t, link.LimitData(1500))
		rs := s.sendFor(ctx, 6*time.Second)
		wait()

		onA := 0
		for _, r := range streams {
			assert.Equal(t, http.StatusOK, r.code, "%s", r)
			assert.True(t, r.complete, "a stream whose EPP's connection was cut goes on to its end: %s", r)
			if r.cluster == "cluster-a" {
				onA++
				assert.Less(t, r.took, streamed+attempt+2*time.Second, "%s", r)
			}
		}
		outcomes := since(outcomesBefore, s.responseOutcomes(t, ctx, "cluster-a"))
		failures := s.metric(t, ctx, `mci_sidecar_epp_failures_total{cluster="cluster-a"}`) - failuresBefore
		t.Logf("cut link: %d streams in flight, %d on cluster-a: %v; %d new requests %v, longest %s; cluster-a's response phases %v; %v requests failed over from cluster-a",
			len(streams), onA, streams, len(rs), byCluster(rs), longest(rs).Round(time.Millisecond), outcomes, failures)
		assert.Empty(t, failed(rs), "requests whose EPP's answer is cut fail over, or the sidecar answers the rest of their response phase")
		assert.Less(t, longest(rs), attempt+normal+time.Second, "nothing waits longer than the attempt timeout")
		assert.Zero(t, outcomes[sidecar.ResponseTimeout]+outcomes[sidecar.ResponseEnded], "a cut connection fails the response phase at once: %v", outcomes)

		require.NoError(t, link.Heal())
		t.Logf("cut link healed: cluster-a serves again %s later", s.firstFrom(t, ctx, "cluster-a", healBound).Round(time.Millisecond))
		s.settle(t, ctx, baseline)
	})

	t.Run("a control-plane partition from every exporter leaves the data plane serving", func(t *testing.T) {
		// cluster-b's mci-apiservers lose both members that export the
		// pool while their EPPs and model servers answer: the import
		// flags both ClusterUnreachable and keeps their last known EPPs,
		// and the sidecar routes to those, stale, as no reachable cluster
		// is left.
		b := clientsIn(t, s.cs, "cluster-b")
		problem := func(cluster string) int {
			return len(s.logLines(t, "Routing table problem", "unreachable from mci-apiserver", cluster))
		}
		problemsBefore := map[string]int{"cluster-a": problem("cluster-a"), "cluster-c": problem("cluster-c")}
		unreachableNow := func(cluster string) int { return problem(cluster) - problemsBefore[cluster] }
		var links []*localclusterset.Link
		for _, member := range []string{"cluster-a", "cluster-c"} {
			l, err := s.cs.MemberLink("cluster-b", member)
			require.NoError(t, err)
			links = append(links, l)
			l.Cut()
		}
		defer func() {
			for _, l := range links {
				_ = l.Heal()
			}
		}()
		cut := time.Now()
		unreachable := func(ctx context.Context) (bool, string) {
			imp, err := b.mci.InferenceV1alpha1().InferencePoolImports(s.dp.Namespace).Get(ctx, s.dp.Pool, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			n := 0
			for _, c := range imp.Status.Clusters {
				if r := apimeta.FindStatusCondition(c.Conditions, v1alpha1.ConditionReady); r != nil && r.Reason == v1alpha1.ReasonClusterUnreachable {
					n++
				}
			}
			return n == 2, fmt.Sprintf("%d of %d clusters flagged ClusterUnreachable", n, len(imp.Status.Clusters))
		}
		waitfor.Eventually(t, ctx, time.Minute, unreachable)
		flagged := time.Since(cut)
		// The sidecar's table follows its watch of the import: it reports
		// each cluster's problem when it has both as stale.
		waitfor.Eventually(t, ctx, 15*time.Second, func(context.Context) (bool, string) {
			a, c := unreachableNow("cluster-a"), unreachableNow("cluster-c")
			return a > 0 && c > 0, fmt.Sprintf("the sidecar reported cluster-a unreachable %d times, cluster-c %d times, since the cut", a, c)
		})
		rs := s.sendFor(ctx, 4*time.Second)
		bad := failed(rs)
		t.Logf("control-plane partition cluster-b -/- cluster-a, cluster-c: both flagged after %s; %d requests %v, longest %s, %d failed",
			flagged.Round(time.Millisecond), len(rs), byCluster(rs), longest(rs).Round(time.Millisecond), len(bad))
		if !assert.Zero(t, len(bad), "the EPPs answer: no request fails for a partition of the control plane") {
			t.Logf("first failed request: %s", bad[0])
		}
		assert.Len(t, byCluster(rs), 2, "both stale clusters take requests: %v", byCluster(rs))
		assert.NotEmpty(t, s.logLines(t, "Routing table problem", "unreachable from mci-apiserver"), "the sidecar says it routes to clusters known from their last data")

		for _, l := range links {
			require.NoError(t, l.Heal())
		}
		waitfor.Eventually(t, ctx, time.Minute, func(ctx context.Context) (bool, string) {
			ok, why := unreachable(ctx)
			return !ok && strings.HasPrefix(why, "0 of"), why
		})
		s.settle(t, ctx, baseline)
	})
}
