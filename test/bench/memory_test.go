package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// liveHeap asks cluster-b's mci-apiserver for its live heap (HeapAlloc)
// right after a garbage collection: pprof's heap profile with gc=1 collects
// first and reports runtime.MemStats.
func liveHeap(b *testing.B) uint64 {
	b.Helper()
	c, err := clusters.Cluster("cluster-b")
	require.NoError(b, err)
	pki := filepath.Join(clusters.Dir, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "admin.crt"), filepath.Join(pki, "admin.key"))
	require.NoError(b, err)
	caPEM, err := os.ReadFile(filepath.Join(pki, "mci-serving-ca.crt"))
	require.NoError(b, err)
	pool := x509.NewCertPool()
	require.True(b, pool.AppendCertsFromPEM(caPEM))
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12,
	}}}
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/heap?gc=1&debug=1", c.MCIAPIServerPort))
	require.NoError(b, err)
	defer resp.Body.Close()
	require.Equal(b, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatal("no HeapAlloc in the heap profile")
	return 0
}

// stableHeap samples the heap until two samples a few seconds apart agree
// within 1 MiB: the member's informers have caught up.
func stableHeap(b *testing.B) uint64 {
	prev := liveHeap(b)
	for i := 0; i < 20; i++ {
		time.Sleep(3 * time.Second)
		cur := liveHeap(b)
		if diff := int64(cur) - int64(prev); diff < 1<<20 && diff > -(1<<20) {
			return cur
		}
		prev = cur
	}
	return prev
}

// BenchmarkHeapUnrelatedObjects: how much 10,000 Services and 10,000
// EndpointSlices that no pool uses, in member cluster-a, add to cluster-b's
// mci-apiserver heap: first in a namespace without InferencePools (not
// watched at all), then beside pools (watched, trimmed to what the
// computation reads).
func BenchmarkHeapUnrelatedObjects(b *testing.B) {
	ctx := context.Background()
	kubeA, mciA := clients(b, "cluster-a")
	const (
		elsewhere = "bench-unrelated"
		beside    = "bench-beside-pools"
	)
	ensureNamespace(b, kubeA, elsewhere)
	ensureNamespace(b, kubeA, beside)
	_, err := mciA.InferencePoolV1().InferencePools(beside).Create(ctx, pool(beside, "the-pool", true), metav1.CreateOptions{})
	require.NoError(b, err)

	for _, ns := range []string{elsewhere, beside} {
		before := stableHeap(b)
		require.NoError(b, createUnrelated(ctx, kubeA, ns))
		after := stableHeap(b)
		growth := float64(int64(after)-int64(before)) / (1 << 20)
		b.ReportMetric(growth, "heap-growth-MiB-"+ns)
		b.Logf("mci-apiserver live heap: %.1f MiB before, %.1f MiB after %d unrelated Services and EndpointSlices in %s: %+.1f MiB",
			float64(before)/(1<<20), float64(after)/(1<<20), listSize, ns, growth)
	}
}

func createUnrelated(ctx context.Context, kube kubernetes.Interface, ns string) error {
	return parallel(listSize, 16, func(i int) error {
		name := fmt.Sprintf("svc-%05d", i)
		_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name, "tier": "backend"}, Annotations: map[string]string{"owner": "team-" + name}},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": name},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 8080}, {Name: "metrics", Port: 9090}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		_, err = kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"192.0.2.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name + "-a", Namespace: ns}},
				{Addresses: []string{"192.0.2.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: name + "-b", Namespace: ns}},
			},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		}, metav1.CreateOptions{})
		return err
	})
}
