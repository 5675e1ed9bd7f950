package epp

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	inferencepoolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/discovery"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	v1alpha2listers "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha2"
	poolListers "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
	llmdlisters "github.com/mci-dev/mci/pkg/generated/listers/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/servedapis"
)

// KubeSource follows an InferencePool in a cluster: the pool's selector and
// first target port, the ready instances a ServiceDiscovery finds for that
// selector, and the InferenceModels, InferenceObjectives and
// InferenceModelRewrites (both groups: inference.networking.x-k8s.io and
// llm-d.ai) of the pool's namespace whose poolRef names the pool.
//
// Which of those five resources the cluster serves is asked once, at start
// (API discovery): a GIE v1 cluster has no InferenceModel CRD, an older one no
// InferenceObjective, and neither must keep the EPP from serving. A resource
// the cluster does not serve is logged and reported by the
// mci_epp_model_config_api_served metric; one installed later is read after
// a restart. A cluster that cannot be asked is taken to serve them all, so
// that their informers keep retrying rather than the EPP serving without
// them unnoticed.
//
// The pool is synced once the InferencePool has been read and its instances
// listed; until the InferencePool exists the EPP is not ready. An
// InferencePool deleted later leaves the pool empty (503) until it is back.
//
// Its informers (the InferencePool, the served model configuration
// resources) are built by pkg/informerhealth: while one cannot list or
// watch, its cache keeps what it last read, one log line says so, and
// mci_epp_watch_reachable{resource} is 0 (the source is the
// prometheus.Collector of those metrics).
//
// Instances come from List, then from Watch. An instance that goes away
// between the two stays a candidate until its next change; its scrapes fail
// meanwhile, its metrics go stale, and the scheduler never prefers it to a
// measured one.
type KubeSource struct {
	// Client reads InferencePools and InferenceModels.
	Client versioned.Interface
	// Namespace and PoolName name the InferencePool.
	Namespace, PoolName string
	// NewDiscovery returns the discovery of the instances that a label
	// selector picks in Namespace (discovery.NewPodDiscovery, typically). It
	// is called again when the pool's selector changes.
	NewDiscovery func(selector map[string]string) discovery.ServiceDiscovery

	trackerOnce sync.Once
	tracker     *informerhealth.Tracker
}

// watches follows whether the source's informers list and watch: one log
// line per change, mci_epp_watch_reachable and mci_epp_watch_failures_total.
func (s *KubeSource) watches() *informerhealth.Tracker {
	s.trackerOnce.Do(func() { s.tracker = informerhealth.NewTracker("mci_epp") })
	return s.tracker
}

// Describe and Collect make the source the prometheus.Collector of its
// watches' metrics, which the EPP serves with its own.
func (s *KubeSource) Describe(ch chan<- *prometheus.Desc) { s.watches().Describe(ch) }
func (s *KubeSource) Collect(ch chan<- prometheus.Metric) { s.watches().Collect(ch) }

