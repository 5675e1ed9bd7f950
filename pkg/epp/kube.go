package epp

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	inferencepoolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/discovery"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	poolListers "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/recompute"
	"github.com/mci-dev/mci/pkg/requestmodel"
)

// Where KubeSource finds the pool's model servers (KubeSource.Instances).
const (
	// InstancesFromPods: the pods the InferencePool's selector picks that
	// are Ready and have a status.podIP, as upstream EPPs find them.
	InstancesFromPods = "pods"
	// InstancesFromEndpointSlices: seed 002's mechanism, the ready
	// endpoints of a Service's EndpointSlices, each identified by its
	// targetRef (the pod name).
	InstancesFromEndpointSlices = "endpointslices"
)

// Which address of an EndpointSlice endpoint the EPP sends to
// (KubeSource.Address).
const (
	// AddressFromEndpoint: the endpoint's first address, as seed 002 says.
	AddressFromEndpoint = "endpoint"
	// AddressFromPodIP: the status.podIP of the endpoint's targetRef Pod.
	// The EndpointSlice controller writes that same address into the
	// slice, so in a cluster the two agree; it exists for clusters whose
	// slices cannot carry the address the model servers listen on: the
	// local ClusterSet's model servers listen on loopback addresses, which
	// kube-apiserver accepts in a Pod's status.podIP but refuses in an
	// EndpointSlice. It needs list and watch on the namespace's pods.
	AddressFromPodIP = "pod-ip"
)

// noPodIP is the mci_epp_model_server_instances{metadata} value of the
// ready endpoints whose targetRef Pod has no address (AddressFromPodIP):
// their metadata cannot be fetched, and they are not candidates.
const noPodIP = "no-pod-ip"

// DefaultMetadataRefresh is how often an instance's /metadata is fetched
// again when KubeSource.MetadataRefresh is 0.
const DefaultMetadataRefresh = 30 * time.Second

// KubeSource follows an InferencePool in a cluster: the pool's first target
// port, its model servers (the pods its selector picks, or a Service's
// EndpointSlices: Instances), what each server's seed 002 /metadata says
// it serves, and the InferenceModels, InferenceObjectives and
// InferenceModelRewrites (both groups: inference.networking.x-k8s.io and
// llm-d.ai) of the pool's namespace whose poolRef names the pool.
//
// One pipeline, level-triggered (pkg/recompute): the informers' handlers
// only note a change; one recomputation reads the caches, computes the
// ready set (discovery.ReadyPods or discovery.ReadyEndpoints), turns its
// difference from the last one into seed 002's InstanceAdded and
// InstanceRemoved events (discovery.Diff), applies them to the instance
// set, fetches the /metadata of the instances that need it, and publishes
// the candidates the scheduler reads. An instance is a candidate when it is
// ready and what its metadata says is usable (see the Metadata* states):
// the last valid metadata is kept when a fetch fails, an instance whose
// first fetch fails waits (retried with the workqueue's backoff), and one
// that serves no /metadata is a candidate for any model. Metadata is
// fetched again every MetadataRefresh.
//
// Which of the model configuration resources the cluster serves is asked
// once, at start (API discovery): a GIE v1 cluster has no InferenceModel
// CRD, an older one no InferenceObjective, and neither must keep the EPP
// from serving. A resource the cluster does not serve is logged and
// reported by the mci_epp_model_config_api_served metric; one installed
// later is read after a restart. A cluster that cannot be asked is taken to
// serve them all, so that their informers keep retrying rather than the EPP
// serving without them unnoticed.
//
// The pool is synced once the InferencePool has been read and its instances
// computed; until the InferencePool exists the EPP is not ready. An
// InferencePool deleted later leaves the pool empty (503) until it is back.
//
// Its informers are built by pkg/informerhealth: while one cannot list or
// watch, its cache keeps what it last read, one log line says so, and
// mci_epp_watch_reachable{resource} is 0 (the source is the
// prometheus.Collector of those metrics and of
// mci_epp_model_server_instances).
type KubeSource struct {
	// Client reads InferencePools and the model configuration.
	Client versioned.Interface
	// Kube reads Pods and EndpointSlices.
	Kube kubernetes.Interface
	// Namespace and PoolName name the InferencePool.
	Namespace, PoolName string
	// Instances is InstancesFromPods (also when empty) or
	// InstancesFromEndpointSlices.
	Instances string
	// Service is the Service whose EndpointSlices list the model servers,
	// in Namespace (InstancesFromEndpointSlices).
	Service string
	// Address is AddressFromEndpoint (also when empty) or AddressFromPodIP
	// (InstancesFromEndpointSlices).
	Address string
	// MetadataRefresh is how often an instance's /metadata is fetched
	// again; DefaultMetadataRefresh when 0.
	MetadataRefresh time.Duration
	// MetadataClient fetches /metadata; nil: one with
	// discovery.DefaultMetadataTimeout.
	MetadataClient *http.Client

	// fetch, when set, replaces discovery.Metadata (unit tests).
	fetch func(ctx context.Context, client *http.Client, baseURL string) (map[string]any, error)

	trackerOnce sync.Once
	tracker     *informerhealth.Tracker
	setOnce     sync.Once
	set         *instanceSet
}

