package sidecar

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/eppprobe"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

var (
	overheadRate     = flag.Int("sidecar.overhead-rate", 2000, "BenchmarkSidecarOverhead: round trips per second, on one path at a time")
	overheadDuration = flag.Duration("sidecar.overhead-duration", 4*time.Second, "BenchmarkSidecarOverhead: sending time per path")
	overheadRounds   = flag.Int("sidecar.overhead-rounds", 8, "BenchmarkSidecarOverhead: interleaved turns per path")
	overheadClients  = flag.Int("sidecar.overhead-clients", 32, "BenchmarkSidecarOverhead: round trips in flight at saturation")
)

// overheadRequest is the request of the overhead benchmarks: a short
// completion for the base model, which the EPP routes without rewriting,
// and its response, which the gateway runs through the response phase
// (headers, then the body in one chunk).
var overheadRequest = envoyclient.Request{
	Path: "/v1/completions",
	Body: []byte(`{"model":"base","prompt":"Write a haiku about GPUs."}`),
	Response: &envoyclient.Response{
		Headers: http.Header{"Content-Type": {"application/json"}},
		Body:    []byte(`{"id":"cmpl-1","object":"text_completion","model":"base","choices":[{"index":0,"text":"Silicon rivers hum","finish_reason":"length"}],"usage":{"prompt_tokens":8,"completion_tokens":4,"total_tokens":12}}`),
	},
}

// The servers of the overhead benchmarks (overheadServer).
const (
	roleEPP       = "epp"
	roleSidecar   = "sidecar"
	roleNullRelay = "null-relay"
	// roleSidecarSkip is the sidecar with ResponsePhaseSkip: the EPP's
	// stream ends with the request phase and the sidecar answers the
	// response phase itself (the behaviour before the response phase was
	// relayed): the baseline of what relaying it costs.
	roleSidecarSkip = "sidecar-skip"
)

// overheadEPPEnv gives the sidecar and null-relay processes the EPP's
// ext_proc address.
const overheadEPPEnv = "MCI_SIDECAR_BENCH_EPP"

// overheadModelEnv gives the server processes of a benchmark its model
// server's address (benchModelAddr).
const overheadModelEnv = "MCI_SIDECAR_BENCH_MODEL"

// benchModelAddr is where the EPP's model server listens, on the port the
// sidecar's import publishes for the pool (8000): in a server process of a
// benchmark, the address the benchmark gave it; in the benchmark's own, one
// of its own (127.91.<pid>), so that benchmarks of other processes on the
// machine do not collide. The sidecar's import publishes its /24, as the
// sidecar checks destinations.
func benchModelAddr() string {
	if addr := os.Getenv(overheadModelEnv); addr != "" {
		return addr
	}
	pid := os.Getpid()
	return fmt.Sprintf("127.91.%d.%d:8000", pid>>8&0xff, pid&0xff)
}

func TestMain(m *testing.M) {
	envoyclient.RunIfChild(func(ctx context.Context, role string, ready func(string)) error {
		srv, release, err := overheadServer(role, os.Getenv(overheadEPPEnv))
		if err != nil {
			return err
		}
		defer release()
		ready(srv.GRPCAddr())
		return srv.Run(ctx)
	})
	os.Exit(m.Run())
}

