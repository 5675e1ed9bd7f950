package sidecar

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// Clients are the clients of the local cluster the sidecar reads. MCI must
// reach the aggregated API for InferencePoolImports (the cluster's own
// kube-apiserver does).
type Clients struct {
	Kube    kubernetes.Interface
	MCI     versioned.Interface
	Gateway gatewayclient.Interface
}

// WatchConfig is what the table is built with besides the cluster's objects.
type WatchConfig struct {
	LocalCluster string
	// LocalRegion is this cluster's region (Inputs.LocalRegion).
	LocalRegion   string
	DefaultPolicy routingpolicy.Config
	// DefaultTransport is the mode of each EPP port that nothing else
	// decides (see Inputs.DefaultTransport).
	DefaultTransport eppaddr.TransportModes
	// RemoteEndpointPickers says whether other clusters' EPPs are reached
	// over verified TLS only, and which imports may do without.
	RemoteEndpointPickers routetable.RemoteEndpointPickers
	// Gateways are the Gateways the sidecar serves (namespace/name): only
	// the HTTPRoutes their listeners accept are routed. Empty: every HTTPRoute.
	Gateways []types.NamespacedName
	// EndpointPickerServices are the sidecar's own Services: set, the
	// sidecar is an EPP shim for the InferencePools that name them.
	EndpointPickerServices []types.NamespacedName
	// InferenceModels, when true, reads the InferenceModels and the
	// InferenceObjectives (inference.networking.x-k8s.io and llm-d.ai) of
	// the cluster to know the criticality of requests (for MetricsBased
	// shedding). When false every request is Standard and never shed.
	InferenceModels bool
	// BackendTLSPolicies, when true, reads the cluster's BackendTLSPolicies
	// (gateway.networking.k8s.io/v1) for the TLS of local EPPs; the table
	// waits for them, so that no local EPP is reached unverified for want
	// of its policy. False for a cluster without their CRD.
	BackendTLSPolicies bool
}

// Watcher keeps the Router's table built from informers: HTTPRoutes and
// ReferenceGrants (Gateway API), the served Gateways and the Namespaces
// when it serves Gateways, InferencePoolImports (served by mci-apiserver through the
// aggregation layer), InferencePools, Services (for local EPPs) and
// optionally InferenceModels. Event handlers only record which object
// changed; a single goroutine reads those objects from the caches, hands
// them to an Incremental builder, which redoes only what they touch, and
// publishes the new table when routing changed. Events arriving during a
// build coalesce into the next one, and the table a request sees is at
// most one build behind the caches.
type Watcher struct {
	clients   Clients
	cfg       WatchConfig
	router    *routetable.Router
	onPublish func(t *routetable.Table, took time.Duration)
	watches   *informerhealth.Tracker

	synced   chan struct{}
	syncOnce sync.Once

	// changes holds the objects changed since the last build, each once.
	changes workqueue.TypedInterface[objectChange]
}

// The kinds of objects the watcher follows.
type objectKind int8

const (
	kindRoute objectKind = iota
	kindImport
	kindPool
	kindService
	kindModel
	kindGateway
	kindNamespace
	kindReferenceGrant
	kindObjective
	kindLLMDObjective
	kindBackendTLSPolicy
)

// objectChange says that the object of a kind with a key (namespace/name)
// changed: the current state is read from the cache.
type objectChange struct {
	kind objectKind
	key  string
}

// NewWatcher returns a watcher that publishes to router. onPublish, when
// set, is called after each publication (to retarget the health prober and
// metrics scraper, record metrics). watches follows whether each informer
// lists and watches; nil: one whose metrics are not registered.
func NewWatcher(clients Clients, cfg WatchConfig, router *routetable.Router, onPublish func(t *routetable.Table, took time.Duration), watches *informerhealth.Tracker) *Watcher {
	if watches == nil {
		watches = informerhealth.NewTracker("mci_sidecar")
	}
	return &Watcher{clients: clients, cfg: cfg, router: router, onPublish: onPublish, watches: watches, synced: make(chan struct{}), changes: workqueue.NewTyped[objectChange]()}
}

