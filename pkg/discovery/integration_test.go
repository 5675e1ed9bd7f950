package discovery

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/test/localclusterset"
)

// eventTimeout bounds how long one change may take to come out of a watch:
// one watch event from a local kube-apiserver, so well under a second when
// all is well; the margin is for a loaded machine.
const eventTimeout = 3 * time.Second

// TestAgainstKubeAPIServer runs the informer-based discoveries against a
// real kube-apiserver and etcd (one cluster of the local ClusterSet, without
// mci-apiserver). It plays the controllers that do not run there: it writes
// EndpointSlices as the EndpointSlice controller would, with
// documentation-range addresses since loopback ones are rejected, and Pod
// status as a kubelet would.
func TestAgainstKubeAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	// The harness finds kube-apiserver and etcd ($MCI_BIN_DIR, else the
	// repository's _output/bin) and says how to build them when missing.

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"disc"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	t.Logf("kube-apiserver up in %s", time.Since(start).Round(100*time.Millisecond))
	kube, err := kubernetes.NewForConfig(cs.Clusters[0].Config)
	require.NoError(t, err)

	t.Run("EndpointSliceDiscovery follows seed 002's event mapping", func(t *testing.T) {
		testEndpointSliceDiscovery(ctx, t, kube)
	})
	t.Run("PodDiscovery follows pod readiness", func(t *testing.T) {
		testPodDiscovery(ctx, t, kube)
	})
	t.Run("an instance registers, becomes ready and is discovered with its metadata", func(t *testing.T) {
		testRegistryFlow(ctx, t, kube)
	})
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func createNamespace(ctx context.Context, t *testing.T, kube kubernetes.Interface, name string) {
	t.Helper()
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// watcher reads a discovery's event stream.
type watcher struct {
	t      *testing.T
	events <-chan Event
}

func startWatch(ctx context.Context, t *testing.T, d ServiceDiscovery) *watcher {
	t.Helper()
	events, err := d.Watch(ctx)
	require.NoError(t, err)
	return &watcher{t: t, events: events}
}

// next returns the next event, failing if none comes within eventTimeout of
// the change that should cause it.
func (w *watcher) next() Event {
	w.t.Helper()
	start := time.Now()
	select {
	case ev, ok := <-w.events:
		require.True(w.t, ok, "the event stream closed")
		w.t.Logf("%s %s (%s) after %s", ev.Type, ev.Instance.ID, ev.Instance.Address, time.Since(start).Round(time.Millisecond))
		return ev
	case <-time.After(eventTimeout):
		require.FailNow(w.t, "no event", "within %s", eventTimeout)
		return Event{}
	}
}

// expect asserts the next events, in order.
func (w *watcher) expect(want ...Event) {
	w.t.Helper()
	for _, ev := range want {
		assert.Equal(w.t, ev, w.next())
	}
}

func testEndpointSliceDiscovery(ctx context.Context, t *testing.T, kube kubernetes.Interface) {
	const ns = "disc-slices"
	createNamespace(ctx, t, kube, ns)
	slices := kube.DiscoveryV1().EndpointSlices(ns)

	ep := func(pod string, last int, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("192.0.2.%d", last)},
			Conditions: discoveryv1.EndpointConditions{Ready: ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: ns},
		}
	}
	newSlice := func(name, service string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8000), Protocol: ptr.To(corev1.ProtocolTCP)}},
		}
	}
	create := func(s *discoveryv1.EndpointSlice) {
		t.Helper()
		_, err := slices.Create(ctx, s, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	setEndpoints := func(name string, eps ...discoveryv1.Endpoint) {
		t.Helper()
		s, err := slices.Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		s.Endpoints = eps
		_, err = slices.Update(ctx, s, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	inst := func(pod string, last int) Instance {
		return Instance{ID: pod, Namespace: ns, Address: fmt.Sprintf("192.0.2.%d", last), Port: 8000}
	}
	added := func(pod string, last int) Event { return Event{Type: InstanceAdded, Instance: inst(pod, last)} }
	removed := func(pod string, last int) Event { return Event{Type: InstanceRemoved, Instance: inst(pod, last)} }
	yes, no := ptr.To(true), ptr.To(false)

	// A ready endpoint and one whose readiness is unset exist before the
	// watch starts; a not-ready one does not count.
	create(newSlice("svc-1", "svc", ep("pod-a", 1, yes), ep("pod-b", 2, nil), ep("pod-c", 3, no)))
	d := NewEndpointSliceDiscovery(kube, ns, "svc")
	w := startWatch(ctx, t, d)
	w.expect(added("pod-a", 1), added("pod-b", 2))

	// Endpoint condition changes to ready: true.
	setEndpoints("svc-1", ep("pod-a", 1, yes), ep("pod-b", 2, nil), ep("pod-c", 3, yes))
	w.expect(added("pod-c", 3))
	// ... and to ready: false.
	setEndpoints("svc-1", ep("pod-a", 1, yes), ep("pod-b", 2, nil), ep("pod-c", 3, no))
	w.expect(removed("pod-c", 3))
	// Endpoint added with ready: true.
	setEndpoints("svc-1", ep("pod-a", 1, yes), ep("pod-b", 2, nil), ep("pod-c", 3, no), ep("pod-d", 4, yes))
	w.expect(added("pod-d", 4))
	// Endpoint removed from its slice.
	setEndpoints("svc-1", ep("pod-a", 1, yes), ep("pod-c", 3, no), ep("pod-d", 4, yes))
	w.expect(removed("pod-b", 2))

	// pod-d moves to a second slice: added there, then dropped from the
	// first. Neither write may cause an event, which the next event (pod-e
	// becoming ready) proves.
	create(newSlice("svc-2", "svc", ep("pod-d", 4, yes)))
	setEndpoints("svc-1", ep("pod-a", 1, yes), ep("pod-c", 3, no))
	// A ready endpoint of another Service is not ours.
	create(newSlice("other-1", "other", ep("pod-x", 99, yes)))
	setEndpoints("svc-2", ep("pod-d", 4, yes), ep("pod-e", 5, yes))
	w.expect(added("pod-e", 5))

	list, err := d.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, []Instance{inst("pod-a", 1), inst("pod-d", 4), inst("pod-e", 5)}, list)

	// A deleted slice removes its ready endpoints.
	require.NoError(t, slices.Delete(ctx, "svc-2", metav1.DeleteOptions{}))
	w.expect(removed("pod-d", 4), removed("pod-e", 5))

	// A second watcher starts from the current set.
	w2 := startWatch(ctx, t, d)
	w2.expect(added("pod-a", 1))

	// A watch ends with its context.
	wctx, wcancel := context.WithCancel(ctx)
	w3 := startWatch(wctx, t, d)
	w3.expect(added("pod-a", 1))
	wcancel()
	select {
	case _, ok := <-w3.events:
		assert.False(t, ok, "no event after the context ended")
	case <-time.After(eventTimeout):
		t.Fatal("the event stream was not closed when its context ended")
	}
}

func testPodDiscovery(ctx context.Context, t *testing.T, kube kubernetes.Interface) {
	const ns = "disc-pods"
	createNamespace(ctx, t, kube, ns)
	pods := kube.CoreV1().Pods(ns)
	selector := map[string]string{"app": "sim"}

	create := func(name string, labels map[string]string, finalizers ...string) {
		t.Helper()
		_, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Finalizers: finalizers},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	// setStatus writes what a kubelet would: phase Running, the pod IP and
	// the Ready condition.
	setStatus := func(name, ip string, ready corev1.ConditionStatus) {
		t.Helper()
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}
		_, err = pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	inst := func(name, ip string) Instance { return Instance{ID: name, Namespace: ns, Address: ip} }
	added := func(name, ip string) Event { return Event{Type: InstanceAdded, Instance: inst(name, ip)} }
	removed := func(name, ip string) Event { return Event{Type: InstanceRemoved, Instance: inst(name, ip)} }

	create("sim-1", selector)
	setStatus("sim-1", "127.0.1.1", corev1.ConditionTrue)
	create("sim-2", selector, "test.mci.dev/hold")
	d := NewPodDiscovery(kube, ns, selector)
	w := startWatch(ctx, t, d)
	w.expect(added("sim-1", "127.0.1.1"))

	setStatus("sim-2", "127.0.1.2", corev1.ConditionFalse)
	// A ready pod the selector does not pick is not ours.
	create("other", map[string]string{"app": "other"})
	setStatus("other", "127.0.1.9", corev1.ConditionTrue)
	setStatus("sim-2", "127.0.1.2", corev1.ConditionTrue)
	w.expect(added("sim-2", "127.0.1.2"))

	setStatus("sim-1", "127.0.1.1", corev1.ConditionFalse)
	w.expect(removed("sim-1", "127.0.1.1"))

	list, err := d.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, []Instance{inst("sim-2", "127.0.1.2")}, list)

	// A pod being deleted (held by a finalizer) stops being ready at once.
	require.NoError(t, pods.Delete(ctx, "sim-2", metav1.DeleteOptions{}))
	w.expect(removed("sim-2", "127.0.1.2"))
	_, err = pods.Patch(ctx, "sim-2", "application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	require.NoError(t, err)

	setStatus("sim-1", "127.0.1.1", corev1.ConditionTrue)
	w.expect(added("sim-1", "127.0.1.1"))
	// A deleted pod is removed.
	require.NoError(t, pods.Delete(ctx, "sim-1", metav1.DeleteOptions{}))
	w.expect(removed("sim-1", "127.0.1.1"))
}

// testRegistryFlow walks seed 002's discovery flow: the instance registers
// and is checked against its pod and Service, sets metadata, marks itself
// ready; the test, as kubelet, probes ReadyPath and writes the Ready
// condition; PodDiscovery reports the instance and its metadata is fetched
// from its address.
func testRegistryFlow(ctx context.Context, t *testing.T, kube kubernetes.Interface) {
	const ns = "disc-registry"
	createNamespace(ctx, t, kube, ns)
	labels := map[string]string{NamespaceLabel: "dynamo", ComponentLabel: "decode"}
	_, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "decode-0", Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "dynamo"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	t.Setenv(PodNameEnv, "decode-0")
	h, err := Registry{}.RegisterInstance("dynamo", "decode")
	require.NoError(t, err)
	_, err = h.CheckKubernetes(ctx, kube, ns)
	require.ErrorIs(t, err, ErrRegistration, "no Service selects the pod yet")
	_, err = kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "decode"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 8080}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	service, err := h.CheckKubernetes(ctx, kube, ns)
	require.NoError(t, err)
	assert.Equal(t, "decode", service)
	wrong, err := Registry{}.RegisterInstance("dynamo", "prefill")
	require.NoError(t, err)
	_, err = wrong.CheckKubernetes(ctx, kube, ns)
	assert.ErrorIs(t, err, ErrRegistration, "the pod is not a prefill instance")

	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	host, portText, err := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	port, err := strconv.Atoi(portText)
	require.NoError(t, err)

	w := startWatch(ctx, t, NewPodDiscovery(kube, ns, labels))
	// kubelet's readiness probe, once.
	probe := func() {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + ReadyPath)
		require.NoError(t, err)
		_ = resp.Body.Close()
		status := corev1.ConditionFalse
		if resp.StatusCode == http.StatusOK {
			status = corev1.ConditionTrue
		}
		p, err := kube.CoreV1().Pods(ns).Get(ctx, "decode-0", metav1.GetOptions{})
		require.NoError(t, err)
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = host
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		_, err = kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	metadata := map[string]any{"Model": map[string]any{"name": "Qwen3-32B", "type": "Completions"}}
	require.NoError(t, h.SetMetadata(metadata))
	probe()
	h.SetReady(true)
	probe()
	ev := w.next()
	require.Equal(t, InstanceAdded, ev.Type)
	assert.Equal(t, h.InstanceID(), ev.Instance.ID)
	got, err := Metadata(ctx, nil, fmt.Sprintf("http://%s", net.JoinHostPort(ev.Instance.Address, strconv.Itoa(port))))
	require.NoError(t, err)
	assert.Equal(t, metadata, got)

	h.SetReady(false)
	probe()
	assert.Equal(t, InstanceRemoved, w.next().Type)
}
