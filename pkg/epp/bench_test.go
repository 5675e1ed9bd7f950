package epp_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mci-dev/mci/pkg/epp"
	extproctest "github.com/mci-dev/mci/test/extproc"
)

var (
	loadRate     = flag.Int("epp.load-rate", 2000, "BenchmarkLoad: requests per second")
	loadDuration = flag.Duration("epp.load-duration", 3*time.Second, "BenchmarkLoad: how long to send")
	loadInFlight = flag.Int("epp.load-in-flight", 256, "BenchmarkLoad: the most requests in flight")
)

// body4KiB is a chat completions request of 4 KiB for a listed model, so
// that the body is rewritten on its way.
func body4KiB() []byte {
	const head = `{"model":"assistant-x","messages":[{"role":"user","content":"`
	const tail = `"}],"max_tokens":128}`
	return []byte(head + strings.Repeat("x", 4096-len(head)-len(tail)) + tail)
}

func benchEPP(b *testing.B) *testEPP {
	eps := startModelServers(b,
		pod("A", 10, 0.30, "lora-x"), pod("B", 5, 0.70), pod("C", 60, 0.20, "lora-x"), pod("D", 3, 0.5))
	return startEPP(b, epp.Config{}, eps)
}

// BenchmarkRoundTrip is one ext_proc exchange with a 4 KiB body over
// loopback, as Envoy has it with the EPP: open a stream, send the headers and
// the body (4 chunks of 1 KiB), read the headers response and the rewritten
// body back, close. serial gives the latency of one exchange, parallel the
// throughput ceiling of client and EPP together on this machine.
func BenchmarkRoundTrip(b *testing.B) {
	e := benchEPP(b)
	body := body4KiB()
	req := extproctest.Request{Path: "/v1/chat/completions", Body: body, ChunkSize: 1024}
	b.Run("serial", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
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

// BenchmarkLoad sends a fixed rate of ext_proc round trips (-epp.load-rate,
// 2000/s by default) for a fixed time (-epp.load-duration, 3s) and reports
// the latency percentiles, measured from when each request was due, so that
// a stall shows in the figures instead of delaying the senders. It ignores
// b.N: run it with -bench BenchmarkLoad -benchtime 1x.
func BenchmarkLoad(b *testing.B) {
	e := benchEPP(b)
	req := extproctest.Request{Path: "/v1/chat/completions", Body: body4KiB(), ChunkSize: 1024}
	total := int(float64(*loadRate) * loadDuration.Seconds())
	interval := time.Second / time.Duration(*loadRate)
	latencies := make([]time.Duration, total)
	var failed, late atomic.Int64
	slots := make(chan struct{}, *loadInFlight)
	var wg sync.WaitGroup

	b.ResetTimer()
	start := time.Now()
	for i := range total {
		due := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(due))
		select {
		case slots <- struct{}{}:
		default:
			// Too many in flight: the EPP is not keeping up. Wait, and
			// let the wait count in this request's latency.
			late.Add(1)
			slots <- struct{}{}
		}
		wg.Go(func() {
			defer func() { <-slots }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res, err := e.client.Do(ctx, req)
			latencies[i] = time.Since(due)
			if err != nil || res.Immediate != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()

	slices.Sort(latencies)
	pct := func(p float64) time.Duration { return latencies[min(int(p*float64(total)), total-1)] }
	b.ReportMetric(float64(total)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(pct(0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(pct(0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(pct(0.999).Microseconds()), "p99.9-µs")
	b.ReportMetric(float64(latencies[total-1].Microseconds()), "max-µs")
	b.ReportMetric(float64(failed.Load()), "failed")
	b.ReportMetric(float64(late.Load()), "backlogged")
	b.Log(fmt.Sprintf("%d requests at %d/s in %v: p50 %v, p99 %v, p99.9 %v, max %v, %d failed",
		total, *loadRate, elapsed.Round(time.Millisecond), pct(0.5), pct(0.99), pct(0.999), latencies[total-1], failed.Load()))
}
