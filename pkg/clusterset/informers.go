package clusterset

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/mci-dev/mci/pkg/servedapis"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gatewayinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gatewaylisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	gatewaylistersv1beta1 "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1beta1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mciinformers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
	poollisters "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
)

// The optional resources of a member, as API discovery names them: a
// member without the InferencePool CRD or the Gateway API serves them as
// empty rather than blocking its sync forever.
var (
	apiInferencePools     = poolv1.SchemeGroupVersion.WithResource("inferencepools")
	apiGateways           = gatewayv1.SchemeGroupVersion.WithResource("gateways")
	apiBackendTLSPolicies = gatewayv1.SchemeGroupVersion.WithResource("backendtlspolicies")
	apiHTTPRoutes         = gatewayv1.SchemeGroupVersion.WithResource("httproutes")
	apiReferenceGrants    = gatewayv1beta1.SchemeGroupVersion.WithResource("referencegrants")
)

// optionalAPIs are the optional resources the member is asked about:
// HTTPRoutes and ReferenceGrants are watched in the local cluster only.
func (m *member) optionalAPIs() []schema.GroupVersionResource {
	apis := []schema.GroupVersionResource{apiInferencePools, apiGateways, apiBackendTLSPolicies}
	if m.local {
		apis = append(apis, apiHTTPRoutes, apiReferenceGrants)
	} else if m.summaryPolicy != SummariesNever {
		apis = append(apis, apiExportSummaries, apiClusterSummaries)
	}
	return apis
}

// start asks the member which APIs it serves, once, and begins watching
// and probing it (startWith).
func (m *member) start(ctx context.Context, th thresholds) {
	logger := klog.FromContext(ctx).WithValues("member", m.name)
	m.startWith(ctx, th, m.discover(klog.NewContext(ctx, logger)))
}

// discover asks the member which optional APIs it serves (optionalAPIs).
// Its discovery client is made from the configuration newMember made one
// from; should it fail all the same, every optional API is taken as
// served because it could not be asked, as when the member cannot answer.
func (m *member) discover(ctx context.Context) servedapis.Set {
	d, err := m.discoveryClient()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot make the member's discovery client")
		return servedapis.Unasked(m.optionalAPIs()...)
	}
	return servedapis.Discover(ctx, d, discoveryTimeout, m.optionalAPIs()...)
}

// startWith begins watching and probing the member, in the mode what it
// serves calls for (modeOf); a member still discovering is only probed.
func (m *member) startWith(ctx context.Context, th thresholds, served servedapis.Set) {
	ctx, m.cancel = context.WithCancel(ctx)
	m.ctx = ctx
	m.done = make(chan struct{})
	m.th = th
	logger := klog.FromContext(ctx).WithValues("member", m.name)
	// The informers stop on their own when the member is frozen
	// (quota.go): the probe goes on.
	informerCtx, stopInformers := context.WithCancel(ctx)
	m.quota.onFreeze(stopInformers)

	mode := m.modeOf(served)
	if mode == modeFull {
		if err := m.objectClients(); err != nil {
			// Not expected: the member's other clients were made from the
			// same configuration. It is read as a member whose discovery
			// cannot be asked, which its mode metric says, and asked again
			// with backoff.
			logger.Error(err, "Cannot make the clients that watch the member's objects; asking again")
			mode = modeDiscovering
		}
	}
	var starters []func(context.Context)
	switch m.mode = mode; m.mode {
	case modeSummary:
		starters = append(starters, m.summaryInformers(logger))
	case modeFull:
		starters = m.objectInformers(informerCtx, served, logger)
	case modeDiscovering:
		m.synced = []cache.InformerSynced{discoveringSynced}
		logger.Info("The member's API discovery cannot be asked whether it publishes summaries; asking again with backoff before reading it")
	}
	for _, start := range starters {
		start(informerCtx)
	}

	m.startProbes(ctx, m.probeClient, th)
	go func() {
		started := time.Now()
		if cache.WaitForCacheSync(ctx.Done(), m.hasSynced) {
			logger.Info("Member listed", "after", time.Since(started).Round(time.Millisecond))
		}
	}()
	logger.V(2).Info("Watching member")
}

