package sidecar

import (
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gatewayinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mciinformers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
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
	LocalCluster  string
	DefaultPolicy Policy
	Gateways      []types.NamespacedName
	// InferenceModels, when true, reads the InferenceModels of the cluster
	// to know the criticality of requests (for MetricsBased shedding). When
	// false every request is Standard and never shed.
	InferenceModels bool
}

// Watcher keeps the Router's table built from informers: HTTPRoutes
// (Gateway API), InferencePoolImports (served by mci-apiserver through the
// aggregation layer), InferencePools, Services (for local EPPs) and
// optionally InferenceModels. Event handlers only signal that something
// changed; a single goroutine rebuilds the whole table from the caches and
// publishes it. Events arriving during a build coalesce into one more build,
// so a burst of events costs at most two builds, and the table a request
// sees is at most one build behind the caches.
type Watcher struct {
	clients   Clients
	cfg       WatchConfig
	router    *Router
	onPublish func(t *Table, took time.Duration)

	synced   chan struct{}
	syncOnce sync.Once
}

// NewWatcher returns a watcher that publishes to router. onPublish, when
// set, is called after each publication (to retarget the health prober and
// metrics scraper, record metrics).
func NewWatcher(clients Clients, cfg WatchConfig, router *Router, onPublish func(t *Table, took time.Duration)) *Watcher {
	return &Watcher{clients: clients, cfg: cfg, router: router, onPublish: onPublish, synced: make(chan struct{})}
}

// Synced is closed once the first table built from synced caches is
// published.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// dropManagedFields keeps the caches small: nothing reads managed fields.
func dropManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// Run watches and rebuilds until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	kubeFactory := kubeinformers.NewSharedInformerFactoryWithOptions(w.clients.Kube, 0, kubeinformers.WithTransform(dropManagedFields))
	mciFactory := mciinformers.NewSharedInformerFactoryWithOptions(w.clients.MCI, 0, mciinformers.WithTransform(dropManagedFields))
	gwFactory := gatewayinformers.NewSharedInformerFactoryWithOptions(w.clients.Gateway, 0, gatewayinformers.WithTransform(dropManagedFields))

	services := kubeFactory.Core().V1().Services()
	routes := gwFactory.Gateway().V1().HTTPRoutes()
	imports := mciFactory.Inference().V1alpha1().InferencePoolImports()
	pools := mciFactory.InferencePool().V1().InferencePools()
	informers := []cache.SharedIndexInformer{services.Informer(), routes.Informer(), imports.Informer(), pools.Informer()}
	// The routing table waits for these; InferenceModels only refine
	// criticality, so a cluster without their CRD must not keep the sidecar
	// from routing: their informer is not waited for.
	required := len(informers)
	var models func() ([]*v1alpha2.InferenceModel, error)
	if w.cfg.InferenceModels {
		ims := mciFactory.Inference().V1alpha2().InferenceModels()
		informers = append(informers, ims.Informer())
		models = func() ([]*v1alpha2.InferenceModel, error) { return ims.Lister().List(labels.Everything()) }
	}

	changed := make(chan struct{}, 1)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal(changed) },
		UpdateFunc: func(any, any) { signal(changed) },
		DeleteFunc: func(any) { signal(changed) },
	}
	synced := make([]cache.InformerSynced, 0, len(informers))
	for i, inf := range informers {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return err
		}
		if i < required {
			synced = append(synced, inf.HasSynced)
		}
	}
	kubeFactory.Start(ctx.Done())
	mciFactory.Start(ctx.Done())
	gwFactory.Start(ctx.Done())
	defer func() {
		kubeFactory.Shutdown()
		mciFactory.Shutdown()
		gwFactory.Shutdown()
	}()
	logger.Info("Waiting for the caches of HTTPRoutes, InferencePoolImports, InferencePools and Services")
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}

	var lastErrs []string
	for {
		// Drain a pending signal first: the build below sees every change
		// that caused it.
		select {
		case <-changed:
		default:
		}
		start := time.Now()
		in := Inputs{LocalCluster: w.cfg.LocalCluster, DefaultPolicy: w.cfg.DefaultPolicy, Gateways: w.cfg.Gateways}
		var err error
		if in.Routes, err = routes.Lister().List(labels.Everything()); err == nil {
			if in.Imports, err = imports.Lister().List(labels.Everything()); err == nil {
				if in.Pools, err = pools.Lister().List(labels.Everything()); err == nil {
					if in.Services, err = services.Lister().List(labels.Everything()); err == nil && models != nil {
						in.Models, err = models()
					}
				}
			}
		}
		if err != nil {
			// Listers of synced caches do not fail; if one ever does, keep
			// the last table rather than publish a partial one.
			logger.Error(err, "Reading the caches; keeping the routing table")
		} else {
			t, errs := Build(in)
			w.router.Publish(t)
			took := time.Since(start)
			if w.onPublish != nil {
				w.onPublish(t, took)
			}
			lastErrs = logProblems(logger, t, errs, lastErrs)
			logger.V(4).Info("Published routing table", "generation", t.Generation, "rules", len(t.Rules()), "took", took)
			w.syncOnce.Do(func() { close(w.synced) })
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// logProblems logs the build's problems when they differ from the last
// build's, so that a stable problem is logged once, not on every event.
func logProblems(logger klog.Logger, t *Table, errs []error, last []string) []string {
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

func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