// Run follows the pool until ctx ends.
func (s *KubeSource) Run(ctx context.Context, pool *Pool, models *requestmodel.Models) error {
	logger := klog.FromContext(ctx).WithValues("inferencePool", klog.KRef(s.Namespace, s.PoolName))
	c, ns := s.Client, s.Namespace
	poolInformer := s.watches().NewInformer(inferencepoolv1.Resource("inferencepools").String(),
		informerhealth.ListWatch(c, c.InferencePoolV1().InferencePools(ns).List, c.InferencePoolV1().InferencePools(ns).Watch), &inferencepoolv1.InferencePool{})
	pools := poolListers.NewInferencePoolLister(poolInformer.GetIndexer())
	served := s.servedConfigAPIs(klog.NewContext(ctx, logger))
	models.SetServedAPIs(served)
	cfg := s.configListers(served)

	// Level-triggered: handlers only say that something changed; the loop
	// recomputes from the caches.
	changed := make(chan struct{}, 1)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal(changed) },
		UpdateFunc: func(any, any) { signal(changed) },
		DeleteFunc: func(any) { signal(changed) },
	}
	infs := append([]cache.SharedIndexInformer{poolInformer}, cfg.informers...)
	synced := make([]cache.InformerSynced, 0, len(infs))
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return err
		}
		synced = append(synced, inf.HasSynced)
	}
	// The informers stop before Run returns.
	defer informerhealth.Start(ctx, infs...)()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}

	f := &follower{pool: pool, logger: logger, newDiscovery: s.NewDiscovery, backoff: time.Second}
	defer f.stop()
	for dirty := true; ; {
		if dirty {
			dirty = false
			s.syncModels(logger, cfg, models)
			ip, err := pools.InferencePools(s.Namespace).Get(s.PoolName)
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("reading InferencePool %s/%s: %w", s.Namespace, s.PoolName, err)
			}
			if err != nil {
				ip = nil
			}
			f.setPool(ctx, ip)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			dirty = true
		case <-f.retry:
			f.follow(ctx)
		case ev, ok := <-f.events:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				logger.Info("Instance watch ended; following again")
				f.follow(ctx)
				continue
			}
			switch ev.Type {
			case discovery.InstanceAdded:
				f.instances[ev.Instance.ID] = ev.Instance
			case discovery.InstanceRemoved:
				delete(f.instances, ev.Instance.ID)
			}
			f.publish()
		}
	}
}

// follower keeps the pool's endpoints following the InferencePool's
// selector and port. Used by KubeSource.Run's goroutine only.
type follower struct {
	pool         *Pool
	logger       klog.Logger
	newDiscovery func(map[string]string) discovery.ServiceDiscovery

	// selector is nil while there is no InferencePool.
	selector  map[string]string
	port      int32
	cancel    context.CancelFunc
	events    <-chan discovery.Event
	instances map[string]discovery.Instance
	retry     <-chan time.Time
	backoff   time.Duration
}

// setPool applies the InferencePool (nil: absent).
func (f *follower) setPool(ctx context.Context, ip *inferencepoolv1.InferencePool) {
	switch {
	case ip == nil:
		if f.selector != nil {
			f.logger.Info("InferencePool is gone; no endpoints until it is back")
			f.stop()
			f.selector = nil
			f.publish()
		}
	case len(ip.Spec.TargetPorts) == 0:
		f.logger.Info("InferencePool has no target port; waiting for one")
	case f.selector == nil || !maps.Equal(f.selector, ip.Spec.Selector.MatchLabels):
		f.selector, f.port = maps.Clone(ip.Spec.Selector.MatchLabels), ip.Spec.TargetPorts[0].Number
		if f.selector == nil {
			f.selector = map[string]string{}
		}
		f.logger.Info("Following the InferencePool's instances", "selector", f.selector, "targetPort", f.port)
		f.follow(ctx)
	case ip.Spec.TargetPorts[0].Number != f.port:
		f.port = ip.Spec.TargetPorts[0].Number
		f.publish()
	}
}

// follow (re)starts the discovery for the current selector: List, publish,
// then Watch. On failure it retries with a backoff.
func (f *follower) follow(ctx context.Context) {
	f.stop()
	dctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	d := f.newDiscovery(f.selector)
	list, err := d.List(dctx)
	if err == nil {
		f.events, err = d.Watch(dctx)
	}
	if err != nil {
		f.stop()
		f.logger.Error(err, "Discovering the pool's instances; retrying", "in", f.backoff)
		f.retry = time.After(f.backoff)
		f.backoff = min(2*f.backoff, 30*time.Second)
		return
	}
	f.backoff = time.Second
	f.instances = make(map[string]discovery.Instance, len(list))
	for _, in := range list {
		f.instances[in.ID] = in
	}
	f.publish()
}