// objectInformers watches the member's objects (full mode, and always the
// local cluster); it returns what starts the informers.
func (m *member) objectInformers(ctx context.Context, served servedapis.Set, logger klog.Logger) []func(context.Context) {
	transform := trimOther
	if m.local {
		transform = trim
	}
	starters := []func(context.Context){m.kubeInformers(ctx, transform)}
	if start := m.poolInformer(served, transform, logger); start != nil {
		starters = append(starters, start)
	}
	return append(starters, m.gatewayInformers(served, transform, logger))
}

// kubeInformers watches the member's Namespaces, and the Services,
// EndpointSlices and Pods of the namespaces that hold pools (poolNamespaces); it
// returns what starts the Namespace informer.
func (m *member) kubeInformers(ctx context.Context, transform cache.TransformFunc) func(context.Context) {
	kubeFactory := informers.NewSharedInformerFactoryWithOptions(m.kube, 0, informers.WithTransform(transform))
	if m.quota != nil {
		kubeFactory.InformerFor(&corev1.Namespace{}, boundedInformer[kubernetes.Interface](m, KindNamespace, "", &corev1.Namespace{}, m.kube.CoreV1().Namespaces(), transform))
	}
	nsInformer := kubeFactory.Core().V1().Namespaces()
	m.namespaces = nsInformer.Lister()
	m.watch(nsInformer.Informer(), KindNamespace)
	m.synced = append(m.synced, nsInformer.Informer().HasSynced)
	m.poolNamespaces = newPoolNamespaces(ctx, m.kube, m.watchTo, m.handler, m.boundNamespaceInformers, m.podsAccessChanged)
	m.services = serviceLister{m.poolNamespaces}
	m.endpointSlices = endpointSliceLister{m.poolNamespaces}
	m.pods = podLister{m.poolNamespaces}
	return kubeFactory.StartWithContext
}

// poolInformer watches the member's InferencePools, indexed (indexes.go);
// it returns what starts the informer. A member that does not serve them
// has none: an empty index, and nothing to start (nil).
func (m *member) poolInformer(served servedapis.Set, transform cache.TransformFunc, logger klog.Logger) func(context.Context) {
	if !served.Has(apiInferencePools) {
		indexers := poolIndexers()
		indexers[cache.NamespaceIndex] = cache.MetaNamespaceIndexFunc
		m.poolIndexer = cache.NewIndexer(cache.MetaNamespaceKeyFunc, indexers)
		m.pools = poollisters.NewInferencePoolLister(m.poolIndexer)
		return nil
	}
	f := mciinformers.NewSharedInformerFactoryWithOptions(m.mci, 0, mciinformers.WithTransform(transform))
	if m.quota != nil {
		f.InformerFor(&poolv1.InferencePool{}, boundedInformer[mciclient.Interface](m, KindInferencePool, "", &poolv1.InferencePool{}, m.mci.InferencePoolV1().InferencePools(""), transform))
	}
	inf := f.InferencePool().V1().InferencePools()
	if err := inf.Informer().AddIndexers(poolIndexers()); err != nil {
		logger.Error(err, "Adding pool indexers")
	}
	m.pools = inf.Lister()
	m.poolIndexer = inf.Informer().GetIndexer()
	m.watch(inf.Informer(), KindInferencePool)
	m.synced = append(m.synced, inf.Informer().HasSynced)
	return f.StartWithContext
}

