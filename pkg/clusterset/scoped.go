package clusterset

import (
	"context"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// poolNamespaces watches Services, EndpointSlices and Pods only in the namespaces
// where the member has InferencePools, with one namespace-scoped informer
// pair per such namespace. EPP Services live beside their pools (an
// endpointPickerRef names a Service of the pool's namespace), so this is
// everything the computation can read, and the cache grows with pools
// rather than with every Service of the cluster.
type poolNamespaces struct {
	kube kubernetes.Interface
	// watch passes an informer's changes on to deliver.
	watch func(informer cache.SharedIndexInformer, kind Kind, deliver Handler)
	// handler is told a namespace's events once it has listed (listed).
	handler Handler
	// podsAccessChanged is told when the member's credentials may not, or
	// may again, list a namespace's Pods (podaccess.go); it says so to
	// deliver.
	podsAccessChanged func(namespace string, since time.Time, deliver Handler)
	// bound registers, in a namespace's factory, the informers that list
	// within the member's limits (listquota.go).
	bound func(informers.SharedInformerFactory, string)

	mu   sync.RWMutex
	ctx  context.Context
	byNS map[string]*namespaceInformers
}

type namespaceInformers struct {
	cancel   context.CancelFunc
	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
	// pods: an export publishes the addresses of its pool's pods, which
	// live beside the pool too. Pods the member's credentials may not list
	// count as listed (access).
	pods   cache.SharedIndexInformer
	access podAccess

	// Every event of the namespace, its pools' included, is held until
	// all its watches have listed (listed), then passed on in order:
	// computed from a namespace cache still filling, an export would be
	// published once without its EPP's EndpointSlices (not Ready) or
	// without its Service, then Ready, a flap every importer and sidecar
	// sees. A watch that fails in a way the server reports (Pods it may
	// not list) counts as listed.
	handler Handler
	mu      sync.Mutex
	open    bool
	held    []Event
}

// listed is true once every watch of the namespace has listed, or failed
// in a way that is reported (podaccess.go).
func (n *namespaceInformers) listed() bool {
	return n.services.HasSynced() && n.slices.HasSynced() && (n.pods.HasSynced() || !n.access.denied().IsZero())
}

// hasSynced is true once the namespace has listed and its held events
// have been passed on.
func (n *namespaceInformers) hasSynced() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.open
}

// deliver passes ev on, or holds it while the namespace has not listed.
func (n *namespaceInformers) deliver(ev Event) {
	n.mu.Lock()
	if !n.open {
		n.held = append(n.held, ev)
		n.mu.Unlock()
		return
	}
	n.mu.Unlock()
	n.handler(ev)
}

// openWhenListed passes the held events on once the namespace has listed,
// and every later one as it comes; a namespace no longer watched (ctx)
// drops them.
func (n *namespaceInformers) openWhenListed(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), n.listed) {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	// Under the lock, so that an event that comes meanwhile is passed on
	// after these (the handler does not block).
	for _, ev := range n.held {
		n.handler(ev)
	}
	n.held, n.open = nil, true
}

func newPoolNamespaces(ctx context.Context, kube kubernetes.Interface, watch func(cache.SharedIndexInformer, Kind, Handler), handler Handler, bound func(informers.SharedInformerFactory, string), podsAccessChanged func(string, time.Time, Handler)) *poolNamespaces {
	return &poolNamespaces{kube: kube, watch: watch, handler: handler, bound: bound, podsAccessChanged: podsAccessChanged, ctx: ctx, byNS: map[string]*namespaceInformers{}}
}

// ensure watches namespace; it returns the namespace's informers, whose
// events are held until it has listed (namespaceInformers.deliver).
func (p *poolNamespaces) ensure(namespace string) *namespaceInformers {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n, ok := p.byNS[namespace]; ok {
		return n
	}
	ctx, cancel := context.WithCancel(p.ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(p.kube, 0, informers.WithNamespace(namespace), informers.WithTransform(trim))
	if p.bound != nil {
		p.bound(factory, namespace)
	}
	n := &namespaceInformers{
		cancel:   cancel,
		services: factory.Core().V1().Services().Informer(),
		slices:   factory.Discovery().V1().EndpointSlices().Informer(),
		pods:     factory.Core().V1().Pods().Informer(),
		handler:  p.handler,
	}
	p.watch(n.services, KindService, n.deliver)
	p.watch(n.slices, KindEndpointSlice, n.deliver)
	p.watch(n.pods, KindPod, n.deliver)
	followPodAccess(namespace, n, func(namespace string, since time.Time) { p.podsAccessChanged(namespace, since, n.deliver) })
	factory.StartWithContext(ctx)
	go n.openWhenListed(ctx)
	p.byNS[namespace] = n
	return n
}

// release stops watching namespace.
func (p *poolNamespaces) release(namespace string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n, ok := p.byNS[namespace]; ok {
		n.cancel()
		delete(p.byNS, namespace)
	}
}

func (p *poolNamespaces) hasSynced() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, n := range p.byNS {
		if !n.hasSynced() {
			return false
		}
	}
	return true
}