// stop ends the current discovery, if any, and forgets its instances.
func (f *follower) stop() {
	if f.cancel != nil {
		f.cancel()
	}
	f.cancel, f.events, f.instances, f.retry = nil, nil, nil, nil
}

// publish sets the pool's endpoints from the instances: their address and
// their own port, or the pool's target port when the source knows none.
func (f *follower) publish() {
	eps := make([]Endpoint, 0, len(f.instances))
	for _, in := range f.instances {
		p := f.port
		if in.Port != 0 {
			p = in.Port
		}
		eps = append(eps, Endpoint{Name: in.ID, Address: net.JoinHostPort(in.Address, strconv.Itoa(int(p)))})
	}
	if err := f.pool.SetEndpoints(eps); err != nil {
		f.logger.Error(err, "Setting the pool's endpoints")
	}
}

// The model configuration resources KubeSource reads, as API discovery
// names them ("<group>/<version>/<resource>").
var (
	apiInferenceModels = v1alpha2.SchemeGroupVersion.WithResource("inferencemodels")
	apiObjectives      = v1alpha2.SchemeGroupVersion.WithResource("inferenceobjectives")
	apiRewrites        = v1alpha2.SchemeGroupVersion.WithResource("inferencemodelrewrites")
	apiLLMDObjectives  = llmdv1alpha2.SchemeGroupVersion.WithResource("inferenceobjectives")
	apiLLMDRewrites    = llmdv1alpha2.SchemeGroupVersion.WithResource("inferencemodelrewrites")
	modelConfigAPIs    = []schema.GroupVersionResource{apiInferenceModels, apiObjectives, apiRewrites, apiLLMDObjectives, apiLLMDRewrites}
)

// servedConfigAPIs asks the cluster which model configuration resources it
// serves (pkg/servedapis, as mci-apiserver and mci-sidecar ask).
func (s *KubeSource) servedConfigAPIs(ctx context.Context) map[schema.GroupVersionResource]bool {
	return servedapis.Discover(ctx, s.Client.Discovery(), 0, modelConfigAPIs...).Map()
}

// configListers are the listers of the served model configuration
// resources (nil for the others) and their informers.
type configListers struct {
	models         func(labels.Selector) ([]*v1alpha2.InferenceModel, error)
	objectives     func(labels.Selector) ([]*v1alpha2.InferenceObjective, error)
	rewrites       func(labels.Selector) ([]*v1alpha2.InferenceModelRewrite, error)
	llmdObjectives func(labels.Selector) ([]*llmdv1alpha2.InferenceObjective, error)
	llmdRewrites   func(labels.Selector) ([]*llmdv1alpha2.InferenceModelRewrite, error)
	informers      []cache.SharedIndexInformer
}

func (s *KubeSource) configListers(served map[schema.GroupVersionResource]bool) configListers {
	var cl configListers
	c, ns := s.Client, s.Namespace
	// watched builds the informer of a served resource, which s.watches
	// follows, and returns its cache.
	watched := func(r schema.GroupVersionResource, lw cache.ListerWatcher, example runtime.Object) cache.Indexer {
		inf := s.watches().NewInformer(r.GroupResource().String(), lw, example)
		cl.informers = append(cl.informers, inf)
		return inf.GetIndexer()
	}
	if served[apiInferenceModels] {
		x := c.InferenceV1alpha2().InferenceModels(ns)
		cl.models = v1alpha2listers.NewInferenceModelLister(watched(apiInferenceModels, informerhealth.ListWatch(c, x.List, x.Watch), &v1alpha2.InferenceModel{})).InferenceModels(ns).List
	}
	if served[apiObjectives] {
		x := c.InferenceV1alpha2().InferenceObjectives(ns)
		cl.objectives = v1alpha2listers.NewInferenceObjectiveLister(watched(apiObjectives, informerhealth.ListWatch(c, x.List, x.Watch), &v1alpha2.InferenceObjective{})).InferenceObjectives(ns).List
	}
	if served[apiRewrites] {
		x := c.InferenceV1alpha2().InferenceModelRewrites(ns)
		cl.rewrites = v1alpha2listers.NewInferenceModelRewriteLister(watched(apiRewrites, informerhealth.ListWatch(c, x.List, x.Watch), &v1alpha2.InferenceModelRewrite{})).InferenceModelRewrites(ns).List
	}
	if served[apiLLMDObjectives] {
		x := c.LLMDV1alpha2().InferenceObjectives(ns)
		cl.llmdObjectives = llmdlisters.NewInferenceObjectiveLister(watched(apiLLMDObjectives, informerhealth.ListWatch(c, x.List, x.Watch), &llmdv1alpha2.InferenceObjective{})).InferenceObjectives(ns).List
	}
	if served[apiLLMDRewrites] {
		x := c.LLMDV1alpha2().InferenceModelRewrites(ns)
		cl.llmdRewrites = llmdlisters.NewInferenceModelRewriteLister(watched(apiLLMDRewrites, informerhealth.ListWatch(c, x.List, x.Watch), &llmdv1alpha2.InferenceModelRewrite{})).InferenceModelRewrites(ns).List
	}
	return cl
}

