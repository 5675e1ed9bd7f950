package membermock

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewaylisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/clusterset"
	poollisters "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/registry/inference/inferenceclustersummary"
	"github.com/mci-dev/mci/pkg/registry/inference/inferencepoolexportsummary"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

// Member is one virtual member cluster: the objects its kube-apiserver
// would hold, and the summary stores its mci-apiserver would serve from
// them. Apply and Delete change its objects as writes to a kube-apiserver
// do (each moves the member's resourceVersion), and its stores hear of
// each change as mci-apiserver's informers of its own cluster would tell
// them.
type Member struct {
	name string
	// clusterID is the uid of the member's kube-system Namespace.
	clusterID types.UID

	// mu orders the member's writes: each takes the next resourceVersion
	// and reaches the stores in that order, as a kube-apiserver's watch
	// delivers them.
	mu sync.Mutex
	rv uint64

	namespaces, pools, services, slices, pods, gateways, tlsPolicies cache.Indexer

	view     imports.Member
	exports  *virtual.Store
	clusters *virtual.Store
	// exportsREST and clustersREST serve the stores, as mci-apiserver's
	// summary resources do.
	exportsREST  *virtual.REST
	clustersREST *virtual.REST

	cancel context.CancelFunc
	done   chan struct{}
}

// MemberOptions are what a member is made of besides its name.
type MemberOptions struct {
	// ClusterSetName seeds the uids of the summaries, as mci-apiserver's
	// --clusterset-name does.
	ClusterSetName string
	// HistorySize is how many changes a watch can resume across
	// (mci-apiserver's --watch-history-size); the default when 0.
	HistorySize int
	// ReaderLabels are the labels the member knows each reader's cluster by
	// (a member Secret's or ClusterProfile's): an export's scope selects
	// its readers by them.
	ReaderLabels map[string]map[string]string
}

func newNamespacedIndexer() cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// NewMember returns a member with no objects at all; Start runs its
// stores.
func NewMember(name string, opts MemberOptions) *Member {
	m := &Member{
		name:        name,
		clusterID:   uuid.NewUUID(),
		namespaces:  cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		pools:       newNamespacedIndexer(),
		services:    newNamespacedIndexer(),
		slices:      newNamespacedIndexer(),
		pods:        newNamespacedIndexer(),
		gateways:    newNamespacedIndexer(),
		tlsPolicies: newNamespacedIndexer(),
	}
	m.view = imports.Member{
		Name:               name,
		Namespaces:         corev1listers.NewNamespaceLister(m.namespaces),
		Pools:              poollisters.NewInferencePoolLister(m.pools),
		Services:           corev1listers.NewServiceLister(m.services),
		EndpointSlices:     discoverylisters.NewEndpointSliceLister(m.slices),
		Pods:               corev1listers.NewPodLister(m.pods),
		Gateways:           gatewaylisters.NewGatewayLister(m.gateways),
		BackendTLSPolicies: gatewaylisters.NewBackendTLSPolicyLister(m.tlsPolicies),
	}
	m.renew(opts)
	return m
}

// renew makes the member's stores afresh, empty: they compute their
// objects when they start, as a restarted mci-apiserver does.
func (m *Member) renew(opts MemberOptions) {
	cluster := memberCluster{member: m, clusterSet: opts.ClusterSetName}
	m.exports = virtual.NewStore(inferencepoolexportsummary.Resource{Index: cluster}, cluster, inferencepoolexportsummary.Describe().New)
	m.clusters = virtual.NewStore(inferenceclustersummary.Resource{LocalName: m.name}, cluster, inferenceclustersummary.Describe().New)
	for _, s := range []*virtual.Store{m.exports, m.clusters} {
		s.SetHistorySize(opts.HistorySize)
	}
	ready := func() error { return nil }
	m.exportsREST = virtual.NewREST(m.exports, inferencepoolexportsummary.Describe(), ready).
		WithVisibility(inferencepoolexportsummary.Visibility(readerLabels(opts.ReaderLabels)))
	m.clustersREST = virtual.NewREST(m.clusters, inferenceclustersummary.Describe(), ready)
}

// Name is the member's cluster name.
func (m *Member) Name() string { return m.name }

// Start runs the member's stores until Stop.
func (m *Member) Start(ctx context.Context) {
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range []*virtual.Store{m.exports, m.clusters} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Run(ctx)
		}()
	}
	go func() {
		wg.Wait()
		close(m.done)
	}()
}

// Stop ends the member's stores, and with them every watch of it.
func (m *Member) Stop() {
	if m.cancel == nil {
		return
	}
	m.cancel()
	<-m.done
}

// ResourceVersion is the member's latest resourceVersion.
func (m *Member) ResourceVersion() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rv
}

