package exportstatus

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterset"
	poollisters "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
)

// source is a ClusterSet cache with only the local cluster's pools.
type source struct {
	pools poollisters.InferencePoolLister
}

func (s source) Snapshot() imports.ClusterSet {
	return imports.ClusterSet{Local: "cluster-a", Members: []imports.Member{{Name: "cluster-a", Pools: s.pools}}}
}
func (source) Ready() error { return nil }
func (source) PoolsUsingService(member, namespace, service string) []string {
	if member == "cluster-a" && namespace == "example" && service == "epp" {
		return []string{"example/exported"}
	}
	return nil
}

func testPool(namespace, name string, annotations map[string]string, parents ...poolv1.ParentStatus) *poolv1.InferencePool {
	return &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Annotations: annotations},
		Status:     poolv1.InferencePoolStatus{Parents: parents},
	}
}

// drain returns the keys queued, sorted.
func drain(q workqueue.TypedRateLimitingInterface[string]) []string {
	var keys []string
	for q.Len() > 0 {
		k, _ := q.Get()
		q.Done(k)
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func TestNotifyQueuesThePoolsAnEventCanChange(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	exportAnnotation := map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
	for _, p := range []*poolv1.InferencePool{
		testPool("example", "exported", exportAnnotation),
		testPool("example", "plain", nil),
		testPool("example", "was-exported", nil, ownEntry(exported(metav1.ConditionTrue, "Exported", "", 1), t0)),
		testPool("other", "exported", exportAnnotation),
	} {
		require.NoError(t, indexer.Add(p))
	}
	tests := []struct {
		name string
		ev   clusterset.Event
		want []string
	}{
		{"a local pool changed", clusterset.Event{Member: "cluster-a", Kind: clusterset.KindInferencePool, Namespace: "example", Name: "plain"}, []string{"example/plain"}},
		{"another member's pool changed", clusterset.Event{Member: "cluster-b", Kind: clusterset.KindInferencePool, Namespace: "example", Name: "exported"}, nil},
		{"a local EPP Service changed", clusterset.Event{Member: "cluster-a", Kind: clusterset.KindService, Namespace: "example", Name: "epp"}, []string{"example/exported"}},
		{"a local EndpointSlice changed: readiness is not export state", clusterset.Event{Member: "cluster-a", Kind: clusterset.KindEndpointSlice, Namespace: "example", Name: "epp-1", Service: "epp"}, nil},
		{"another member's namespace changed", clusterset.Event{Member: "cluster-b", Kind: clusterset.KindNamespace, Namespace: "example"}, []string{"example/exported", "example/was-exported"}},
		{"a member joined, left or became unreachable", clusterset.Event{Member: "cluster-b", Kind: clusterset.KindMember}, []string{"example/exported", "example/was-exported", "other/exported"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := New(source{pools: poollisters.NewInferencePoolLister(indexer)}, "cluster-a", nil)
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
			defer q.ShutDown()
			c.queue.Store(&q)
			c.Notify(tc.ev)
			assert.Equal(t, tc.want, drain(q))
		})
	}
}

func TestNotifyQueuesNothingWhileNotLeading(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	c := New(source{pools: poollisters.NewInferencePoolLister(indexer)}, "cluster-a", nil)
	assert.NotPanics(t, func() {
		c.Notify(clusterset.Event{Member: "cluster-a", Kind: clusterset.KindInferencePool, Namespace: "example", Name: "exported"})
	})
	assert.True(t, c.dirty.Load(), "the change is remembered for the next look at demand")
}
