package epp_test

import (
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/epp"
	mciextproc "github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/metrics"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/test/envoyclient"
)

var (
	loadRate     = flag.Int("epp.load-rate", 2000, "BenchmarkLoad: round trips per second")
	loadDuration = flag.Duration("epp.load-duration", 4*time.Second, "BenchmarkLoad: sending time per server")
	loadRounds   = flag.Int("epp.load-rounds", 8, "BenchmarkLoad: interleaved turns per server")
)

// body4KiB is a chat completions request of 4 KiB for a listed model, so
// that the body is rewritten on its way.
func body4KiB() []byte {
	const head = `{"model":"assistant-x","messages":[{"role":"user","content":"`
	const tail = `"}],"max_tokens":128}`
	return []byte(head + strings.Repeat("x", 4096-len(head)-len(tail)) + tail)
}

// benchPods are the model servers of the benchmarks: four pods, one of them
// with the LoRA adapter the request needs loaded, one saturated.
func benchPods() []*modelServer {
	return []*modelServer{pod("A", 10, 0.30, "lora-x"), pod("B", 5, 0.70), pod("C", 60, 0.20, "lora-x"), pod("D", 3, 0.5)}
}

// benchRequest is the request of the benchmarks: a 4 KiB chat body sent in
// one chunk, as Envoy passes on a body that arrives in one read.
func benchRequest() envoyclient.Request {
	return envoyclient.Request{Path: "/v1/chat/completions", Body: body4KiB()}
}

// BenchmarkRoundTrip is one ext_proc exchange with a 4 KiB body over
// loopback, client and EPP in this process: open a stream, send the headers
// and the body, read the headers response and the rewritten body back,
// close. serial gives the latency of one exchange, parallel the throughput
// of client and EPP together.
func BenchmarkRoundTrip(b *testing.B) {
	e := startEPP(b, epp.Config{}, startModelServers(b, benchPods()...))
	req := benchRequest()
	b.Run("serial", func(b *testing.B) {
		b.SetBytes(int64(len(req.Body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.client.Do(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(8)
		b.ReportAllocs()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := e.client.Do(context.Background(), req); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	})
}

// BenchmarkLoad measures what mci-epp adds to a request as a gateway sees it:
// the latency of ext_proc round trips with a 4 KiB body at a fixed rate
// (-epp.load-rate, 2000/s), sent open-loop from this process to an EPP in a
// process of its own, as Envoy and the EPP are in a cluster. The same run
// drives, interleaved with it, a floor: a server in its own process with the
// same gRPC plumbing that reads the request and answers a fixed destination
// without picking, which is what any ext_proc hop costs with this client.
// It ignores b.N: run it with -benchtime 1x.
//
//	go test -run '^$' -bench BenchmarkLoad -benchtime 1x ./pkg/epp/
func BenchmarkLoad(b *testing.B) {
	floor := envoyclient.StartChild(b, "floor")
	picker := envoyclient.StartChild(b, "epp")
	req := benchRequest()
	warm := envoyclient.LoadOptions{Request: req, Rate: 1000, Duration: 500 * time.Millisecond}
	envoyclient.Load(context.Background(), warm, floor.Target, picker.Target)

	b.ResetTimer()
	floorCPU, pickerCPU := floor.CPU(b), picker.CPU(b)
	res := envoyclient.Load(context.Background(), envoyclient.LoadOptions{
		Request: req, Rate: *loadRate, Duration: *loadDuration, Rounds: *loadRounds,
	}, floor.Target, picker.Target)
	floorCPU, pickerCPU = floor.CPU(b)-floorCPU, picker.CPU(b)-pickerCPU
	b.StopTimer()
	for _, r := range res {
		b.Log(r)
		require.Zero(b, r.Failed, "%s failed round trips", r.Name)
	}
	f, p := res[0], res[1]
	// CPU time per round trip of each server process: unlike latency, it
	// hardly depends on what else the machine runs.
	b.ReportMetric(float64(pickerCPU.Microseconds())/float64(p.Sent), "epp-cpu-µs/op")
	b.ReportMetric(float64(floorCPU.Microseconds())/float64(f.Sent), "floor-cpu-µs/op")
	b.ReportMetric(p.Rate(), "req/s")
	b.ReportMetric(float64(p.Percentile(.5).Microseconds()), "epp-p50-µs")
	b.ReportMetric(float64(p.Percentile(.99).Microseconds()), "epp-p99-µs")
	b.ReportMetric(float64(f.Percentile(.5).Microseconds()), "floor-p50-µs")
	b.ReportMetric(float64(f.Percentile(.99).Microseconds()), "floor-p99-µs")
	b.ReportMetric(float64((p.Percentile(.99) - f.Percentile(.99)).Microseconds()), "added-p99-µs")
}

// BenchmarkCeiling is the throughput ceiling of mci-epp in a process of its
// own: 32 closed-loop senders for the benchmark's time.
//
//	go test -run '^$' -bench BenchmarkCeiling -benchtime 3s ./pkg/epp/
func BenchmarkCeiling(b *testing.B) {
	picker := envoyclient.StartChild(b, "epp")
	req := benchRequest()
	var done atomic.Int64
	b.SetParallelism(16) // 16 x GOMAXPROCS senders
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := picker.Target.Client.Do(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
			done.Add(1)
		}
	})
	b.ReportMetric(float64(done.Load())/time.Since(start).Seconds(), "req/s")
}

func TestMain(m *testing.M) {
	envoyclient.RunIfChild(serveBenchChild)
	os.Exit(m.Run())
}

// serveBenchChild serves a benchmark's server process (extproctest.StartChild):
// "epp" for an EPP over benchPods, "floor" for the null processor.
func serveBenchChild(ctx context.Context, role string, ready func(addr string)) error {
	var servers interface {
		GRPCAddr() string
		Run(context.Context) error
	}
	switch role {
	case "epp":
		var eps []epp.Endpoint
		for _, m := range benchPods() {
			m.srv = httptest.NewServer(m)
			defer m.srv.Close()
			eps = append(eps, epp.Endpoint{Name: m.name, Address: m.srv.Listener.Addr().String()})
		}
		// The scrapes at their production interval: the test's faster
		// ones would cost the process more than requests do.
		e, err := newTestEPP(epp.Config{ScrapeInterval: metrics.DefaultInterval}, eps)
		if err != nil {
			return err
		}
		servers = e
	case "floor":
		s, err := mciextproc.Listen(mciextproc.ServingOptions{BindAddress: "127.0.0.1"}, nullProcessor{}, prometheus.NewRegistry())
		if err != nil {
			return err
		}
		s.Ready()
		servers = floorServers{s}
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	ready(servers.GRPCAddr())
	return servers.Run(ctx)
}

type floorServers struct{ *mciextproc.Servers }

func (s floorServers) Run(ctx context.Context) error { return s.Servers.Run(ctx, time.Second) }

// nullProcessor answers every request with a fixed destination and the body
// unchanged: the ext_proc protocol and gRPC, without a decision.
type nullProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (nullProcessor) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := mciextproc.ReadRequest(stream, requestmodel.DefaultMaxRequestBodyBytes)
	if err != nil {
		return err
	}
	if err := mciextproc.SendAll(stream, req.Route([]string{"127.0.0.1:8000"}, nil)); err != nil {
		return err
	}
	return req.PassThroughResponse(stream)
}
