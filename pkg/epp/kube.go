package epp

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	inferencepoolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/discovery"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	informers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
)

// KubeSource follows an InferencePool in a cluster: the pool's selector and
// first target port, the ready instances a ServiceDiscovery finds for that
// selector, and the InferenceModels of the pool's namespace whose poolRef
// names the pool.
//
// The pool is synced once the InferencePool has been read and its instances
// listed; until the InferencePool exists the EPP is not ready. An
// InferencePool deleted later leaves the pool empty (503) until it is back.
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
}

// Run follows the pool until ctx ends.
func (s *KubeSource) Run(ctx context.Context, pool *Pool, models *Models) error {
	logger := klog.FromContext(ctx).WithValues("inferencePool", klog.KRef(s.Namespace, s.PoolName))
	factory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0, informers.WithNamespace(s.Namespace))
	pools := factory.InferencePool().V1().InferencePools()
	ims := factory.Inference().V1alpha2().InferenceModels()

	// Level-triggered: handlers only say that something changed; the loop
	// recomputes from the caches.
	changed := make(chan struct{}, 1)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal(changed) },
		UpdateFunc: func(any, any) { signal(changed) },
		DeleteFunc: func(any) { signal(changed) },
	}
	for _, inf := range []cache.SharedIndexInformer{pools.Informer(), ims.Informer()} {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return err
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), pools.Informer().HasSynced, ims.Informer().HasSynced) {
		return nil // ctx ended
	}

	f := &follower{pool: pool, logger: logger, newDiscovery: s.NewDiscovery, backoff: time.Second}
	defer f.stop()
	for dirty := true; ; {
		if dirty {
			dirty = false
			s.syncModels(logger, ims.Lister().InferenceModels(s.Namespace).List, models)
			ip, err := pools.Lister().InferencePools(s.Namespace).Get(s.PoolName)
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

// syncModels sets the InferenceModels that name the pool.
func (s *KubeSource) syncModels(logger klog.Logger, list func(labels.Selector) ([]*v1alpha2.InferenceModel, error), models *Models) {
	all, err := list(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing InferenceModels")
		return
	}
	mine := make([]*v1alpha2.InferenceModel, 0, len(all))
	for _, im := range all {
		if ref := im.Spec.PoolRef; ref.Name == s.PoolName && (ref.Kind == "" || ref.Kind == "InferencePool") {
			mine = append(mine, im)
		}
	}
	for _, ignored := range models.Set(mine) {
		logger.V(2).Info("Ignoring an InferenceModel", "inferenceModel", ignored)
	}
}

func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