// gatewayInformers watches the member's Gateways and BackendTLSPolicies,
// and in the local cluster its HTTPRoutes and ReferenceGrants, of those it
// serves; it returns what starts them.
func (m *member) gatewayInformers(served servedapis.Set, transform cache.TransformFunc, logger klog.Logger) func(context.Context) {
	gw := gatewayinformers.NewSharedInformerFactoryWithOptions(m.gateway, 0, gatewayinformers.WithTransform(transform))
	if served.Has(apiGateways) {
		if m.quota != nil {
			gw.InformerFor(&gatewayv1.Gateway{}, boundedInformer[gatewayclient.Interface](m, KindGateway, "", &gatewayv1.Gateway{}, m.gateway.GatewayV1().Gateways(""), transform))
		}
		inf := gw.Gateway().V1().Gateways()
		m.gateways = inf.Lister()
		m.watch(inf.Informer(), KindGateway)
		m.synced = append(m.synced, inf.Informer().HasSynced)
	} else {
		m.gateways = gatewaylisters.NewGatewayLister(newNamespacedIndexer(nil))
	}
	if served.Has(apiBackendTLSPolicies) {
		if m.quota != nil {
			gw.InformerFor(&gatewayv1.BackendTLSPolicy{}, boundedInformer[gatewayclient.Interface](m, KindBackendTLSPolicy, "", &gatewayv1.BackendTLSPolicy{}, m.gateway.GatewayV1().BackendTLSPolicies(""), transform))
		}
		inf := gw.Gateway().V1().BackendTLSPolicies()
		m.backendTLSPolicies = inf.Lister()
		m.watch(inf.Informer(), KindBackendTLSPolicy)
		m.synced = append(m.synced, inf.Informer().HasSynced)
	}
	if m.local {
		m.routeInformers(gw, served, logger)
	}
	return gw.StartWithContext
}

// boundNamespaceInformers makes the Services and EndpointSlices informers of
// a namespace of the member's pools list within its limits (listquota.go);
// the local cluster's are not bounded.
func (m *member) boundNamespaceInformers(f informers.SharedInformerFactory, namespace string) {
	if m.quota == nil {
		return
	}
	f.InformerFor(&corev1.Service{}, boundedInformer[kubernetes.Interface](m, KindService, namespace, &corev1.Service{}, m.kube.CoreV1().Services(namespace), trim))
	f.InformerFor(&discoveryv1.EndpointSlice{}, boundedInformer[kubernetes.Interface](m, KindEndpointSlice, namespace, &discoveryv1.EndpointSlice{}, m.kube.DiscoveryV1().EndpointSlices(namespace), trim))
	f.InformerFor(&corev1.Pod{}, boundedInformer[kubernetes.Interface](m, KindPod, namespace, &corev1.Pod{}, m.kube.CoreV1().Pods(namespace), trim))
}

// routeInformers watches the HTTPRoutes and ReferenceGrants of the
// local cluster: what makes an import's parents. Without the Gateway API's
// HTTPRoute (or ReferenceGrant) the cluster has none, and the imports it
// serves list no parents (no cross-namespace route is permitted); that is
// said once in the log.
func (m *member) routeInformers(gw gatewayinformers.SharedInformerFactory, served servedapis.Set, logger klog.Logger) {
	if served.Has(apiHTTPRoutes) {
		inf := gw.Gateway().V1().HTTPRoutes().Informer()
		if err := inf.AddIndexers(routeIndexers()); err != nil {
			logger.Error(err, "Adding HTTPRoute indexers")
		}
		m.routeIndexer = inf.GetIndexer()
		m.watchRoutes(inf)
		m.synced = append(m.synced, inf.HasSynced)
	} else {
		logger.Info("The local cluster does not serve HTTPRoutes; imports will list no parents", "groupVersion", apiHTTPRoutes.GroupVersion().String())
		m.routeIndexer = newNamespacedIndexer(routeIndexers())
	}
	if served.Has(apiReferenceGrants) {
		inf := gw.Gateway().V1beta1().ReferenceGrants()
		m.grants = inf.Lister()
		m.watch(inf.Informer(), KindReferenceGrant)
		m.synced = append(m.synced, inf.Informer().HasSynced)
	} else {
		logger.Info("The local cluster does not serve ReferenceGrants; no HTTPRoute may use an import of another namespace", "groupVersion", apiReferenceGrants.GroupVersion().String())
		m.grants = gatewaylistersv1beta1.NewReferenceGrantLister(newNamespacedIndexer(nil))
	}
}

