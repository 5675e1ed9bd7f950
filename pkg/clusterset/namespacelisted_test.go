package clusterset

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/test/localclusterset"
)

// A namespace gets its first exported pool while its EPP Service and
// EndpointSlice are ready: the server starts watching the namespace's
// Services, EndpointSlices and Pods then, and nothing of it may be
// computed before all of them have listed, or the export is published once
// as not Ready ("no EndpointSlices") before it is Ready, a false flap for
// every importer. The member's EndpointSlices are made slow to list, so
// that the Services list first every time. Every summary (the local
// cluster's export) and every import (the same kube-apiserver read as
// another member) is computed at each event, as the servers that publish
// them do.
func TestANewlyWatchedNamespaceIsComputedOnlyOnceAllItsWatchesHaveListed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const ns, name = "first-pool", "pool"
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"local"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	admin := kubernetes.NewForConfigOrDie(cs.Clusters[0].Config)
	createReadyEPP(ctx, t, admin, ns)
	local := slowEndpointSlices(cs.Clusters[0].Config, ns, time.Second)
	remote := asAnotherCluster(local, "remote-cluster-id")

	var (
		mu       sync.Mutex
		computed []string
		cache    *Cache
	)
	record := func(ev Event) {
		if ev.Namespace != ns || (ev.Member != "local" && ev.Member != "remote") {
			return
		}
		snapshot := cache.Snapshot()
		var entry string
		if ev.Member == "local" {
			s, ok := imports.ExportSummary(snapshot, ns, name)
			if !ok {
				return
			}
			entry = "summary " + readyOf(s.Status.Conditions)
		} else {
			imp, ok := imports.Import(snapshot, ns, name)
			if !ok || len(imp.Status.Clusters) != 1 {
				return
			}
			entry = "import " + readyOf(imp.Status.Clusters[0].Conditions)
		}
		mu.Lock()
		defer mu.Unlock()
		computed = append(computed, fmt.Sprintf("%s after %s %s", entry, ev.Member, ev.Kind))
	}
	cache = New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 5 * time.Second, RemoveAfter: time.Minute, Summaries: SummariesNever}, record)
	go func() { _ = cache.Run(ctx, staticSource{"remote": {rest: remote, fingerprint: "1"}}) }()
	require.Eventually(t, func() bool { return cache.Ready() == nil }, time.Minute, 50*time.Millisecond)

	_, err = mciclient.NewForConfigOrDie(cs.Clusters[0].Config).InferencePoolV1().InferencePools(ns).Create(ctx, &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	seen := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(computed, "\n")
	}
	require.Eventually(t, func() bool {
		s := seen()
		return strings.Contains(s, "summary True") && strings.Contains(s, "import True")
	}, time.Minute, 50*time.Millisecond, "the export is summarized and imported Ready")
	var notReady []string
	for _, line := range strings.Split(seen(), "\n") {
		if !strings.HasPrefix(line, "summary True ") && !strings.HasPrefix(line, "import True ") {
			notReady = append(notReady, line)
		}
	}
	assert.Empty(t, notReady, "the export is computed Ready from its first computation on:\n%s", seen())
}

func readyOf(conditions []metav1.Condition) string {
	for _, c := range conditions {
		if c.Type == v1alpha1.ConditionReady {
			return string(c.Status) + " (" + c.Message + ")"
		}
	}
	return "no Ready condition"
}

// createReadyEPP creates namespace ns with the Service "epp" and one
// EndpointSlice of it with a ready endpoint.
func createReadyEPP(ctx context.Context, t *testing.T, admin kubernetes.Interface, ns string) {
	t.Helper()
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "epp"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc-ext-proc", Port: 9002}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "epp-1", Labels: map[string]string{discoveryv1.LabelServiceName: "epp"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// slowEndpointSlices returns config, whose requests for the EndpointSlices
// of namespace ns (lists and watches) wait delay before they are sent.
func slowEndpointSlices(config *rest.Config, ns string, delay time.Duration) *rest.Config {
	config = rest.CopyConfig(config)
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && r.URL.Path == "/apis/discovery.k8s.io/v1/namespaces/"+ns+"/endpointslices" {
				select {
				case <-time.After(delay):
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
			}
			return rt.RoundTrip(r)
		})
	})
	return config
}