// Apply creates or replaces obj in the member, as a write to its
// kube-apiserver would: the object gets the member's next
// resourceVersion (and a uid and creationTimestamp when it is new). obj is
// copied. Kinds the summaries are not computed from are refused.
func (m *Member) Apply(obj runtime.Object) error {
	indexer, kind, err := m.indexerOf(obj)
	if err != nil {
		return err
	}
	obj = obj.DeepCopyObject()
	o, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, exists, err := indexer.Get(obj)
	if err != nil {
		return err
	}
	tracked := tracksGeneration(obj)
	if exists {
		prev, _ := meta.Accessor(old)
		o.SetUID(prev.GetUID())
		o.SetCreationTimestamp(prev.GetCreationTimestamp())
		if tracked {
			o.SetGeneration(prev.GetGeneration())
			if specChanged(old.(runtime.Object), obj) {
				o.SetGeneration(prev.GetGeneration() + 1)
			}
		}
	} else {
		o.SetUID(uuid.NewUUID())
		o.SetCreationTimestamp(metav1.NewTime(time.Now().Truncate(time.Second)))
		if tracked {
			o.SetGeneration(1)
		}
	}
	m.rv++
	o.SetResourceVersion(fmt.Sprint(m.rv))
	if err := indexer.Update(obj); err != nil {
		return err
	}
	m.notifyLocked(kind, obj, o)
	return nil
}

// tracksGeneration says whether a kube-apiserver keeps metadata.generation
// of obj: custom resources with a status subresource and EndpointSlices
// do; Namespaces, Services and Pods do not.
func tracksGeneration(obj runtime.Object) bool {
	switch obj.(type) {
	case *corev1.Namespace, *corev1.Service, *corev1.Pod:
		return false
	}
	return true
}

// specChanged says whether a write changes more than obj's metadata and
// status: what moves metadata.generation.
func specChanged(old, obj runtime.Object) bool {
	strip := func(o runtime.Object) map[string]interface{} {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil
		}
		delete(u, "metadata")
		delete(u, "status")
		return u
	}
	return !equality.Semantic.DeepEqual(strip(old), strip(obj))
}

// Delete removes obj (its kind, namespace and name) from the member.
// Deleting what is not there is not an error, and moves nothing.
func (m *Member) Delete(obj runtime.Object) error {
	indexer, kind, err := m.indexerOf(obj)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, exists, err := indexer.Get(obj)
	if err != nil || !exists {
		return err
	}
	if err := indexer.Delete(old); err != nil {
		return err
	}
	m.rv++
	o, _ := meta.Accessor(old)
	m.notifyLocked(kind, old.(runtime.Object), o)
	return nil
}

// notifyLocked tells the stores of a change, with what mci-apiserver's
// informer handlers put in its event (pkg/clusterset's watch).
func (m *Member) notifyLocked(kind clusterset.Kind, obj runtime.Object, o metav1.Object) {
	ev := clusterset.Event{Member: m.name, Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(), ResourceVersion: m.rv}
	if kind == clusterset.KindNamespace {
		ev.Namespace = o.GetName()
	}
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		ev.Service = s.Labels[discoveryv1.LabelServiceName]
	}
	m.exports.Notify(ev)
	m.clusters.Notify(ev)
}

func (m *Member) indexerOf(obj runtime.Object) (cache.Indexer, clusterset.Kind, error) {
	switch obj.(type) {
	case *corev1.Namespace:
		return m.namespaces, clusterset.KindNamespace, nil
	case *poolv1.InferencePool:
		return m.pools, clusterset.KindInferencePool, nil
	case *corev1.Service:
		return m.services, clusterset.KindService, nil
	case *discoveryv1.EndpointSlice:
		return m.slices, clusterset.KindEndpointSlice, nil
	case *corev1.Pod:
		return m.pods, clusterset.KindPod, nil
	case *gatewayv1.Gateway:
		return m.gateways, clusterset.KindGateway, nil
	case *gatewayv1.BackendTLSPolicy:
		return m.tlsPolicies, clusterset.KindBackendTLSPolicy, nil
	}
	return nil, 0, fmt.Errorf("member %s: summaries are not computed from a %T", m.name, obj)
}

// memberCluster is the ClusterSet as the member's own mci-apiserver sees
// it for its summaries: its own cluster, always listed. Other members
// change no summary (the stores are told of local events only), so they
// are left out.
type memberCluster struct {
	member     *Member
	clusterSet string
}

var (
	_ virtual.Snapshotter                  = memberCluster{}
	_ inferencepoolexportsummary.PoolIndex = memberCluster{}
)

func (c memberCluster) Snapshot() imports.ClusterSet {
	return imports.ClusterSet{Name: c.clusterSet, Local: c.member.name, Members: []imports.Member{c.member.view}}
}

func (c memberCluster) Ready() error { return nil }

func (c memberCluster) LocalName() string { return c.member.name }

// PoolsUsingService names every pool of the Service's namespace (a pool's
// EPP is of its own namespace), PoolsWithParent every pool (a parent may
// be of another namespace): a store recomputes them and passes on only
// those that changed, so a wider set than mci-apiserver's indexes find
// costs time, never an event.
func (c memberCluster) PoolsUsingService(_, namespace, _ string) []string {
	return c.poolsOf(namespace)
}

func (c memberCluster) PoolsWithParent(_, _, _ string) []string {
	return c.member.pools.ListKeys()
}

func (c memberCluster) poolsOf(namespace string) []string {
	objs, err := c.member.pools.ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		return nil
	}
	keys := make([]string, 0, len(objs))
	for _, o := range objs {
		p := o.(*poolv1.InferencePool)
		keys = append(keys, p.Namespace+"/"+p.Name)
	}
	return keys
}

// readerLabels is inferencepoolexportsummary.MemberLabels over a map.
type readerLabels map[string]map[string]string

func (r readerLabels) MemberLabels(name string) map[string]string { return r[name] }
