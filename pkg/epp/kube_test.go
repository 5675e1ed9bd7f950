package epp

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	inferencepoolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/discovery"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned/fake"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/requestmodel/requestmodeltest"
)

// fakeDiscovery lists its instances and streams the events the test sends.
type fakeDiscovery struct {
	selector  map[string]string
	instances []discovery.Instance
	events    chan discovery.Event
}

func (d *fakeDiscovery) List(context.Context) ([]discovery.Instance, error) {
	return d.instances, nil
}

func (d *fakeDiscovery) Watch(ctx context.Context) (<-chan discovery.Event, error) {
	out := make(chan discovery.Event)
	go func() {
		defer close(out)
		for {
			select {
			case ev := <-d.events:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

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

	var mu sync.Mutex
	var discoveries []*fakeDiscovery
	src := &KubeSource{
		Client: client, Namespace: "ns", PoolName: "pool",
		NewDiscovery: func(selector map[string]string) discovery.ServiceDiscovery {
			mu.Lock()
			defer mu.Unlock()
			d := &fakeDiscovery{
				selector:  maps.Clone(selector),
				instances: []discovery.Instance{{ID: "pod-a", Address: "10.0.0.1"}, {ID: "pod-b", Address: "10.0.0.2", Port: 9000}},
				events:    make(chan discovery.Event),
			}
			discoveries = append(discoveries, d)
			return d
		},
	}
	last := func() *fakeDiscovery {
		mu.Lock()
		defer mu.Unlock()
		if len(discoveries) == 0 {
			return nil
		}
		return discoveries[len(discoveries)-1]
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
	assert.Equal(t, map[string]string{"app": "vllm"}, last().selector)
	assert.Equal(t, []string{"10.0.0.1:8000", "10.0.0.2:9000"}, addresses(pool), "the target port, unless the instance knows its own")

	last().events <- discovery.Event{Type: discovery.InstanceAdded, Instance: discovery.Instance{ID: "pod-c", Address: "10.0.0.3"}}
	eventually(func() bool { return slices.Contains(addresses(pool), "10.0.0.3:8000") }, "an added instance becomes a candidate")
	last().events <- discovery.Event{Type: discovery.InstanceRemoved, Instance: discovery.Instance{ID: "pod-a"}}
	eventually(func() bool { return !slices.Contains(addresses(pool), "10.0.0.1:8000") }, "a removed instance is no candidate")

	_, err = client.InferencePoolV1().InferencePools("ns").Update(ctx, inferencePool(map[string]string{"app": "vllm"}, 8080), metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(func() bool { return slices.Equal(addresses(pool), []string{"10.0.0.2:9000", "10.0.0.3:8080"}) }, "a new target port applies to the instances")

	_, err = client.InferencePoolV1().InferencePools("ns").Update(ctx, inferencePool(map[string]string{"app": "vllm-2"}, 8080), metav1.UpdateOptions{})
	require.NoError(t, err)
	eventually(func() bool { return maps.Equal(last().selector, map[string]string{"app": "vllm-2"}) }, "a new selector restarts the discovery")
	eventually(func() bool { return slices.Equal(addresses(pool), []string{"10.0.0.1:8080", "10.0.0.2:9000"}) }, "with the new discovery's instances")

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
	}, reachable)

	require.NoError(t, client.InferencePoolV1().InferencePools("ns").Delete(ctx, "pool", metav1.DeleteOptions{}))
	eventually(func() bool { return len(pool.Endpoints()) == 0 }, "a deleted InferencePool leaves no candidates")
}