// syncModels sets the model configuration objects that name the pool.
func (s *KubeSource) syncModels(logger klog.Logger, c configListers, models *requestmodel.Models) {
	cfg, err := s.modelConfig(c)
	if err != nil {
		logger.Error(err, "Listing the pool's model configuration")
		return
	}
	for _, ignored := range models.Set(cfg) {
		logger.V(2).Info("Ignoring or repairing part of the model configuration", "note", ignored)
	}
}

func (s *KubeSource) modelConfig(c configListers) (requestmodel.ModelConfig, error) {
	var cfg requestmodel.ModelConfig
	if c.models != nil {
		all, err := c.models(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceModels: %w", err)
		}
		for _, im := range all {
			if ref := im.Spec.PoolRef; ref.Name == s.PoolName && (ref.Kind == "" || ref.Kind == "InferencePool") {
				cfg.Models = append(cfg.Models, im)
			}
		}
	}
	if c.objectives != nil {
		all, err := c.objectives(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceObjectives: %w", err)
		}
		for _, o := range all {
			if s.namesPool(&o.Spec.PoolRef) {
				cfg.Objectives = append(cfg.Objectives, o)
			}
		}
	}
	if c.llmdObjectives != nil {
		all, err := c.llmdObjectives(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceObjectives (llm-d.ai): %w", err)
		}
		for _, o := range all {
			if s.namesPool(&o.Spec.PoolRef) {
				cfg.Objectives = append(cfg.Objectives, requestmodel.ObjectiveFromLLMD(o))
			}
		}
	}
	if c.rewrites != nil {
		all, err := c.rewrites(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceModelRewrites: %w", err)
		}
		for _, rw := range all {
			if s.namesPool(rw.Spec.PoolRef) {
				cfg.Rewrites = append(cfg.Rewrites, rw)
			}
		}
	}
	if c.llmdRewrites != nil {
		all, err := c.llmdRewrites(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceModelRewrites (llm-d.ai): %w", err)
		}
		for _, rw := range all {
			if s.namesPool(rw.Spec.PoolRef) {
				cfg.Rewrites = append(cfg.Rewrites, requestmodel.RewriteFromLLMD(rw))
			}
		}
	}
	return cfg, nil
}

// namesPool reports whether a poolRef names the pool: its name, and the
// InferencePool kind and group, or none (the CRDs' defaults), as upstream
// EPPs compare them.
func (s *KubeSource) namesPool(ref *v1alpha2.PoolObjectReference) bool {
	return ref != nil && ref.Name == s.PoolName &&
		(ref.Kind == "" || ref.Kind == "InferencePool") &&
		(ref.Group == "" || ref.Group == inferencepoolv1.SchemeGroupVersion.Group)
}

func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