// indexers returns the store of one resource for each watched namespace,
// sorted by namespace, or only namespace's when it is not empty.
func (p *poolNamespaces) indexers(namespace string, pick func(*namespaceInformers) cache.SharedIndexInformer) []cache.Indexer {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if namespace != "" {
		if n, ok := p.byNS[namespace]; ok {
			return []cache.Indexer{pick(n).GetIndexer()}
		}
		return nil
	}
	names := make([]string, 0, len(p.byNS))
	for ns := range p.byNS {
		names = append(names, ns)
	}
	sort.Strings(names)
	out := make([]cache.Indexer, 0, len(names))
	for _, ns := range names {
		out = append(out, pick(p.byNS[ns]).GetIndexer())
	}
	return out
}

func pickServices(n *namespaceInformers) cache.SharedIndexInformer { return n.services }
func pickSlices(n *namespaceInformers) cache.SharedIndexInformer   { return n.slices }
func pickPods(n *namespaceInformers) cache.SharedIndexInformer     { return n.pods }

// emptyIndexer answers for namespaces without pools: nothing there.
var emptyIndexer = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})

func (p *poolNamespaces) indexer(namespace string, pick func(*namespaceInformers) cache.SharedIndexInformer) cache.Indexer {
	if idx := p.indexers(namespace, pick); len(idx) == 1 {
		return idx[0]
	}
	return emptyIndexer
}

// serviceLister lists Services across the watched namespaces.
type serviceLister struct{ p *poolNamespaces }

var _ corev1listers.ServiceLister = serviceLister{}

func (l serviceLister) List(selector labels.Selector) ([]*corev1.Service, error) {
	var out []*corev1.Service
	for _, idx := range l.p.indexers("", pickServices) {
		items, err := corev1listers.NewServiceLister(idx).List(selector)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
	}
	return out, nil
}

func (l serviceLister) Services(namespace string) corev1listers.ServiceNamespaceLister {
	return corev1listers.NewServiceLister(l.p.indexer(namespace, pickServices)).Services(namespace)
}

// endpointSliceLister lists EndpointSlices across the watched namespaces.
type endpointSliceLister struct{ p *poolNamespaces }

var _ discoverylisters.EndpointSliceLister = endpointSliceLister{}

func (l endpointSliceLister) List(selector labels.Selector) ([]*discoveryv1.EndpointSlice, error) {
	var out []*discoveryv1.EndpointSlice
	for _, idx := range l.p.indexers("", pickSlices) {
		items, err := discoverylisters.NewEndpointSliceLister(idx).List(selector)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
	}
	return out, nil
}

func (l endpointSliceLister) EndpointSlices(namespace string) discoverylisters.EndpointSliceNamespaceLister {
	return discoverylisters.NewEndpointSliceLister(l.p.indexer(namespace, pickSlices)).EndpointSlices(namespace)
}

// podLister lists Pods across the watched namespaces.
type podLister struct{ p *poolNamespaces }

var _ corev1listers.PodLister = podLister{}

func (l podLister) List(selector labels.Selector) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, idx := range l.p.indexers("", pickPods) {
		items, err := corev1listers.NewPodLister(idx).List(selector)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
	}
	return out, nil
}

// Pods fails for a namespace whose Pods the member's credentials have
// never let this server list: its pools then publish no addresses, with
// the reason, rather than an empty list that looks like no pods.
func (l podLister) Pods(namespace string) corev1listers.PodNamespaceLister {
	l.p.mu.RLock()
	n := l.p.byNS[namespace]
	l.p.mu.RUnlock()
	if n != nil && !n.pods.HasSynced() {
		if since := n.access.denied(); !since.IsZero() {
			return deniedPods{err: podsDeniedError(namespace, since)}
		}
	}
	return corev1listers.NewPodLister(l.p.indexer(namespace, pickPods)).Pods(namespace)
}

// podsDenied returns the namespaces whose Pods the member's credentials
// may not list, sorted.
func (p *poolNamespaces) podsDenied() []string {
	if p == nil {
		return nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []string
	for ns, n := range p.byNS {
		if !n.access.denied().IsZero() {
			out = append(out, ns)
		}
	}
	sort.Strings(out)
	return out
}