// watchRoutes passes HTTPRoute changes on as Events that name the imports
// the route used before and after the change: a route that stops using an
// import must still recompute it. Changes of routes that use no import, before
// or after, are not passed on.
func (m *member) watchRoutes(informer cache.SharedIndexInformer) {
	notify := func(old, obj interface{}) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		r, ok := obj.(*gatewayv1.HTTPRoute)
		if !ok {
			return
		}
		keys := imports.ImportBackendRefs(r)
		if o, ok := old.(*gatewayv1.HTTPRoute); ok {
			for _, k := range imports.ImportBackendRefs(o) {
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
		if len(keys) == 0 {
			return
		}
		rv, ok := m.resourceVersion(r.ResourceVersion)
		if !ok {
			return
		}
		m.handler(Event{Member: m.name, Kind: KindHTTPRoute, Namespace: r.Namespace, Name: r.Name, ResourceVersion: rv, Imports: keys})
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { notify(nil, obj) },
		UpdateFunc: func(old, obj interface{}) { notify(old, obj) },
		DeleteFunc: func(obj interface{}) { notify(nil, obj) },
	})
}

// watch passes the informer's changes on as Events. Informers the member
// starts once also count towards hasSynced; the per-namespace ones are
// tracked by poolNamespaces.
func (m *member) watch(informer cache.SharedIndexInformer, kind Kind) {
	m.watchTo(informer, kind, m.handler)
}

// watchTo passes the informer's changes on to deliver as Events, but for
// InferencePools (poolEvent).
func (m *member) watchTo(informer cache.SharedIndexInformer, kind Kind, deliver Handler) {
	notify := func(obj interface{}, deleted, changed bool) {
		// A deletion seen only through a relist carries the object's last
		// known resourceVersion, not the member's at its deletion: its
		// event has none (0), so that a watch resumed on another replica
		// cannot take it as covered by a version it has seen.
		throughRelist := false
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj, throughRelist = d.Obj, true
		}
		o, err := meta.Accessor(obj)
		if err != nil {
			return
		}
		rv, ok := m.resourceVersion(o.GetResourceVersion())
		if !ok || !m.admit(kind, o.GetNamespace(), o.GetName(), obj, deleted, changed) {
			return
		}
		if throughRelist {
			rv = 0
		}
		ev := Event{Member: m.name, Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(), ResourceVersion: rv}
		if kind == KindNamespace {
			ev.Namespace = o.GetName()
		}
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
			ev.Service = s.Labels[discoveryv1.LabelServiceName]
		}
		if kind == KindInferencePool {
			m.poolEvent(ev, deleted)
			return
		}
		deliver(ev)
	}
	_, _ = informer.AddEventHandler(countedHandler(notify))
}

// countedHandler calls notify with each change, whether it was a deletion,
// and whether the member sent it: an object of the initial list, or one a
// relist replays unchanged (same resourceVersion), does not count towards
// the member's event rate.
func countedHandler(notify func(obj interface{}, deleted, changed bool)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, initial bool) { notify(obj, false, !initial) },
		UpdateFunc: func(old, obj interface{}) {
			notify(obj, false, resourceVersionOf(old) != resourceVersionOf(obj))
		},
		DeleteFunc: func(obj interface{}) { notify(obj, true, true) },
	}
}

func resourceVersionOf(obj interface{}) string {
	o, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return o.GetResourceVersion()
}

// poolEvent keeps the Services, EndpointSlices and Pods of the pool's
// namespace watched while the namespace has pools, and passes the event on
// as one of that namespace: held until it has listed (scoped.go). The
// deletion of its last pool is passed on at once: nothing is computed from
// the namespace's caches any more.
func (m *member) poolEvent(ev Event, deleted bool) {
	if deleted {
		if pools, err := m.poolIndexer.ByIndex(cache.NamespaceIndex, ev.Namespace); err == nil && len(pools) == 0 {
			m.poolNamespaces.release(ev.Namespace)
			m.handler(ev)
			return
		}
	}
	m.poolNamespaces.ensure(ev.Namespace).deliver(ev)
}