// BenchmarkSidecarOverhead measures what mci-sidecar adds to a request as a
// gateway sees it: the latency of ext_proc round trips at a fixed rate
// (-sidecar.overhead-rate, 2000/s), sent open-loop from this process, on
// four paths driven in interleaved turns in the same run, each server in a
// process of its own as in a cluster. Every round trip is a whole exchange:
// the request phase, then the response phase (headers, a one-chunk body).
//
//   - direct: to mci-epp;
//   - null-relay: through a relay that pipes the stream to the same EPP and
//     decides nothing, with the sidecar's gRPC plumbing on both sides: the
//     floor of any extra ext_proc hop on this machine;
//   - sidecar: through mci-sidecar, which matches the route, picks the
//     cluster (HealthBased, the EPP probed as in production) and relays
//     both phases to the EPP;
//   - sidecar-skip: the same with --epp-response-phase=Skip: the EPP's
//     stream ends with the request phase and the sidecar answers the
//     response phase itself, as before the response phase was relayed.
//
// Beside the latencies it reports the CPU time of each server process per
// round trip it served, which depends far less than latency on what else
// the machine runs. It ignores b.N: run it with -benchtime 1x.
//
//	go test -run '^$' -bench SidecarOverhead -benchtime 1x ./pkg/sidecar/
//
// MCI_BENCH_CPUPROFILE=<dir> writes a CPU profile of each server process to
// <dir>/<role>.cpu.
func BenchmarkSidecarOverhead(b *testing.B) {
	model := overheadModelEnv + "=" + benchModelAddr()
	eppProc := envoyclient.StartChild(b, roleEPP, model)
	relay := envoyclient.StartChild(b, roleNullRelay, model, overheadEPPEnv+"="+eppProc.Addr)
	side := envoyclient.StartChild(b, roleSidecar, model, overheadEPPEnv+"="+eppProc.Addr)
	skip := envoyclient.StartChild(b, roleSidecarSkip, model, overheadEPPEnv+"="+eppProc.Addr)
	targets := []envoyclient.Target{{Name: "direct", Client: eppProc.Client}, relay.Target, side.Target, skip.Target}
	// Until the EPP has scraped its model server and the sidecar has
	// probed the EPP, some answers are errors: the warm-up does not count.
	envoyclient.Load(context.Background(), envoyclient.LoadOptions{Request: overheadRequest, Rate: 1000, Duration: time.Second}, targets...)

	b.ResetTimer()
	procs := []*envoyclient.Child{eppProc, relay, side, skip}
	var res []*envoyclient.LoadResult
	cpu := cpuOver(b, procs, func() {
		res = envoyclient.Load(context.Background(), envoyclient.LoadOptions{
			Request: overheadRequest, Rate: *overheadRate, Duration: *overheadDuration, Rounds: *overheadRounds,
			Check: checkOverheadAnswer,
		}, targets...)
	})
	b.StopTimer()
	for _, r := range res {
		b.Log(r)
		require.Zero(b, r.Failed, "%s failed round trips", r.Name)
	}
	d, n, s, k := res[0], res[1], res[2], res[3]
	added := func(r *envoyclient.LoadResult, over *envoyclient.LoadResult, p float64) time.Duration {
		return r.Percentile(p) - over.Percentile(p)
	}
	b.Logf("added over direct: null relay p50 %v, p99 %v; sidecar p50 %v, p99 %v; sidecar over null relay: p50 %v, p99 %v",
		added(n, d, .5), added(n, d, .99), added(s, d, .5), added(s, d, .99), added(s, n, .5), added(s, n, .99))
	b.Logf("CPU per round trip: EPP %.0f µs (all paths), null relay %.0f µs, sidecar %.0f µs, sidecar with the response phase skipped %.0f µs",
		cpuPerOp(cpu[0], d.Sent+n.Sent+s.Sent+k.Sent), cpuPerOp(cpu[1], n.Sent), cpuPerOp(cpu[2], s.Sent), cpuPerOp(cpu[3], k.Sent))
	b.Logf("response phase relayed over skipped: sidecar CPU %+.0f µs per round trip, p50 %v, p99 %v",
		cpuPerOp(cpu[2], s.Sent)-cpuPerOp(cpu[3], k.Sent), added(s, k, .5), added(s, k, .99))
	b.ReportMetric(cpuPerOp(cpu[2], s.Sent), "sidecar-cpu-µs/op")
	b.ReportMetric(cpuPerOp(cpu[1], n.Sent), "relay-cpu-µs/op")
	b.ReportMetric(cpuPerOp(cpu[3], k.Sent), "skip-sidecar-cpu-µs/op")
	b.ReportMetric(cpuPerOp(cpu[0], d.Sent+n.Sent+s.Sent+k.Sent), "epp-cpu-µs/op")
	b.ReportMetric(float64(added(s, d, .5).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64(added(s, d, .99).Microseconds()), "added-p99-µs")
	b.ReportMetric(float64(added(n, d, .5).Microseconds()), "relay-added-p50-µs")
	b.ReportMetric(float64(added(n, d, .99).Microseconds()), "relay-added-p99-µs")
	b.ReportMetric(float64(added(s, n, .5).Microseconds()), "over-relay-p50-µs")
	b.ReportMetric(float64(added(s, n, .99).Microseconds()), "over-relay-p99-µs")
	b.ReportMetric(float64(added(k, d, .5).Microseconds()), "skip-added-p50-µs")
	b.ReportMetric(float64(added(k, d, .99).Microseconds()), "skip-added-p99-µs")
	b.ReportMetric(float64(d.Percentile(.99).Microseconds()), "direct-p99-µs")
	b.ReportMetric(s.Rate(), "req/s")
	saturate(b, procs, targets)
}

// saturate measures each path's throughput with -sidecar.overhead-clients
// round trips in flight (a closed loop, the paths in interleaved turns)
// and each server's CPU per round trip there: what the machine serves
// through the sidecar against through the null relay, the floor of an
// extra hop, and straight to the EPP.
func saturate(b *testing.B, procs []*envoyclient.Child, targets []envoyclient.Target) {
	var res []*envoyclient.LoadResult
	cpu := cpuOver(b, procs, func() {
		res = envoyclient.Saturate(context.Background(), envoyclient.SaturateOptions{
			Request: overheadRequest, Clients: *overheadClients, Duration: *overheadDuration, Rounds: *overheadRounds,
			Check: checkOverheadAnswer,
		}, targets...)
	})
	for _, r := range res {
		b.Log("saturated ", r)
		require.Zero(b, r.Failed, "%s failed round trips at saturation", r.Name)
	}
	d, n, s, k := res[0], res[1], res[2], res[3]
	b.Logf("throughput at saturation (%d in flight): direct %.0f/s, null relay %.0f/s (%.2fx), sidecar %.0f/s (%.2fx; %.2fx the null relay's), response phase skipped %.0f/s (%.2fx)",
		*overheadClients, d.Rate(), n.Rate(), n.Rate()/d.Rate(), s.Rate(), s.Rate()/d.Rate(), s.Rate()/n.Rate(), k.Rate(), k.Rate()/d.Rate())
	b.Logf("CPU per round trip at saturation: EPP %.0f µs (all paths), null relay %.0f µs, sidecar %.0f µs, sidecar with the response phase skipped %.0f µs",
		cpuPerOp(cpu[0], d.Sent+n.Sent+s.Sent+k.Sent), cpuPerOp(cpu[1], n.Sent), cpuPerOp(cpu[2], s.Sent), cpuPerOp(cpu[3], k.Sent))
	b.ReportMetric(s.Rate()/d.Rate(), "saturated-sidecar/direct")
	b.ReportMetric(n.Rate()/d.Rate(), "saturated-relay/direct")
	b.ReportMetric(s.Rate()/n.Rate(), "saturated-sidecar/relay")
	b.ReportMetric(cpuPerOp(cpu[2], s.Sent), "saturated-sidecar-cpu-µs/op")
	b.ReportMetric(cpuPerOp(cpu[1], n.Sent), "saturated-relay-cpu-µs/op")
}

// cpuPerOp is cpu per round trip of sent, in µs.
func cpuPerOp(cpu time.Duration, sent int) float64 {
	return float64(cpu.Microseconds()) / float64(sent)
}

// cpuOver is the CPU time each process used while run ran.
func cpuOver(b *testing.B, procs []*envoyclient.Child, run func()) []time.Duration {
	cpu := make([]time.Duration, len(procs))
	for i, p := range procs {
		cpu[i] = p.CPU(b)
	}
	run()
	for i, p := range procs {
		cpu[i] = p.CPU(b) - cpu[i]
	}
	return cpu
}

// checkOverheadAnswer accepts a round trip routed by the EPP whose
// response came back whole.
func checkOverheadAnswer(res *envoyclient.Result) error {
	switch {
	case res.Immediate != nil:
		return fmt.Errorf("immediate response %d: %s", res.Immediate.StatusCode, res.Immediate.Body)
	case res.Destination == "":
		return errors.New("no destination")
	case res.Response == nil || res.Response.Immediate != nil:
		return fmt.Errorf("no response passed on: %+v", res.Response)
	case string(res.Response.Body) != string(overheadRequest.Response.Body):
		return fmt.Errorf("the response body changed: %q", res.Response.Body)
	}
	return nil
}

// BenchmarkSidecarRoundTrip is one ext_proc round trip at a time on each
// path of BenchmarkSidecarOverhead, every server in this process, for
// profiles and allocation counts: what the sidecar allocates per request is
// the difference between its allocs/op and direct's.
//
//	go test -run '^$' -bench SidecarRoundTrip -benchmem ./pkg/sidecar/ [-cpuprofile cpu.out -memprofile mem.out]
func BenchmarkSidecarRoundTrip(b *testing.B) {
	eppAddr := serveInProcess(b, roleEPP, "")
	for _, role := range []string{"direct", roleNullRelay, roleSidecar, roleSidecarSkip} {
		addr := eppAddr
		if role != "direct" {
			addr = serveInProcess(b, role, eppAddr)
		}
		client, err := envoyclient.Dial(addr, envoyclient.Options{})
		require.NoError(b, err)
		b.Cleanup(func() { _ = client.Close() })
		// The EPP answers 503 until it has scraped its model server, and
		// the sidecar tries its cluster only once the probe has seen it
		// serving or not.
		require.Eventually(b, func() bool {
			res, err := client.Do(context.Background(), overheadRequest)
			return err == nil && res.Destination != "" && res.Response != nil
		}, 10*time.Second, 10*time.Millisecond)
		b.Run(role, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := client.Do(context.Background(), overheadRequest)
				if err != nil || res.Destination == "" || res.Response == nil {
					b.Fatalf("round trip: %v (%+v)", err, res)
				}
			}
		})
	}
}