// Validate checks the source's settings.
func (s *KubeSource) Validate() error {
	switch s.Instances {
	case "", InstancesFromPods:
		if s.Service != "" || (s.Address != "" && s.Address != AddressFromEndpoint) {
			return fmt.Errorf("a Service and an address choice are for model servers from EndpointSlices, not from Pods")
		}
	case InstancesFromEndpointSlices:
		if s.Service == "" {
			return fmt.Errorf("model servers from EndpointSlices need the Service whose slices list them")
		}
		if s.Address != "" && s.Address != AddressFromEndpoint && s.Address != AddressFromPodIP {
			return fmt.Errorf("model server address %q: want %s or %s", s.Address, AddressFromEndpoint, AddressFromPodIP)
		}
	default:
		return fmt.Errorf("model servers from %q: want %s or %s", s.Instances, InstancesFromPods, InstancesFromEndpointSlices)
	}
	if s.MetadataRefresh < 0 {
		return fmt.Errorf("the /metadata refresh interval %s is negative", s.MetadataRefresh)
	}
	return nil
}

// watches follows whether the source's informers list and watch: one log
// line per change, mci_epp_watch_reachable and mci_epp_watch_failures_total.
func (s *KubeSource) watches() *informerhealth.Tracker {
	s.trackerOnce.Do(func() { s.tracker = informerhealth.NewTracker("mci_epp") })
	return s.tracker
}

// instanceSet is the set the scheduler reads, made once.
func (s *KubeSource) instanceSet() *instanceSet {
	s.setOnce.Do(func() {
		s.set = newInstanceSet(s.refresh(), s.MetadataClient)
		if s.fetch != nil {
			s.set.fetch = s.fetch
		}
	})
	return s.set
}

func (s *KubeSource) refresh() time.Duration {
	if s.MetadataRefresh == 0 {
		return DefaultMetadataRefresh
	}
	return s.MetadataRefresh
}

// Describe and Collect make the source the prometheus.Collector of its
// watches' and instances' metrics, which the EPP serves with its own.
func (s *KubeSource) Describe(ch chan<- *prometheus.Desc) {
	s.watches().Describe(ch)
	s.instanceSet().gauge.Describe(ch)
}

func (s *KubeSource) Collect(ch chan<- prometheus.Metric) {
	s.watches().Collect(ch)
	s.instanceSet().gauge.Collect(ch)
}