// Synced is closed once the first table built from synced caches is
// published.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Run watches and rebuilds until ctx ends: it starts the informers, waits
// for the caches the table needs, then builds the table and publishes it
// at each change.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.changes.ShutDown()
	go func() {
		<-ctx.Done()
		w.changes.ShutDown()
	}()
	informers := w.informers()
	synced, err := w.handle(informers)
	if err != nil {
		return err
	}
	// The informers stop before Run returns.
	defer informerhealth.Start(ctx, slices.Collect(maps.Values(informers))...)()
	klog.FromContext(ctx).Info("Waiting for the caches of HTTPRoutes, ReferenceGrants, InferencePoolImports, InferencePools and Services, and of Gateways and Namespaces when serving Gateways", "gateways", w.cfg.Gateways)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	w.build(ctx, informers)
	return nil
}

// informers are the informers of the kinds the table is built from, as
// the configuration asks for them.
func (w *Watcher) informers() map[objectKind]cache.SharedIndexInformer {
	kube, mci, gw := w.clients.Kube, w.clients.MCI, w.clients.Gateway
	// Each informer is built by the tracker, which logs and counts the
	// losses of its list and watch: the table keeps what the caches last
	// read meanwhile.
	watched := func(resource schema.GroupResource, lw cache.ListerWatcher, example runtime.Object) cache.SharedIndexInformer {
		return w.watches.NewInformer(resource.String(), lw, example)
	}
	informers := map[objectKind]cache.SharedIndexInformer{
		kindService: watched(corev1.Resource("services"), informerhealth.ListWatch(kube, kube.CoreV1().Services(metav1.NamespaceAll).List, kube.CoreV1().Services(metav1.NamespaceAll).Watch), &corev1.Service{}),
		kindRoute:   watched(gatewayv1.Resource("httproutes"), informerhealth.ListWatch(gw, gw.GatewayV1().HTTPRoutes(metav1.NamespaceAll).List, gw.GatewayV1().HTTPRoutes(metav1.NamespaceAll).Watch), &gatewayv1.HTTPRoute{}),
		kindImport:  watched(v1alpha1.Resource("inferencepoolimports"), informerhealth.ListWatch(mci, mci.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll).List, mci.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll).Watch), &v1alpha1.InferencePoolImport{}),
		kindPool:    watched(poolv1.Resource("inferencepools"), informerhealth.ListWatch(mci, mci.InferencePoolV1().InferencePools(metav1.NamespaceAll).List, mci.InferencePoolV1().InferencePools(metav1.NamespaceAll).Watch), &poolv1.InferencePool{}),
		// What allows a backendRef to another namespace.
		kindReferenceGrant: watched(gatewayv1beta1.Resource("referencegrants"), informerhealth.ListWatch(gw, gw.GatewayV1beta1().ReferenceGrants(metav1.NamespaceAll).List, gw.GatewayV1beta1().ReferenceGrants(metav1.NamespaceAll).Watch), &gatewayv1beta1.ReferenceGrant{}),
	}
	if len(w.cfg.Gateways) > 0 {
		// The served Gateways' listeners decide which routes attach, some
		// by the labels of the routes' namespaces.
		informers[kindGateway] = watched(gatewayv1.Resource("gateways"), informerhealth.ListWatch(gw, gw.GatewayV1().Gateways(metav1.NamespaceAll).List, gw.GatewayV1().Gateways(metav1.NamespaceAll).Watch), &gatewayv1.Gateway{})
		informers[kindNamespace] = watched(corev1.Resource("namespaces"), informerhealth.ListWatch(kube, kube.CoreV1().Namespaces().List, kube.CoreV1().Namespaces().Watch), &corev1.Namespace{})
	}
	// The routing table waits for these; InferenceModels and
	// InferenceObjectives only refine criticality, so a cluster without
	// their CRDs must not keep the sidecar from routing: their informers are
	// not waited for.
	if w.cfg.InferenceModels {
		informers[kindModel] = watched(v1alpha2.Resource("inferencemodels"), informerhealth.ListWatch(mci, mci.InferenceV1alpha2().InferenceModels(metav1.NamespaceAll).List, mci.InferenceV1alpha2().InferenceModels(metav1.NamespaceAll).Watch), &v1alpha2.InferenceModel{})
		informers[kindObjective] = watched(v1alpha2.Resource("inferenceobjectives"), informerhealth.ListWatch(mci, mci.InferenceV1alpha2().InferenceObjectives(metav1.NamespaceAll).List, mci.InferenceV1alpha2().InferenceObjectives(metav1.NamespaceAll).Watch), &v1alpha2.InferenceObjective{})
		informers[kindLLMDObjective] = watched(llmdv1alpha2.Resource("inferenceobjectives"), informerhealth.ListWatch(mci, mci.LLMDV1alpha2().InferenceObjectives(metav1.NamespaceAll).List, mci.LLMDV1alpha2().InferenceObjectives(metav1.NamespaceAll).Watch), &llmdv1alpha2.InferenceObjective{})
	}
	if w.cfg.BackendTLSPolicies {
		informers[kindBackendTLSPolicy] = watched(gatewayv1.Resource("backendtlspolicies"), informerhealth.ListWatch(gw, gw.GatewayV1().BackendTLSPolicies(metav1.NamespaceAll).List, gw.GatewayV1().BackendTLSPolicies(metav1.NamespaceAll).Watch), &gatewayv1.BackendTLSPolicy{})
	}
	return informers
}

