package sidecar

import (
	"context"
	"flag"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/mci-dev/mci/pkg/scheduling"
	extproctest "github.com/mci-dev/mci/test/extproc"
)

var overheadRate = flag.Int("sidecar.overhead-rate", 500, "BenchmarkSidecarOverhead: requests per second on each path")

// BenchmarkSidecarOverhead measures the latency the sidecar adds over
// calling the EPP directly, on loopback, at a fixed request rate, both paths
// in the same run (interleaved), and reports percentiles.
//
//	go test -run '^$' -bench SidecarOverhead -benchtime 1x ./pkg/sidecar/ [-sidecar.overhead-rate=1000]
func BenchmarkSidecarOverhead(b *testing.B) {
	t := b
	rate := *overheadRate
	msA := modelServer(t, "model-a")
	eppA, _ := runEPP(t, msA)
	imp := importOf("llm")
	eppImported(t, "cluster-a", eppA)(imp)
	tbl, errs := Build(Inputs{
		Routes:  []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))},
		Imports: []*v1alphaImport{imp},
	})
	require.Empty(t, errs)
	router := NewRouter()
	router.Publish(tbl)
	srv := NewServer(router, &fakeState{}, ServerConfig{Scheduling: scheduling.DefaultConfig()}, NewMetrics(prometheus.NewRegistry(), nil, nil), logr.Discard())
	defer srv.Close()
	lis, err := netListen()
	require.NoError(t, err)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	direct, err := extproctest.Dial(eppA.GRPCAddr(), extproctest.Options{})
	require.NoError(t, err)
	defer func() { _ = direct.Close() }()
	viaSidecar, err := extproctest.Dial(lis.Addr().String(), extproctest.Options{})
	require.NoError(t, err)
	defer func() { _ = viaSidecar.Close() }()

	req := extproctest.Request{Path: "/v1/completions", Body: []byte(`{"model":"base","prompt":"Write a haiku about GPUs."}`)}
	// Warm up connections and the EPP's metrics.
	for range 200 {
		_, err := direct.Do(context.Background(), req)
		require.NoError(t, err)
		_, err = viaSidecar.Do(context.Background(), req)
		require.NoError(t, err)
	}

	const duration = 5 * time.Second
	var mu sync.Mutex
	lat := map[string][]time.Duration{}
	failures := 0
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(2*rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.Now().Add(duration)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		name, c := "direct", direct
		if i%2 == 1 {
			name, c = "sidecar", viaSidecar
		}
		wg.Go(func() {
			start := time.Now()
			res, err := c.Do(context.Background(), req)
			d := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || res.Destination == "" {
				failures++
				return
			}
			lat[name] = append(lat[name], d)
		})
	}
	wg.Wait()
	pct := func(ds []time.Duration, p float64) time.Duration {
		slices.Sort(ds)
		return ds[min(len(ds)-1, int(float64(len(ds))*p))]
	}
	for _, name := range []string{"direct", "sidecar"} {
		ds := lat[name]
		t.Logf("%-7s n=%d rate=%d/s p50=%v p90=%v p99=%v max=%v", name, len(ds), rate, pct(ds, .5), pct(ds, .9), pct(ds, .99), ds[len(ds)-1])
	}
	addedP50 := pct(lat["sidecar"], .5) - pct(lat["direct"], .5)
	addedP99 := pct(lat["sidecar"], .99) - pct(lat["direct"], .99)
	t.Logf("added by the sidecar: p50 %v, p99 %v; failures %d", addedP50, addedP99, failures)
	b.ReportMetric(float64(addedP50.Microseconds()), "added-p50-µs")
	b.ReportMetric(float64(addedP99.Microseconds()), "added-p99-µs")
	b.ReportMetric(float64(failures), "failed")
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
