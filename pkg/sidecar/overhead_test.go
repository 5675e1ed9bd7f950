package sidecar

import (
	"context"
	"flag"
	"net"
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

var overheadRate = flag.Int("sidecar.overhead-rate", 2000, "BenchmarkSidecarOverhead: requests per second, on one path at a time")

// BenchmarkSidecarOverhead measures the latency the sidecar adds over
// calling the EPP directly, on loopback, at a fixed request rate on each
// path, both paths in the same run in interleaved turns, and reports
// percentiles.
//
//	go test -run '^$' -bench SidecarOverhead -benchtime 1x ./pkg/sidecar/ [-sidecar.overhead-rate=2000]
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

	res := extproctest.Load(context.Background(), extproctest.LoadOptions{
		Request: req, Rate: rate, Duration: 5 * time.Second, Rounds: 10,
	}, extproctest.Target{Name: "direct", Client: direct}, extproctest.Target{Name: "sidecar", Client: viaSidecar})
	for _, r := range res {
		t.Log(r)
	}
	d, s := res[0], res[1]
	addedP50 := s.Percentile(.5) - d.Percentile(.5)
	addedP99 := s.Percentile(.99) - d.Percentile(.99)
	t.Logf("added by the sidecar: p50 %v, p99 %v", addedP50, addedP99)
	b.ReportMetric(float64(addedP50.Microseconds()), "added-p50-µs")
	b.ReportMetric(float64(addedP99.Microseconds()), "added-p99-µs")
	b.ReportMetric(float64(d.Failed+s.Failed), "failed")
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