// handle makes each informer queue the objects it changes, and returns
// what tells that the caches the table waits for have synced.
func (w *Watcher) handle(informers map[objectKind]cache.SharedIndexInformer) ([]cache.InformerSynced, error) {
	var synced []cache.InformerSynced
	for kind, inf := range informers {
		if err := inf.SetTransform(informerhealth.StripManagedFields); err != nil {
			return nil, err
		}
		reg, err := inf.AddEventHandler(w.handler(kind))
		if err != nil {
			return nil, err
		}
		if kind != kindModel && kind != kindObjective && kind != kindLLMDObjective {
			// The registration has synced once the handler got every
			// object of the initial list.
			synced = append(synced, reg.HasSynced)
		}
	}
	return synced, nil
}

// build builds the table from the informers' caches, publishes it, and
// again at each batch of changes, until the queue shuts down.
func (w *Watcher) build(ctx context.Context, informers map[objectKind]cache.SharedIndexInformer) {
	logger := klog.FromContext(ctx)
	inc := routetable.NewIncremental(routetable.Inputs{
		LocalCluster: w.cfg.LocalCluster, LocalRegion: w.cfg.LocalRegion, DefaultPolicy: w.cfg.DefaultPolicy, DefaultTransport: w.cfg.DefaultTransport, ServedGateways: w.cfg.Gateways,
		EndpointPickerServices: w.cfg.EndpointPickerServices, RemoteEndpointPickers: w.cfg.RemoteEndpointPickers,
	})
	var lastErrs []string
	for {
		start := time.Now()
		// Every change queued so far goes into this build; a change that
		// comes while it is applied is queued again for the next one.
		batch := w.changes.Len()
		for range batch {
			ch, _ := w.changes.Get()
			if err := apply(inc, informers[ch.kind].GetIndexer(), ch); err != nil {
				logger.Error(err, "Reading a cache", "key", ch.key)
			}
			w.changes.Done(ch)
		}
		t, fresh := inc.Table()
		if fresh {
			w.router.Publish(t)
			took := time.Since(start)
			if w.onPublish != nil {
				w.onPublish(t, took)
			}
			lastErrs = logProblems(logger, t, t.Errors, lastErrs)
			logger.V(4).Info("Published routing table", "generation", t.Generation, "rules", len(t.Rules()), "changes", batch, "took", took)
		}
		w.syncOnce.Do(func() { close(w.synced) })
		// Wait for the next change without taking it.
		if !w.waitForChange() {
			return
		}
	}
}

// waitForChange blocks until a change is queued (true) or the queue is
// shut down (false), and leaves the change queued.
func (w *Watcher) waitForChange() bool {
	ch, shutdown := w.changes.Get()
	if shutdown {
		return false
	}
	w.changes.Done(ch)
	w.changes.Add(ch)
	return true
}

// handler queues the changed object's key, which wakes the build loop.
func (w *Watcher) handler(kind objectKind) cache.ResourceEventHandler {
	record := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		w.changes.Add(objectChange{kind: kind, key: key})
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: record,
	}
}