// serveInProcess runs the server of a role in this process until the
// benchmark ends and returns its ext_proc address.
func serveInProcess(b testing.TB, role, upstream string) string {
	srv, release, err := overheadServer(role, upstream)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		require.NoError(b, <-done)
		release()
	})
	return srv.GRPCAddr()
}

// overheadServer builds the ext_proc server of a role of the overhead
// benchmarks, whose upstream is the EPP's ext_proc address (none for
// roleEPP, whose model server is at benchModelAddr):
//   - roleEPP: mci-epp for pool "llm" in front of one idle model server;
//   - roleSidecar: the sidecar's ext_proc service, whose one route sends
//     every request to the import of "llm" in one cluster, the EPP at
//     upstream, with the HealthBased policy and the EPP probed as the
//     sidecar does; roleSidecarSkip the same with ResponsePhaseSkip;
//   - roleNullRelay: a NullRelay to upstream over a connection set up as
//     the sidecar's to an EPP are.
//
// The last two are served as mci-sidecar serves (extproc.Listen). release
// frees what the server holds besides itself, once it has stopped.
func overheadServer(role, upstream string) (srv interface {
	GRPCAddr() string
	Run(context.Context) error
}, release func(), err error) {
	switch role {
	case roleEPP:
		lis, err := net.Listen("tcp", benchModelAddr())
		if err != nil {
			return nil, nil, fmt.Errorf("the model server's port: %w", err)
		}
		ms := &httptest.Server{Listener: lis, Config: &http.Server{Handler: modelHandler("model-a")}}
		ms.Start()
		e, err := epp.New(epp.Config{
			BindAddress: "127.0.0.1", PoolName: "llm",
			Picker: epp.PickerConfig{Scheduling: scheduling.DefaultConfig()},
		}, epp.StaticSource{Endpoints: []epp.Endpoint{{Name: "pod", Address: ms.Listener.Addr().String()}}})
		if err != nil {
			ms.Close()
			return nil, nil, err
		}
		return e, ms.Close, nil

	case roleSidecar, roleSidecarSkip:
		eppAddr := upstream
		host, portStr, err := net.SplitHostPort(eppAddr)
		if err != nil {
			return nil, nil, fmt.Errorf("EPP address %q: %w", eppAddr, err)
		}
		port, err := strconv.ParseInt(portStr, 10, 32)
		if err != nil {
			return nil, nil, fmt.Errorf("EPP address %q: %w", eppAddr, err)
		}
		model, _, err := net.SplitHostPort(benchModelAddr())
		if err != nil {
			return nil, nil, err
		}
		published := []string{netip.PrefixFrom(netip.MustParseAddr(model), 24).Masked().String()}
		imp := sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: host, Port: int32(port), EndpointAddresses: published})
		// mci-epp serves gRPC health on its ext_proc port as well.
		imp.Status.Clusters[0].EndpointPicker.Health.Port = int32(port)
		tbl, errs := buildTable(routetable.Inputs{
			Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
			Imports: []*v1alpha1.InferencePoolImport{imp},
		})
		if len(errs) > 0 {
			return nil, nil, errors.Join(errs...)
		}
		router := routetable.NewRouter()
		prober := eppprobe.NewHealthProber(eppprobe.HealthProberOptions{})
		prober.SetTargets([]string{net.JoinHostPort(host, portStr)})
		reg := prometheus.NewRegistry()
		// The EPP's model server is on loopback, as everything here.
		cfg := ServerConfig{RemoteDestinations: eppanswer.Policy{AllowLoopback: true}}
		if role == roleSidecarSkip {
			cfg.ResponsePhase = ResponsePhaseSkip
		}
		metrics := NewMetrics(reg)
		reg.MustRegister(&eppHealthCollector{router: router, health: prober})
		server, err := newServer(router, liveState{health: prober}, newRelayer(cfg, nil, metrics), cfg, metrics, logr.Discard())
		if err != nil {
			return nil, nil, err
		}
		router.Publish(tbl)
		servers, err := extproc.Listen(extproc.ServingOptions{BindAddress: "127.0.0.1"}, server, reg, serverOptions()...)
		if err != nil {
			server.Close()
			return nil, nil, err
		}
		servers.Ready()
		return sidecarServers{servers, prober}, server.Close, nil

	case roleNullRelay:
		relayer := newRelayer(ServerConfig{}, nil, nil)
		conn, err := relayer.conn(upstream)
		if err != nil {
			return nil, nil, err
		}
		servers, err := extproc.Listen(extproc.ServingOptions{BindAddress: "127.0.0.1"}, envoyclient.NewNullRelay(conn.ClientConn), prometheus.NewRegistry())
		if err != nil {
			relayer.close()
			return nil, nil, err
		}
		servers.Ready()
		return sidecarServers{servers, nil}, relayer.close, nil
	}
	return nil, nil, fmt.Errorf("unknown role %q", role)
}

// sidecarServers run as Sidecar.Run does: the servers, and the health
// prober when there is one.
type sidecarServers struct {
	*extproc.Servers
	prober *eppprobe.HealthProber
}

func (s sidecarServers) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.prober != nil {
		wg.Go(func() { _ = s.prober.Run(ctx) })
	}
	return s.Servers.Run(ctx, time.Second)
}