// Run follows the pool until ctx ends.
func (s *KubeSource) Run(ctx context.Context, pool *Pool, models *requestmodel.Models) error {
	if err := s.Validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("inferencePool", klog.KRef(s.Namespace, s.PoolName))
	p := &pipeline{src: s, logger: logger, pool: pool, models: models, set: s.instanceSet()}
	p.set.logger = logger
	infs := p.informers(klog.NewContext(ctx, logger))
	loop := recompute.New("mci-epp")
	synced := make([]cache.InformerSynced, 0, len(infs))
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(loop.Handler()); err != nil {
			return err
		}
		synced = append(synced, inf.HasSynced)
	}
	// The informers stop before Run returns.
	defer informerhealth.Start(ctx, infs...)()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	// Metadata changes without any Kubernetes event: look again every
	// refresh interval.
	go wait.UntilWithContext(ctx, func(context.Context) { loop.Notify() }, s.refresh())
	loop.Run(ctx, p.compute)
	return nil
}

// pipeline is KubeSource.Run's state: the caches, the last ready set and
// what was last logged. Used by one recomputation at a time.
type pipeline struct {
	src    *KubeSource
	logger klog.Logger
	pool   *Pool
	models *requestmodel.Models
	set    *instanceSet

	pools  poolListers.InferencePoolLister
	pods   corelisters.PodLister
	slices discoverylisters.EndpointSliceLister
	cfg    configListers

	// ready is the last ready set; following says whether an InferencePool
	// was there, selector and port what was last logged of it, and
	// waitingForPort and unresolved what was last said of the pool's
	// missing target port and of endpoints without a Pod address.
	ready          map[string]discovery.Instance
	following      bool
	selector       map[string]string
	port           int32
	waitingForPort bool
	unresolved     int
}

// informers builds the caches the pipeline reads: the InferencePool, the
// served model configuration resources, and the model servers' Pods or
// EndpointSlices (and Pods, for their addresses).
func (p *pipeline) informers(ctx context.Context) []cache.SharedIndexInformer {
	s := p.src
	c, ns, kube := s.Client, s.Namespace, s.Kube
	poolInformer := s.watches().NewInformer(inferencepoolv1.Resource("inferencepools").String(),
		informerhealth.ListWatch(c, c.InferencePoolV1().InferencePools(ns).List, c.InferencePoolV1().InferencePools(ns).Watch), &inferencepoolv1.InferencePool{})
	p.pools = poolListers.NewInferencePoolLister(poolInformer.GetIndexer())
	served := s.servedConfigAPIs(ctx)
	p.models.SetServedAPIs(served)
	p.cfg = s.configListers(served)
	infs := append([]cache.SharedIndexInformer{poolInformer}, p.cfg.informers...)

	if s.Instances == InstancesFromEndpointSlices {
		x := kube.DiscoveryV1().EndpointSlices(ns)
		onlyService := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Service}).String()
		list := func(ctx context.Context, o metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
			o.LabelSelector = onlyService
			return x.List(ctx, o)
		}
		watchFn := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = onlyService
			return x.Watch(ctx, o)
		}
		inf := s.watches().NewInformer("endpointslices.discovery.k8s.io", informerhealth.ListWatch(kube, list, watchFn), &discoveryv1.EndpointSlice{})
		p.slices = discoverylisters.NewEndpointSliceLister(inf.GetIndexer())
		infs = append(infs, inf)
	}
	if s.Instances != InstancesFromEndpointSlices || s.Address == AddressFromPodIP {
		x := kube.CoreV1().Pods(ns)
		inf := s.watches().NewInformer("pods", informerhealth.ListWatch(kube, x.List, x.Watch), &corev1.Pod{})
		p.pods = corelisters.NewPodLister(inf.GetIndexer())
		infs = append(infs, inf)
	}
	return infs
}

