package epp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	inferencepoolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/discovery"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned/fake"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/requestmodel/requestmodeltest"
)

func inferencePool(selector map[string]string, port int32) *inferencepoolv1.InferencePool {
	return &inferencepoolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: "ns"},
		Spec: inferencepoolv1.InferencePoolSpec{
			Selector:          inferencepoolv1.LabelSelector{MatchLabels: selector},
			TargetPorts:       []inferencepoolv1.Port{{Number: port}},
			EndpointPickerRef: inferencepoolv1.EndpointPickerRef{Name: "epp"},
		},
	}
}

func addresses(p *Pool) []string {
	var out []string
	for _, e := range p.Endpoints() {
		out = append(out, e.Address)
	}
	return out
}

func TestKubeSource(t *testing.T) {
	im := requestmodeltest.InferenceModel("mine", "chat", nil)
	im.Namespace = "ns"
	other := requestmodeltest.InferenceModel("other-pool", "other", nil)
	other.Namespace, other.Spec.PoolRef.Name = "ns", "another-pool"
	// One objective per group for the pool, one for another pool, and an
	// llm-d.ai rewrite; the cluster serves every resource but the
	// inference.networking.x-k8s.io InferenceModelRewrite.
	obj := requestmodeltest.Objective("batch", ptr.To[int32](-1))
	obj.Namespace = "ns"
	llmdObj := requestmodeltest.LLMDObjective("chat", 3)
	llmdObj.Namespace = "ns"
	otherObj := requestmodeltest.Objective("elsewhere", ptr.To[int32](1))
	otherObj.Namespace, otherObj.Spec.PoolRef.Name = "ns", "another-pool"
	llmdRewrite := &llmdv1alpha2.InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Name: "rw", Namespace: "ns"},
		Spec:       requestmodeltest.Rewrite("", requestmodeltest.Rule([]string{"chat"}, requestmodeltest.RewriteTarget("chat-v2", nil))).Spec,
	}
	client := fake.NewSimpleClientset(im, other, obj, llmdObj, otherObj, llmdRewrite)
	client.Resources = []*metav1.APIResourceList{
		{GroupVersion: "inference.networking.x-k8s.io/v1alpha2", APIResources: []metav1.APIResource{{Name: "inferencemodels"}, {Name: "inferenceobjectives"}}},
		{GroupVersion: "llm-d.ai/v1alpha2", APIResources: []metav1.APIResource{{Name: "inferenceobjectives"}, {Name: "inferencemodelrewrites"}}},
	}

	kube := kubefake.NewClientset(
		readyPod("pod-a", "10.0.0.1", map[string]string{"app": "vllm"}),
		readyPod("pod-b", "10.0.0.2", map[string]string{"app": "vllm"}),
		readyPod("pod-x", "10.0.0.9", map[string]string{"app": "vllm-2"}),
	)
	src := &KubeSource{
		Client: client, Kube: kube, Namespace: "ns", PoolName: "pool",
		// No model server here serves /metadata: each is a candidate for
		// any model, as before seed 002.
		fetch: func(context.Context, *http.Client, string) (map[string]any, error) {
			return nil, fmt.Errorf("test: %w", discovery.ErrNoMetadata)
		},
	}
	pool, models := NewPool("pool", nil, nil), requestmodel.NewModels()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, pool, models) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	eventually := func(cond func() bool, msg string) {
		t.Helper()
		require.Eventually(t, cond, 5*time.Second, 5*time.Millisecond, msg)
	}

	eventually(func() bool { return models.Len() == 1 }, "the pool's InferenceModels are read")
	assert.NotNil(t, models.Get("chat"))
	assert.Nil(t, models.Get("other"), "an InferenceModel of another pool is not the pool's")
	eventually(func() bool { _, o, r := models.Counts(); return o == 2 && r == 1 }, "the pool's objectives and rewrites of both groups are read")
	assert.Equal(t, "InferenceObjective ns/batch (inference.networking.x-k8s.io)", models.Objective("batch").Source)
	assert.Equal(t, "InferenceObjective ns/chat (llm-d.ai)", models.Objective("chat").Source)
	assert.Nil(t, models.Objective("elsewhere"), "an objective of another pool is not the pool's")
	assert.Equal(t, "chat-v2", models.Resolve("chat", requestmodel.RequestHeaders{}, rand.New(rand.NewPCG(1, 2))).TargetModel)
	assert.Equal(t, map[schema.GroupVersionResource]bool{
		apiInferenceModels: true, apiObjectives: true, apiRewrites: false, apiLLMDObjectives: true, apiLLMDRewrites: true,
	}, models.ServedAPIs(), "what the cluster serves is recorded for the metrics")
	require.Never(t, func() bool {
		select {
		case <-pool.Synced():
			return true
		default:
			return false
		}
	}, 50*time.Millisecond, 5*time.Millisecond, "the pool is synced before its InferencePool exists")

	_, err := client.InferencePoolV1().InferencePools("ns").Create(ctx, inferencePool(map[string]string{"app": "vllm"}, 8000), metav1.CreateOptions{})
	require.NoError(t, err)
	eventually(func() bool {
		select {
		case <-pool.Synced():
			return true
		default:
			return false
		}
	}, "the pool syncs once the InferencePool's instances are listed")
	assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, addresses(pool), "the selected ready pods on the target port")

	_, err = kube.CoreV1().Pods("ns").Create(ctx, readyPod("pod-c", "10.0.0.3", map[string]string{"app": "vllm"}), metav1.CreateOptions{})
	require.NoError(t, err)
	eventually(func() bool { return slices.Contains(addresses(pool), "10.0.0.3:8000") }, "an added instance becomes a candidate")
	notReady := readyPod("pod-a", "10.0.0.1", map[string]string{"app": "vllm"})
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	_, err = kube.CoreV1().Pods("ns").UpdateStatus(ctx, notReady, metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(func() bool { return !slices.Contains(addresses(pool), "10.0.0.1:8000") }, "an instance no longer ready is no candidate")

	_, err = client.InferencePoolV1().InferencePools("ns").Update(ctx, inferencePool(map[string]string{"app": "vllm"}, 8080), metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(func() bool { return slices.Equal(addresses(pool), []string{"10.0.0.2:8080", "10.0.0.3:8080"}) }, "a new target port applies to the instances")

	_, err = client.InferencePoolV1().InferencePools("ns").Update(ctx, inferencePool(map[string]string{"app": "vllm-2"}, 8080), metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(func() bool { return slices.Equal(addresses(pool), []string{"10.0.0.9:8080"}) }, "a new selector picks its own pods")

	im2 := requestmodeltest.InferenceModel("late", "late", nil)
	im2.Namespace = "ns"
	_, err = client.InferenceV1alpha2().InferenceModels("ns").Create(ctx, im2, metav1.CreateOptions{})
	require.NoError(t, err)
	eventually(func() bool { return models.Get("late") != nil }, "a new InferenceModel is picked up")

	// The source serves whether each of its informers lists and watches:
	// the served resources only, every one reachable.
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(src))
	reachable := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "mci_epp_watch_reachable" {
			for _, m := range f.GetMetric() {
				reachable[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	assert.Equal(t, map[string]float64{
		"inferencepools.inference.networking.k8s.io":        1,
		"inferencemodels.inference.networking.x-k8s.io":     1,
		"inferenceobjectives.inference.networking.x-k8s.io": 1,
		"inferenceobjectives.llm-d.ai":                      1,
		"inferencemodelrewrites.llm-d.ai":                   1,
		"pods":                                              1,
	}, reachable)

	require.NoError(t, client.InferencePoolV1().InferencePools("ns").Delete(ctx, "pool", metav1.DeleteOptions{}))
	eventually(func() bool { return len(pool.Endpoints()) == 0 }, "a deleted InferencePool leaves no candidates")
}

func readyPod(name, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels},
		Status: corev1.PodStatus{
			PodIP:      ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

// TestKubeSourceFromEndpointSlices follows seed 002's mechanism: the ready
// endpoints of a Service's EndpointSlices, identified by targetRef, sent to
// at their Pod's address (AddressFromPodIP), with the models their
// /metadata names.
func TestKubeSourceFromEndpointSlices(t *testing.T) {
	client := fake.NewSimpleClientset(inferencePool(map[string]string{"app": "vllm"}, 8000))
	endpoint := func(pod string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{"192.0.2.1"}, // documentation range: never sent to
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: "ns"},
		}
	}
	slice := func(name, service string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps,
		}
	}
	kube := kubefake.NewClientset(
		readyPod("pod-a", "10.0.0.1", nil), readyPod("pod-b", "10.0.0.2", nil), readyPod("pod-c", "10.0.0.3", nil),
		slice("servers-1", "servers", endpoint("pod-a", true), endpoint("pod-b", true), endpoint("pod-c", false)),
		slice("other-1", "other", endpoint("pod-c", true)),
	)
	served := map[string]map[string]any{
		"http://10.0.0.1:8000": {"Model": map[string]any{"name": "llama"}},
		"http://10.0.0.2:8000": {"Model": map[string]any{"name": "qwen", "lora_adapters": []any{"qwen-sql"}}},
		"http://10.0.0.3:8000": {"Model": map[string]any{"name": "llama"}},
	}
	src := &KubeSource{
		Client: client, Kube: kube, Namespace: "ns", PoolName: "pool",
		Instances: InstancesFromEndpointSlices, Service: "servers", Address: AddressFromPodIP,
		fetch: func(_ context.Context, _ *http.Client, url string) (map[string]any, error) {
			if md, ok := served[url]; ok {
				return md, nil
			}
			return nil, fmt.Errorf("test: nothing at %s", url)
		},
	}
	pool, models := NewPool("pool", nil, nil), requestmodel.NewModels()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, pool, models) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	endpoints := func() map[string][]string {
		out := map[string][]string{}
		for _, e := range pool.Endpoints() {
			out[e.Address] = e.Models
		}
		return out
	}
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual(map[string][]string{"10.0.0.1:8000": {"llama"}, "10.0.0.2:8000": {"qwen", "qwen-sql"}}, endpoints())
	}, 5*time.Second, 5*time.Millisecond, "the ready endpoints of the Service's slices, at their Pod's address, with their models; got %v", endpoints())

	_, err := kube.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice("servers-1", "servers", endpoint("pod-a", false), endpoint("pod-b", true), endpoint("pod-c", true)), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual(map[string][]string{"10.0.0.2:8000": {"qwen", "qwen-sql"}, "10.0.0.3:8000": {"llama"}}, endpoints())
	}, 5*time.Second, 5*time.Millisecond, "ready false removes an instance, ready true adds one; got %v", endpoints())

	require.NoError(t, kube.CoreV1().Pods("ns").Delete(ctx, "pod-c", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual(map[string][]string{"10.0.0.2:8000": {"qwen", "qwen-sql"}}, endpoints())
	}, 5*time.Second, 5*time.Millisecond, "an endpoint whose Pod has no address is no candidate; got %v", endpoints())
}
