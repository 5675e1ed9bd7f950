package clusterset

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// BenchmarkSummaryCacheBytesPerPool measures what one exported pool of
// another member costs this server's heap in summary mode: its summary as
// the member serves it (JSON), decoded and trimmed as the informer does,
// held in an informer's indexer. Two shapes: an EndpointMode export with a
// LoadBalancer EPP and health and metrics ports, and a ParentMode export
// with two Gateways.
func BenchmarkSummaryCacheBytesPerPool(b *testing.B) {
	for _, tc := range []struct {
		name    string
		summary func(i int) *v1alpha1.InferencePoolExportSummary
	}{
		{"EndpointMode", endpointModeSummary},
		{"ParentMode", parentModeSummary},
	} {
		b.Run(tc.name, func(b *testing.B) {
			const pools = 5000
			docs := make([][]byte, pools)
			for i := range docs {
				var err error
				if docs[i], err = json.Marshal(tc.summary(i)); err != nil {
					b.Fatal(err)
				}
			}
			var perPool float64
			for range b.N {
				idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
				before := heapInUse()
				for _, doc := range docs {
					s := &v1alpha1.InferencePoolExportSummary{}
					if err := json.Unmarshal(doc, s); err != nil {
						b.Fatal(err)
					}
					trimmed, _ := trimSummary(s)
					if err := idx.Add(trimmed); err != nil {
						b.Fatal(err)
					}
				}
				perPool = float64(heapInUse()-before) / pools
				runtime.KeepAlive(idx)
			}
			b.ReportMetric(perPool, "bytes/pool")
		})
	}
}

// heapInUse is the live heap: two collections, as the encoders that
// sync.Pools keep (package compact) survive one.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func summaryMeta(i int) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace:         fmt.Sprintf("team-%03d", i%100),
		Name:              fmt.Sprintf("llama-3-8b-instruct-%05d", i),
		UID:               "2f0c8a8e-6a3b-5d0e-9a53-0a2c8e1b7f41",
		ResourceVersion:   "v2;cluster-a=2n9c1,~epoch=mwzfi5b4,~membership=mwzfi71l",
		Generation:        3,
		CreationTimestamp: metav1.Unix(1763790000, 0),
		Labels:            map[string]string{"app.kubernetes.io/name": "llama-3-8b", "team": "inference"},
	}
}

func readyCondition(msg string) []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, ObservedGeneration: 3, LastTransitionTime: metav1.Unix(1763790000, 0), Reason: "Ready", Message: msg}}
}

func endpointModeSummary(i int) *v1alpha1.InferencePoolExportSummary {
	m := summaryMeta(i)
	return &v1alpha1.InferencePoolExportSummary{ObjectMeta: m, Status: v1alpha1.InferencePoolExportSummaryStatus{
		RoutingMode:      v1alpha1.RoutingModeEndpoint,
		TargetPortNumber: 8000,
		EndpointPicker: &v1alpha1.EndpointPickerImport{
			Name:    m.Name + "-epp",
			Service: []v1alpha1.ServiceImport{{Type: "LoadBalancer", Addresses: []string{fmt.Sprintf("10.0.%d.%d", i/250%250, i%250)}, Ports: []v1alpha1.Port{{Number: 9002}}}},
			Health:  &v1alpha1.HealthEndpoint{Port: 9003},
			Metrics: &v1alpha1.MetricsEndpoint{Port: 9090},
		},
		Conditions: readyCondition("Service " + m.Namespace + "/" + m.Name + "-epp in cluster cluster-a has 2 ready endpoint(s)"),
	}}
}

func parentModeSummary(i int) *v1alpha1.InferencePoolExportSummary {
	m := summaryMeta(i)
	parent := func(name string) v1alpha1.ParentImport {
		return v1alpha1.ParentImport{Name: name, Namespace: "gateways", Service: []v1alpha1.ServiceImport{{Type: "LoadBalancer", Addresses: []string{"203.0.113.10"}, Ports: []v1alpha1.Port{{Number: 80}, {Number: 443}}}}}
	}
	return &v1alpha1.InferencePoolExportSummary{ObjectMeta: m, Status: v1alpha1.InferencePoolExportSummaryStatus{
		RoutingMode:      v1alpha1.RoutingModeParent,
		TargetPortNumber: 8000,
		Parents:          []v1alpha1.ParentImport{parent("inference-gateway"), parent("inference-gateway-2")},
		Conditions:       readyCondition("2 of 2 parent Gateway(s) in cluster cluster-a are Programmed with an address: gateways/inference-gateway, gateways/inference-gateway-2"),
	}}
}

// BenchmarkMemberClientBytes measures what a member's clients cost this
// server's heap before it connects (newMember: its credentials, its
// transport's configuration, its probe, gated and summary clients), with
// a kubeconfig as a Secret gives it (a CA, a client certificate, a
// bearer token). The connection, the watches and the cache come on top.
func BenchmarkMemberClientBytes(b *testing.B) {
	const members = 500
	// A pair of each member's own: client-go shares the transport of
	// configurations whose TLS is the same, which members' are not.
	type keyPair struct{ cert, key []byte }
	pairs := make([]keyPair, members)
	for i := range pairs {
		pairs[i].cert, pairs[i].key = selfSignedKeyPair(b, time.Now().Add(time.Hour))
	}
	var perMember float64
	for range b.N {
		kept := make([]*member, 0, members)
		before := heapInUse()
		for i, p := range pairs {
			config := &rest.Config{
				Host:            fmt.Sprintf("https://127.0.0.1:%d", 20000+i),
				BearerToken:     "token",
				TLSClientConfig: rest.TLSClientConfig{CAData: p.cert, CertData: p.cert, KeyData: p.key},
			}
			m, err := newMember(fmt.Sprintf("member-%d", i), "", config, 1<<20, func(Event) {})
			if err != nil {
				b.Fatal(err)
			}
			kept = append(kept, m)
		}
		perMember = float64(heapInUse()-before) / members
		runtime.KeepAlive(kept)
	}
	b.ReportMetric(perMember, "bytes/member")
}