// compute is one recomputation: the model configuration, then the
// InferencePool, the ready set, its diff events, the instances' metadata
// and the candidates. An error (a cache that cannot be read, a /metadata
// fetch that failed) makes the loop run it again with backoff.
func (p *pipeline) compute(ctx context.Context) error {
	s := p.src
	s.syncModels(p.logger, p.cfg, p.models)
	ip, err := p.pools.InferencePools(s.Namespace).Get(s.PoolName)
	if apierrors.IsNotFound(err) {
		if p.following {
			p.logger.Info("InferencePool is gone; no endpoints until it is back")
			p.following, p.selector, p.ready = false, nil, nil
			p.set.clear()
			p.publish(0)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading InferencePool %s/%s: %w", s.Namespace, s.PoolName, err)
	}
	if len(ip.Spec.TargetPorts) == 0 {
		if !p.waitingForPort {
			p.logger.Info("InferencePool has no target port; waiting for one")
			p.waitingForPort = true
		}
		return nil
	}
	p.waitingForPort = false
	port := ip.Spec.TargetPorts[0].Number
	if !p.following || port != p.port || !maps.Equal(p.selector, ip.Spec.Selector.MatchLabels) {
		p.logger.Info("Following the InferencePool's instances", "from", p.from(), "selector", ip.Spec.Selector.MatchLabels, "targetPort", port)
		p.following, p.port, p.selector = true, port, maps.Clone(ip.Spec.Selector.MatchLabels)
	}
	ready, err := p.readySet(ip)
	if err != nil {
		return err
	}
	p.set.apply(discovery.Diff(p.ready, ready))
	p.ready = ready
	fetchErr := p.set.refreshMetadata(ctx, port)
	if ctx.Err() != nil {
		return nil
	}
	p.publish(port)
	return fetchErr
}

// from names where the instances come from, for the logs.
func (p *pipeline) from() string {
	if p.src.Instances == InstancesFromEndpointSlices {
		return fmt.Sprintf("EndpointSlices of Service %s/%s (addresses: %s)", p.src.Namespace, p.src.Service, cmp.Or(p.src.Address, AddressFromEndpoint))
	}
	return "Pods"
}

// publish sets the pool's candidates.
func (p *pipeline) publish(port int32) {
	if err := p.pool.SetEndpoints(p.set.endpoints(port)); err != nil {
		p.logger.Error(err, "Setting the pool's endpoints")
	}
}

// readySet computes the ready instances from the caches.
func (p *pipeline) readySet(ip *inferencepoolv1.InferencePool) (map[string]discovery.Instance, error) {
	ns := p.src.Namespace
	if p.src.Instances != InstancesFromEndpointSlices {
		// An empty selector selects every pod of the namespace, as before.
		pods, err := p.pods.Pods(ns).List(labels.SelectorFromSet(ip.Spec.Selector.MatchLabels))
		if err != nil {
			return nil, fmt.Errorf("listing the pool's pods: %w", err)
		}
		return discovery.ReadyPods(pods), nil
	}
	slices, err := p.slices.EndpointSlices(ns).List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing the EndpointSlices of Service %s/%s: %w", ns, p.src.Service, err)
	}
	ready := discovery.ReadyEndpoints(slices, "")
	if p.src.Address == AddressFromPodIP {
		p.resolvePodIPs(ready)
	}
	return ready, nil
}

// resolvePodIPs replaces each instance's address by its targetRef Pod's
// status.podIP, dropping the instances whose Pod is not in the cache or
// has no address yet (said once per change of their number).
func (p *pipeline) resolvePodIPs(ready map[string]discovery.Instance) {
	var missing []string
	for id, in := range ready {
		pod, err := p.pods.Pods(in.Namespace).Get(id)
		if err != nil || pod.Status.PodIP == "" {
			missing = append(missing, id)
			delete(ready, id)
			continue
		}
		in.Address = pod.Status.PodIP
		ready[id] = in
	}
	if len(missing) != p.unresolved {
		p.logger.Info("Ready endpoints whose targetRef Pod has no status.podIP in the pool's namespace are not candidates", "count", len(missing), "instances", missing)
		p.unresolved = len(missing)
	}
	p.set.gauge.WithLabelValues(noPodIP).Set(float64(len(missing)))
}
