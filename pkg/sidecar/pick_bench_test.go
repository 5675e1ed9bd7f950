package sidecar

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterscore"
	mcifake "github.com/mci-dev/mci/pkg/generated/clientset/versioned/fake"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// BenchmarkPick measures the per-request routing decision: match, backend,
// cluster order (HealthBased over three clusters).
func BenchmarkPick(b *testing.B) {
	var routes []*gatewayv1.HTTPRoute
	for i := range 50 {
		routes = append(routes, sidecartest.Route(fmt.Sprintf("r%02d", i), time.Duration(i), []string{fmt.Sprintf("m%d.model.com", i), "*.model.com"},
			sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix(fmt.Sprintf("/v1/r%d", i)), sidecartest.WithHeaders(sidecartest.Prefix("/v1/completions"), "x-route", fmt.Sprint(i))},
				sidecartest.PoolRef("llm", ptr.To[int32](50)), sidecartest.ImportRef("llm", ptr.To[int32](50)))))
	}
	tbl, errs := buildTable(routetable.Inputs{
		Routes: routes,
		Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm",
			sidecartest.Imported{Name: "a", Addr: "127.0.2.1"}, sidecartest.Imported{Name: "c", Addr: "127.0.3.1"}, sidecartest.Imported{Name: "d", Addr: "127.0.4.1"})},
		Pools:    []*poolv1.InferencePool{sidecartest.Pool("llm", "")},
		Services: []*corev1.Service{sidecartest.EPPService("llm", "127.0.1.1")},
	})
	require.Empty(b, errs)
	r := routetable.NewRouter()
	r.Publish(tbl)
	st := &fakeState{health: map[string]Health{"a": HealthServing, "c": HealthServing}}
	attrs := routetable.RequestAttrs{Host: "m7.model.com", Path: "/v1/completions", Method: "POST", Headers: map[string][]string{"x-route": {"7"}}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		rl, _ := r.Table().Match(&attrs)
		be := rl.PickBackend()
		p := policyOf(be, clusterscore.SessionSpec{})
		if _, err := p.Order(be, PickRequest{Now: sidecartest.Epoch}, st); err != nil {
			b.Fatal(err)
		}
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
	in := sidecartest.NewFleet()
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
	router := routetable.NewRouter()
	w := NewWatcher(Clients{Kube: kubefake.NewSimpleClientset(kubeObjs...), MCI: mci, Gateway: gatewayfake.NewSimpleClientset(gwObjs...)},
		WatchConfig{LocalCluster: "b", DefaultPolicy: routingpolicy.Named()[routingpolicy.Weighted]}, router, nil, nil)
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

	attrs := &routetable.RequestAttrs{Host: "m42.model.com", Path: "/v1/completions"}
	// routedTo routes one request as the Server does up to the EPP call and
	// returns the EPP address of the import's first cluster in policy order.
	routedTo := func() string {
		rl, _ := router.Table().Match(attrs)
		if rl == nil {
			return ""
		}
		be := rl.Backends[1]
		order, _ := testPolicy(be).Order(be, PickRequest{}, &fakeState{})
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
		imp := sidecartest.Import("pool-042", sidecartest.Imported{Name: "a", Addr: want}, sidecartest.Imported{Name: "c", Addr: "127.0.3.1"}, sidecartest.Imported{Name: "d", Addr: "127.0.4.1"})
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
