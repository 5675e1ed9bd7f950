package routetable

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// BenchmarkExportChangeAtScale is the routing table's cost of one export
// change at 1,000 clusters x 10 pools: ten imports of 1,000 clusters
// each, each the backend of its own route; every iteration one cluster
// of one import changes its EPP address (the informer's update of that
// import), and the table is rebuilt incrementally and published. It
// reports the p50 and p99 of a change (µs) besides ns/op.
func BenchmarkExportChangeAtScale(b *testing.B) {
	const pools, clusters = 10, 1000
	importOfPool := func(p, changed int) *v1alpha1.InferencePoolImport {
		cs := make([]sidecartest.Imported, clusters)
		for i := range cs {
			cs[i] = sidecartest.Imported{Name: fmt.Sprintf("cluster-%04d", i), Addr: fmt.Sprintf("127.%d.%d.%d", 1+p, i>>8, i&255)}
		}
		if changed >= 0 {
			cs[changed].Addr = fmt.Sprintf("127.100.%d.%d", changed>>8, changed&255)
		}
		return sidecartest.Import(fmt.Sprintf("pool-%02d", p), cs...)
	}
	var in Inputs
	// base[p] is pool p as exported; changed[p] the same with one of its
	// clusters at another address, so that going from one to the other is
	// one export change.
	base, changed := make([]*v1alpha1.InferencePoolImport, pools), make([]*v1alpha1.InferencePoolImport, pools)
	for p := range pools {
		base[p], changed[p] = importOfPool(p, -1), importOfPool(p, (p*97)%clusters)
		in.Imports = append(in.Imports, base[p])
		in.Routes = append(in.Routes, sidecartest.Route(fmt.Sprintf("r%02d", p), 0, []string{fmt.Sprintf("m%d.model.com", p)},
			sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/v1")}, sidecartest.ImportRef(fmt.Sprintf("pool-%02d", p), nil))))
	}
	x := NewIncremental(in)
	if t, _ := x.Table(); len(t.Errors) > 0 || len(t.Rules()) != pools || len(t.Rules()[0].Backends[0].Clusters) != clusters {
		b.Fatalf("the table is not 10 pools of 1,000 clusters: %v", t.Errors)
	}
	r := NewRouter()
	lat := make([]time.Duration, 0, 1<<14)
	b.ReportAllocs()
	i := 0
	cpu := cpuTime()
	for b.Loop() {
		p := i % pools
		imp := changed[p]
		if (i/pools)%2 == 1 {
			imp = base[p]
		}
		i++
		start := time.Now()
		x.SetImport(imp)
		t, ok := x.Table()
		r.Publish(t)
		lat = append(lat, time.Since(start))
		if !ok || len(t.Errors) > 0 {
			b.Fatal(ok, t.Errors)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Microsecond)/float64(len(lat)), "cpu-µs/op")
	slices.Sort(lat)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(lat[len(lat)/2]), "p50-µs")
	b.ReportMetric(us(lat[len(lat)*99/100]), "p99-µs")
}

// cpuTime is the CPU time the process has used (user and system, every
// thread, the garbage collector's included): on a shared machine, a
// figure that other processes' load does not inflate as it does the
// latencies.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
