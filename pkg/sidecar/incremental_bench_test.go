package sidecar

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"

	mcifake "github.com/mci-dev/mci/pkg/generated/clientset/versioned/fake"
)

// benchInputs are 200 HTTPRoutes over 100 imports of three clusters each
// and 100 local pools with their EPP Services.
func benchInputs() Inputs {
	var in Inputs
	for i := range 100 {
		name := fmt.Sprintf("pool-%03d", i)
		in.Imports = append(in.Imports, importOf(name,
			imported{name: "a", addr: "127.0.2.1"}, imported{name: "c", addr: "127.0.3.1"}, imported{name: "d", addr: "127.0.4.1"}))
		in.Pools = append(in.Pools, pool(name, ""))
		in.Services = append(in.Services, eppService(name, "127.0.1.1"))
	}
	for i := range 200 {
		name := fmt.Sprintf("pool-%03d", i%100)
		in.Routes = append(in.Routes, route(fmt.Sprintf("r%03d", i), time.Duration(i), []string{fmt.Sprintf("m%d.model.com", i)},
			rule([]gatewayv1.HTTPRouteMatch{prefix("/v1"), withHeaders(prefix("/v1/completions"), "x-tier", "gold")},
				poolRef(name, ptr.To[int32](50)), importRef(name, ptr.To[int32](50)))))
	}
	return in
}

// BenchmarkIncremental is BenchmarkBuild's informer event (one import
// changes) for the Incremental builder: two routes are recompiled and one
// host group sorted again.
func BenchmarkIncremental(b *testing.B) {
	in := benchInputs()
	x := NewIncremental(in)
	for _, r := range in.Routes {
		x.SetRoute(r)
	}
	for _, imp := range in.Imports {
		x.SetImport(imp)
	}
	for _, p := range in.Pools {
		x.SetPool(p)
	}
	for _, s := range in.Services {
		x.SetService(s)
	}
	x.Table()
	r := NewRouter()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		x.SetImport(importOf("pool-042", imported{name: "a", addr: fmt.Sprintf("127.0.2.%d", 1+i%2)}, imported{name: "c", addr: "127.0.3.1"}))
		t, changed := x.Table()
		if !changed || len(t.Errors) > 0 {
			b.Fatal(changed, t.Errors)
		}
		r.Publish(t)
	}
}

// BenchmarkImportEventToRoutedRequest measures, with fake clientsets
// (informers over an in-memory tracker, no API server), the time from an
// InferencePoolImport update to the first request routed with it: the
// watch event reaches the informer, the Watcher updates the table of
// BenchmarkBuild's 200 routes incrementally and publishes it, and a
// request polling the Router from another goroutine picks the changed
// cluster. It reports the p50, p99 and max of that latency.
func BenchmarkImportEventToRoutedRequest(b *testing.B) {
	in := benchInputs()
	var kubeObjs, mciObjs, gwObjs []k8sruntime.Object
	for _, s := range in.Services {
		kubeObjs = append(kubeObjs, s)
	}
	for _, imp := range in.Imports {
		mciObjs = append(mciObjs, imp)
	}
	for _, p := range in.Pools {
		mciObjs = append(mciObjs, p)
	}
	for _, r := range in.Routes {
		gwObjs = append(gwObjs, r)
	}
	mci := mcifake.NewSimpleClientset(mciObjs...)
	router := NewRouter()
	w := NewWatcher(Clients{Kube: kubefake.NewSimpleClientset(kubeObjs...), MCI: mci, Gateway: gatewayfake.NewSimpleClientset(gwObjs...)},
		WatchConfig{LocalCluster: "b", DefaultPolicy: PolicyWeighted}, router, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	<-w.Synced()

	attrs := &RequestAttrs{Host: "m42.model.com", Path: "/v1/completions"}
	// routedTo routes one request as the Server does up to the EPP call and
	// returns the EPP address of the import's first cluster in policy order.
	routedTo := func() string {
		rl, _ := router.Table().Match(attrs)
		if rl == nil {
			return ""
		}
		be := rl.Backends[1]
		order, _ := testPolicy(b, PolicyWeighted).Order(be, PickRequest{}, &fakeState{})
		for _, c := range order {
			if c.Name == "a" {
				return c.EPP
			}
		}
		return ""
	}
	var lat []time.Duration
	i := 0
	for b.Loop() {
		i++
		want := fmt.Sprintf("127.0.2.%d", 2+i%2)
		imp := importOf("pool-042", imported{name: "a", addr: want}, imported{name: "c", addr: "127.0.3.1"}, imported{name: "d", addr: "127.0.4.1"})
		want += ":9002"
		start := time.Now()
		if err := mci.Tracker().Update(importsGVR, imp, ns); err != nil {
			b.Fatal(err)
		}
		for routedTo() != want {
			if time.Since(start) > 10*time.Second {
				b.Fatalf("the update never reached the routing table")
			}
			// Poll without taking a core from the watcher.
			time.Sleep(20 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}