// apply hands the current state of a changed object to the builder.
func apply(inc *routetable.Incremental, store cache.Store, ch objectChange) error {
	obj, exists, err := store.GetByKey(ch.key)
	if err != nil {
		return err
	}
	ns, name, err := cache.SplitMetaNamespaceKey(ch.key)
	if err != nil {
		return err
	}
	if int(ch.kind) >= len(appliers) {
		return nil
	}
	a := appliers[ch.kind]
	if !exists || !a.set(inc, obj) {
		a.remove(inc, types.NamespacedName{Namespace: ns, Name: name})
	}
	return nil
}

// applier is how the builder learns of one kind's objects: set hands it
// one (false when obj is not of the kind), remove says one is gone.
type applier struct {
	set    func(inc *routetable.Incremental, obj any) bool
	remove func(inc *routetable.Incremental, k types.NamespacedName)
}

// appliers are each watched kind's, by objectKind.
var appliers = [...]applier{
	kindRoute:            {setter((*routetable.Incremental).SetRoute), (*routetable.Incremental).DeleteRoute},
	kindImport:           {setter((*routetable.Incremental).SetImport), (*routetable.Incremental).DeleteImport},
	kindPool:             {setter((*routetable.Incremental).SetPool), (*routetable.Incremental).DeletePool},
	kindService:          {setter((*routetable.Incremental).SetService), (*routetable.Incremental).DeleteService},
	kindModel:            {setter((*routetable.Incremental).SetModel), (*routetable.Incremental).DeleteModel},
	kindGateway:          {setter((*routetable.Incremental).SetGateway), (*routetable.Incremental).DeleteGateway},
	kindReferenceGrant:   {setter((*routetable.Incremental).SetReferenceGrant), (*routetable.Incremental).DeleteReferenceGrant},
	kindBackendTLSPolicy: {setter((*routetable.Incremental).SetBackendTLSPolicy), (*routetable.Incremental).DeleteBackendTLSPolicy},
	// A namespace is known by its name alone.
	kindNamespace: {setter((*routetable.Incremental).SetNamespace), func(inc *routetable.Incremental, k types.NamespacedName) { inc.DeleteNamespace(k.Name) }},
	// Objectives of either API group are one kind to the builder, keyed
	// with their group.
	kindObjective: {setter((*routetable.Incremental).SetObjective), func(inc *routetable.Incremental, k types.NamespacedName) {
		inc.DeleteObjective(routetable.KeyOfObjective(v1alpha2.SchemeGroupVersion.String(), k))
	}},
	kindLLMDObjective: {
		func(inc *routetable.Incremental, obj any) bool {
			o, ok := obj.(*llmdv1alpha2.InferenceObjective)
			if ok {
				inc.SetObjective(requestmodel.ObjectiveFromLLMD(o))
			}
			return ok
		},
		func(inc *routetable.Incremental, k types.NamespacedName) {
			inc.DeleteObjective(routetable.KeyOfObjective(llmdv1alpha2.SchemeGroupVersion.String(), k))
		},
	},
}

// setter is an applier's set for a builder method that takes objects of
// type T.
func setter[T any](set func(*routetable.Incremental, T)) func(*routetable.Incremental, any) bool {
	return func(inc *routetable.Incremental, obj any) bool {
		o, ok := obj.(T)
		if ok {
			set(inc, o)
		}
		return ok
	}
}

// logProblems logs the build's problems when they differ from the last
// build's, so that a stable problem is logged once, not on every event.
func logProblems(logger klog.Logger, t *routetable.Table, errs []error, last []string) []string {
	now := make([]string, len(errs))
	for i, e := range errs {
		now[i] = e.Error()
	}
	if slices.Equal(now, last) {
		return last
	}
	if len(now) == 0 {
		logger.Info("Routing table has no problems", "generation", t.Generation)
		return now
	}
	logger.Info("Routing table has problems; the affected routes answer errors for them", "generation", t.Generation, "count", len(now))
	for _, e := range errs {
		logger.Info("Routing table problem", "problem", e.Error())
	}
	return now
}
