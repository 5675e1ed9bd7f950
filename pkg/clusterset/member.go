package clusterset

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
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

const (
	// probeTimeout is the least time a reachability probe of a member
	// apiserver is given; it is given the unreachable threshold when that
	// is longer (probeTimeoutFor).
	probeTimeout = 2 * time.Second
	// probeInterval is how often a reachable member is probed.
	probeInterval = time.Second
	// probeMaxInterval caps the backoff between probes of a failing
	// member. A failing member's recovery is noticed by its next probe, and
	// until then its informers wait (see linkGate): a longer cap would
	// keep every view of it stale for that long after a partition heals.
	// A probe of a failing member is one refused connection or one pending
	// request, and the jitter keeps replicas out of step.
	probeMaxInterval = probeInterval
	// discoveryTimeout bounds asking a member which APIs it serves.
	discoveryTimeout = 5 * time.Second
)

// member is one connected member cluster: its informers, listers and
// reachability. It is started once and stopped once; a changed kubeconfig
// replaces the whole member.
type member struct {
	name string
	// local is the cluster this server serves: only there are HTTPRoutes
	// and ReferenceGrants watched, and only there do pools keep every
	// status.parents entry (see trimOther).
	local bool
	// source identifies the kubeconfig the member was built from, so a
	// changed Secret or file reconnects it.
	source string

	kube kubernetes.Interface
	// gate holds the requests of kube, mci, gateway and discovery while
	// the probe cannot reach the member; probeClient goes around it.
	gate        *linkGate
	probeClient rest.Interface
	mci         mciclient.Interface
	gateway     gatewayclient.Interface
	discovery   discovery.DiscoveryInterface
	ctx         context.Context
	cancel      context.CancelFunc
	done        chan struct{}
	synced      []cache.InformerSynced
	handler     Handler

	namespaces     corev1listers.NamespaceLister
	pools          poollisters.InferencePoolLister
	services       corev1listers.ServiceLister
	endpointSlices discoverylisters.EndpointSliceLister
	gateways       gatewaylisters.GatewayLister
	poolIndexer    cache.Indexer
	// routeIndexer and grants are set for the local member only.
	routeIndexer   cache.Indexer
	grants         gatewaylistersv1beta1.ReferenceGrantLister
	poolNamespaces *poolNamespaces
	// backendTLSPolicies is nil when the member does not serve them.
	backendTLSPolicies gatewaylisters.BackendTLSPolicyLister

	// joined is when the Cache first tried the member: one that has never
	// answered is failing since then (asking it what it serves comes
	// before the first probe and can take a while on a dead link).
	joined time.Time

	mu sync.Mutex
	// lastAnswered is when the member last answered a probe; a member that
	// fails one is failing since then, so that an outage is flagged within
	// the threshold of its start, not of the first probe that noticed it.
	lastAnswered time.Time
	failingSince time.Time
	lastError    string
	unreachable  bool
	// removed: the member has failed for longer than its removal threshold,
	// so the pools it exported are no longer served.
	removed bool
}

// thresholds say when a failing member is flagged and when its data is
// dropped.
type thresholds struct {
	// unreachableAfter: flagged ClusterUnreachable, last known data kept.
	unreachableAfter time.Duration
	// removeAfter: its exported pools leave the imports; 0 never (the
	// local cluster, whose namespaces decide every placement).
	removeAfter time.Duration
}

// indexParentGateway is an index of the InferencePool informer: it lets a
// Gateway change be mapped to the pools whose status names it without
// scanning every pool. A Service change is mapped by a scan of its
// namespace's pools instead (poolsUsingService): an index of
// endpointPickerRefs holds a set per pool, as each pool has its own EPP,
// which cost every member's cache about 330 bytes per pool, a tenth of
// what mci holds per exported pool; namespaces hold few pools.
const indexParentGateway = "parentGateway"

func poolIndexers() cache.Indexers {
	return cache.Indexers{
		indexParentGateway: func(obj interface{}) ([]string, error) {
			p, ok := obj.(*poolv1.InferencePool)
			if !ok {
				return nil, nil
			}
			var keys []string
			for _, parent := range p.Status.Parents {
				// Only Gateways: mci's own Exported entry (kind
				// InferencePoolImport) names the pool, not a Gateway.
				if !isGateway(parent.ParentRef) {
					continue
				}
				ns := parent.ParentRef.Namespace
				if ns == "" {
					ns = p.Namespace
				}
				keys = append(keys, ns+"/"+parent.ParentRef.Name)
			}
			return keys, nil
		},
	}
}

func newMember(name, source string, config *rest.Config, handler Handler) (*member, error) {
	config = rest.CopyConfig(config)
	config.UserAgent = "mci-apiserver"
	// Hundreds of pools across many members should not queue behind the
	// default client-side rate limit at start-up.
	if config.QPS == 0 {
		config.QPS = 50
		config.Burst = 100
	}
	// The probe goes around the gate: it is what opens it again.
	probe, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	m := &member{name: name, source: source, gate: newLinkGate(), probeClient: probe.Discovery().RESTClient(), handler: handler}
	gated := rest.CopyConfig(config)
	gated.Wrap(m.gate.wrap)
	if m.kube, err = kubernetes.NewForConfig(gated); err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	if m.mci, err = mciclient.NewForConfig(gated); err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	if m.gateway, err = gatewayclient.NewForConfig(gated); err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	// Discovery at start-up must not wait forever on a hung member.
	bounded := rest.CopyConfig(gated)
	bounded.Timeout = discoveryTimeout
	if m.discovery, err = discovery.NewDiscoveryClientForConfig(bounded); err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	return m, nil
}

// start begins watching the member. Resources whose API the member does not
// serve (no Gateway API or InferencePool CRD installed) are served as empty
// rather than blocking the member's sync forever.
func (m *member) start(ctx context.Context, th thresholds) {
	ctx, m.cancel = context.WithCancel(ctx)
	m.ctx = ctx
	m.done = make(chan struct{})
	logger := klog.FromContext(ctx).WithValues("member", m.name)

	kube := m.kube
	transform := trimOther
	if m.local {
		transform = trim
	}
	kubeFactory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(transform))
	nsInformer := kubeFactory.Core().V1().Namespaces()
	m.namespaces = nsInformer.Lister()
	m.watch(nsInformer.Informer(), KindNamespace)
	m.synced = append(m.synced, nsInformer.Informer().HasSynced)
	m.poolNamespaces = newPoolNamespaces(ctx, kube, m.watch)
	m.services = serviceLister{m.poolNamespaces}
	m.endpointSlices = endpointSliceLister{m.poolNamespaces}

	served := servedResources(ctx, m.discovery, logger)

	var starters []func(<-chan struct{})
	starters = append(starters, kubeFactory.Start)
	if served[poolv1.SchemeGroupVersion.String()+"/inferencepools"] {
		f := mciinformers.NewSharedInformerFactoryWithOptions(m.mci, 0, mciinformers.WithTransform(transform))
		inf := f.InferencePool().V1().InferencePools()
		if err := inf.Informer().AddIndexers(poolIndexers()); err != nil {
			logger.Error(err, "Adding pool indexers")
		}
		m.pools = inf.Lister()
		m.poolIndexer = inf.Informer().GetIndexer()
		m.watch(inf.Informer(), KindInferencePool)
		m.synced = append(m.synced, inf.Informer().HasSynced)
		starters = append(starters, f.Start)
	} else {
		indexers := poolIndexers()
		indexers[cache.NamespaceIndex] = cache.MetaNamespaceIndexFunc
		m.poolIndexer = cache.NewIndexer(cache.MetaNamespaceKeyFunc, indexers)
		m.pools = poollisters.NewInferencePoolLister(m.poolIndexer)
	}
	gw := gatewayinformers.NewSharedInformerFactoryWithOptions(m.gateway, 0, gatewayinformers.WithTransform(transform))
	gatewayGV := gatewayv1.SchemeGroupVersion.String()
	if served[gatewayGV+"/gateways"] {
		inf := gw.Gateway().V1().Gateways()
		m.gateways = inf.Lister()
		m.watch(inf.Informer(), KindGateway)
		m.synced = append(m.synced, inf.Informer().HasSynced)
	} else {
		m.gateways = gatewaylisters.NewGatewayLister(newNamespacedIndexer(nil))
	}
	if served[gatewayGV+"/backendtlspolicies"] {
		inf := gw.Gateway().V1().BackendTLSPolicies()
		m.backendTLSPolicies = inf.Lister()
		m.watch(inf.Informer(), KindBackendTLSPolicy)
		m.synced = append(m.synced, inf.Informer().HasSynced)
	}
	if m.local {
		m.startRouteInformers(gw, served, logger)
	}
	starters = append(starters, gw.Start)
	for _, start := range starters {
		start(ctx.Done())
	}

	go func() {
		defer close(m.done)
		m.probeLoop(ctx, m.probeClient, th)
	}()
	go func() {
		started := time.Now()
		if cache.WaitForCacheSync(ctx.Done(), m.hasSynced) {
			logger.Info("Member listed", "after", time.Since(started).Round(time.Millisecond))
		}
	}()
	logger.V(2).Info("Watching member")
}

// startRouteInformers watches the HTTPRoutes and ReferenceGrants of the
// local cluster: what makes an import's parents. Without the Gateway API's
// HTTPRoute (or ReferenceGrant) the cluster has none, and the imports it
// serves list no parents (no cross-namespace route is permitted); that is
// said once in the log.
func (m *member) startRouteInformers(gw gatewayinformers.SharedInformerFactory, served map[string]bool, logger klog.Logger) {
	gatewayGV := gatewayv1.SchemeGroupVersion.String()
	if served[gatewayGV+"/httproutes"] {
		inf := gw.Gateway().V1().HTTPRoutes().Informer()
		if err := inf.AddIndexers(routeIndexers()); err != nil {
			logger.Error(err, "Adding HTTPRoute indexers")
		}
		m.routeIndexer = inf.GetIndexer()
		m.watchRoutes(inf)
		m.synced = append(m.synced, inf.HasSynced)
	} else {
		logger.Info("The local cluster does not serve HTTPRoutes; imports will list no parents", "groupVersion", gatewayGV)
		m.routeIndexer = newNamespacedIndexer(routeIndexers())
	}
	grantGV := gatewayv1beta1.SchemeGroupVersion.String()
	if served[grantGV+"/referencegrants"] {
		inf := gw.Gateway().V1beta1().ReferenceGrants()
		m.grants = inf.Lister()
		m.watch(inf.Informer(), KindReferenceGrant)
		m.synced = append(m.synced, inf.Informer().HasSynced)
	} else {
		logger.Info("The local cluster does not serve ReferenceGrants; no HTTPRoute may use an import of another namespace", "groupVersion", grantGV)
		m.grants = gatewaylistersv1beta1.NewReferenceGrantLister(newNamespacedIndexer(nil))
	}
}

// indexRouteParent indexes the local HTTPRoutes that use an import by the
// Gateways they name as parents, so that a Gateway change finds the imports
// whose parents it may change.
const indexRouteParent = "parentGateway"

func routeIndexers() cache.Indexers {
	return cache.Indexers{
		imports.RoutesByImportIndex: imports.RoutesByImport,
		indexRouteParent: func(obj interface{}) ([]string, error) {
			r, ok := obj.(*gatewayv1.HTTPRoute)
			if !ok || len(imports.ImportBackendRefs(r)) == 0 {
				return nil, nil
			}
			var keys []string
			for _, p := range r.Spec.ParentRefs {
				ns := r.Namespace
				if p.Namespace != nil && *p.Namespace != "" {
					ns = string(*p.Namespace)
				}
				keys = append(keys, ns+"/"+string(p.Name))
			}
			return keys, nil
		},
	}
}

func newNamespacedIndexer(extra cache.Indexers) cache.Indexer {
	indexers := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for k, v := range extra {
		indexers[k] = v
	}
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, indexers)
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
		rv, _ := strconv.ParseUint(r.ResourceVersion, 10, 64)
		m.handler(Event{Member: m.name, Kind: KindHTTPRoute, Namespace: r.Namespace, Name: r.Name, ResourceVersion: rv, Imports: keys})
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { notify(nil, obj) },
		UpdateFunc: func(old, obj interface{}) { notify(old, obj) },
		DeleteFunc: func(obj interface{}) { notify(nil, obj) },
	})
}

// servedResources asks the member which of the optional resources it
// serves. A member that cannot be asked is assumed to serve them all, so
// that its informers keep retrying instead of the member being cached as
// empty.
//
// It asks as the discovery client's ServerResourcesForGroupVersion does,
// but once and within discoveryTimeout in all: that method retries a
// connection closed or reset (as a load balancer with no live backend
// does) ten times a second apart for each group version, so a dead member
// took half a minute to join, and was probed only after that.
func servedResources(ctx context.Context, d discovery.DiscoveryInterface, logger klog.Logger) map[string]bool {
	ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()
	served := map[string]bool{}
	for _, gv := range []string{poolv1.SchemeGroupVersion.String(), gatewayv1.SchemeGroupVersion.String(), gatewayv1beta1.SchemeGroupVersion.String()} {
		list := &metav1.APIResourceList{}
		err := d.RESTClient().Get().AbsPath("/apis", gv).MaxRetries(0).Do(ctx).Into(list)
		switch {
		case apierrors.IsNotFound(err):
			logger.Info("Member does not serve API group version; treating it as empty", "groupVersion", gv)
			continue
		case err != nil:
			for _, r := range []string{"inferencepools", "gateways", "httproutes", "referencegrants", "backendtlspolicies"} {
				served[gv+"/"+r] = true
			}
			continue
		}
		for _, r := range list.APIResources {
			served[gv+"/"+r.Name] = true
		}
	}
	return served
}

// watch passes the informer's changes on as Events. Informers the member
// starts once also count towards hasSynced; the per-namespace ones are
// tracked by poolNamespaces.
func (m *member) watch(informer cache.SharedIndexInformer, kind Kind) {
	notify := func(obj interface{}, deleted bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		o, err := meta.Accessor(obj)
		if err != nil {
			return
		}
		rv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
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
		m.handler(ev)
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj interface{}) { notify(obj, false) },
		UpdateFunc: func(_, obj interface{}) { notify(obj, false) },
		DeleteFunc: func(obj interface{}) { notify(obj, true) },
	})
}

// poolEvent keeps the Services and EndpointSlices of the pool's namespace
// watched while the namespace has pools, and passes the event on once that
// namespace's cache has synced, so that an import is never computed from a
// namespace cache still being filled (its EPP would look missing).
func (m *member) poolEvent(ev Event, deleted bool) {
	if deleted {
		if pools, err := m.poolIndexer.ByIndex(cache.NamespaceIndex, ev.Namespace); err == nil && len(pools) == 0 {
			m.poolNamespaces.release(ev.Namespace)
		}
		m.handler(ev)
		return
	}
	ns, _ := m.poolNamespaces.ensure(ev.Namespace)
	if ns.hasSynced() {
		m.handler(ev)
		return
	}
	go func() {
		if cache.WaitForCacheSync(m.ctx.Done(), ns.hasSynced) {
			m.handler(ev)
		}
	}()
}

// probeLoop checks that the member apiserver answers, every probeInterval
// while it does and with exponential backoff and jitter while it does not
// (so that many replicas probing a dead member do not beat in step), but
// never sleeping past the next threshold. Informers retry on their own,
// with their own jittered backoff; the probe exists because a hung
// apiserver (or a silent partition) keeps a watch open without errors, and
// only a request with a deadline notices.
func (m *member) probeLoop(ctx context.Context, client rest.Interface, th thresholds) {
	logger := klog.FromContext(ctx)
	notify := func(err error) {
		st := m.status()
		logger.Info("Member reachability changed", "member", m.name, "unreachable", st != nil, "removed", st != nil && st.removed, "err", err)
		m.handler(Event{Member: m.name, Kind: KindMember})
	}
	backoff := probeBackoff(th)
	for {
		started := time.Now()
		result := make(chan error, 1)
		go func() { result <- m.probe(ctx, client, th) }()
		// A failing member crosses its thresholds on time even while a
		// probe hangs (a paused apiserver answers nothing until the
		// probe's timeout): no answer yet is no recovery.
		var err error
		for answered := false; !answered; {
			var threshold <-chan time.Time
			var timer *time.Timer
			if d := m.untilThreshold(time.Now(), th); d > 0 {
				timer = time.NewTimer(d)
				threshold = timer.C
			}
			select {
			case err = <-result:
				answered = true
			case <-threshold:
				if m.crossThresholds(time.Now(), th) {
					m.gate.hold()
					notify(m.pendingProbeError())
				}
			}
			if timer != nil {
				timer.Stop()
			}
		}
		if ctx.Err() != nil {
			return // shutting down
		}
		changed, untilNext := m.assess(started, time.Now(), err, th)
		switch {
		case err == nil || reachedServer(err):
			m.gate.release()
		default:
			m.gate.hold()
		}
		if changed {
			notify(err)
		}
		delay := wait.Jitter(probeIntervalFor(th), 0.1)
		if err != nil {
			delay = backoff.Step()
			if untilNext > 0 && untilNext < delay {
				delay = untilNext
			}
		} else {
			backoff = probeBackoff(th)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// errProbePending is the probe outcome logged when a failing member crosses
// a threshold while its latest probe has not answered yet.
var errProbePending = errors.New("the member has not answered its probe yet")

// pendingProbeError is what to log when a member crosses a threshold while
// a probe is in flight: the previous probe's error when there was one (a
// refused connection says more than "no answer yet"), else errProbePending.
func (m *member) pendingProbeError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastError == "" {
		return errProbePending
	}
	return fmt.Errorf("%s (the latest probe has not answered yet)", m.lastError)
}

// probeIntervalFor is how often a member is probed: probeInterval, or a
// quarter of the unreachable threshold when that is shorter. A pending
// probe counts from the member's last answer (untilThreshold), so a probe
// sent a whole threshold after that answer would flag a healthy member
// before it could reply: every threshold holds several probes instead.
func probeIntervalFor(th thresholds) time.Duration {
	if th.unreachableAfter <= 0 {
		return probeInterval
	}
	return min(probeInterval, th.unreachableAfter/4)
}

// probeTimeoutFor gives a probe as long as the unreachable threshold (at
// least probeTimeout): a member that answers at all within the threshold
// is reachable, however slow its link (a 2s link to a member is slow, not
// down). A member that does not answer is flagged on time all the same:
// untilThreshold counts from its last answer while a probe is pending.
func probeTimeoutFor(th thresholds) time.Duration {
	return max(probeTimeout, th.unreachableAfter)
}

// reachedServer reports whether a failed probe got an HTTP answer (an
// error status): the member's apiserver is reachable though not ready, so
// its informers need not wait.
func reachedServer(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status)
}

func probeBackoff(th thresholds) wait.Backoff {
	interval := probeIntervalFor(th)
	return wait.Backoff{Duration: interval, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: max(interval, probeMaxInterval)}
}

// probe asks the member apiserver whether it is ready, within
// probeTimeoutFor the member's threshold.
func (m *member) probe(ctx context.Context, client rest.Interface, th thresholds) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeoutFor(th))
	defer cancel()
	// No retries: a connection refused or reset is the answer.
	return client.Get().AbsPath("/readyz").MaxRetries(0).Do(ctx).Error()
}

// assess records the outcome of a probe sent at started and answered (or
// timed out) at now: a failing member fails from the moment it last
// answered (else from its first failed probe). It reports whether the member's state (reachable, unreachable,
// removed) changed, and how long until the next threshold a failing member
// has not crossed yet (0: none left).
func (m *member) assess(started, now time.Time, err error, th thresholds) (changed bool, untilNext time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		changed = m.unreachable || m.removed
		m.failingSince, m.lastError, m.unreachable, m.removed = time.Time{}, "", false, false
		m.lastAnswered = now
		return changed, 0
	}
	if m.failingSince.IsZero() {
		switch {
		case !m.lastAnswered.IsZero():
			m.failingSince = m.lastAnswered
		case !m.joined.IsZero():
			m.failingSince = m.joined
		default:
			m.failingSince = started
		}
	}
	m.lastError = err.Error()
	changed = m.crossThresholdsLocked(now, th)
	return changed, m.untilThresholdLocked(now, th)
}

// crossThresholds flags a failing member unreachable, then removed, once it
// has failed for as long as their thresholds, and reports whether it did.
// It is called while a probe is pending: a member that has not answered
// for the unreachable threshold since its last answer is failing since
// then, whether or not its pending probe has timed out yet.
func (m *member) crossThresholds(now time.Time, th thresholds) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failingSince.IsZero() && !m.lastAnswered.IsZero() && now.Sub(m.lastAnswered) >= th.unreachableAfter {
		m.failingSince = m.lastAnswered
	}
	return m.crossThresholdsLocked(now, th)
}

func (m *member) crossThresholdsLocked(now time.Time, th thresholds) (changed bool) {
	if m.failingSince.IsZero() {
		return false
	}
	failing := now.Sub(m.failingSince)
	if !m.unreachable && failing >= th.unreachableAfter {
		m.unreachable, changed = true, true
	}
	if !m.removed && th.removeAfter > 0 && failing >= th.removeAfter {
		m.removed, changed = true, true
	}
	return changed
}

// untilThreshold is how long until a failing member crosses its next
// threshold; 0 when it is not failing or has crossed them all. It is
// asked while a probe is pending: a member not failing yet crosses the
// unreachable threshold that long after its last answer.
func (m *member) untilThreshold(now time.Time, th thresholds) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failingSince.IsZero() && !m.lastAnswered.IsZero() {
		return max(m.lastAnswered.Add(th.unreachableAfter).Sub(now), time.Nanosecond)
	}
	return m.untilThresholdLocked(now, th)
}

func (m *member) untilThresholdLocked(now time.Time, th thresholds) time.Duration {
	if m.failingSince.IsZero() {
		return 0
	}
	failing := now.Sub(m.failingSince)
	switch {
	case !m.unreachable:
		return max(th.unreachableAfter-failing, time.Nanosecond)
	case !m.removed && th.removeAfter > 0:
		return max(th.removeAfter-failing, time.Nanosecond)
	}
	return 0
}

func isTimeout(ctx context.Context) bool { return ctx.Err() == context.DeadlineExceeded }

// hasSynced is true once every informer of the member has listed.
func (m *member) hasSynced() bool {
	for _, s := range m.synced {
		if !s() {
			return false
		}
	}
	return m.poolNamespaces.hasSynced()
}

// readyErr says why the member keeps the cache from being ready: it has
// not listed yet and it is not past its removal threshold. A member that
// could not be reached since this replica started counts too: another
// replica that listed it before the outage serves its last known pools
// until that threshold, and a replica that served without them would show
// those pools deleted to every watcher whose connection lands on it (and
// added back at the heal). Past the threshold every replica agrees that
// the member's pools are gone.
func (m *member) readyErr() error {
	if m.hasSynced() {
		return nil
	}
	st := m.status()
	switch {
	case st == nil:
		return fmt.Errorf("member %s has not listed yet", m.name)
	case !st.removed:
		return fmt.Errorf("member %s has not listed since this replica started and is unreachable (since %s: %s); its pools may still be served by replicas that listed them, so this one waits until it lists or the removal threshold passes",
			m.name, st.Since.UTC().Format(time.RFC3339), st.Message)
	}
	return nil
}

// memberStatus is a failing member's state.
type memberStatus struct {
	imports.Unreachable
	removed bool
}

// status returns the member's unreachability, nil when it is reachable.
func (m *member) status() *memberStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.unreachable {
		return nil
	}
	st := &memberStatus{Unreachable: imports.Unreachable{Since: m.failingSince, Message: m.lastError}, removed: m.removed}
	if m.removed {
		st.Message += "; its exported pools are no longer served until it answers again"
	}
	return st
}

func (m *member) view() imports.Member {
	st := m.status()
	if st == nil {
		return m.viewWith(nil)
	}
	if st.removed {
		// Past the removal threshold only the member's namespaces are
		// kept: they say whether it would import (as InferencePoolExports
		// report), while nothing it exported is served any more.
		return imports.Member{Name: m.name, Unreachable: &st.Unreachable, Namespaces: m.namespaces}
	}
	return m.viewWith(&st.Unreachable)
}

func (m *member) viewWith(u *imports.Unreachable) imports.Member {
	v := imports.Member{
		Name:           m.name,
		Unreachable:    u,
		Namespaces:     m.namespaces,
		Pools:          m.pools,
		Services:       m.services,
		EndpointSlices: m.endpointSlices,
		Gateways:       m.gateways,

		BackendTLSPolicies: m.backendTLSPolicies,
	}
	if m.local {
		v.Routes = imports.NewRouteIndex(m.routeIndexer)
		v.ReferenceGrants = m.grants
	}
	return v
}

func (m *member) stop() {
	m.cancel()
	<-m.done
}

// importsRoutedThrough returns the namespace/name keys of the imports used by
// the member's HTTPRoutes that name Gateway namespace/gateway as a parent
// (only the local member watches routes).
func (m *member) importsRoutedThrough(namespace, gateway string) []string {
	return m.importsOfRoutes(indexRouteParent, namespace+"/"+gateway)
}

// importsRoutedFrom returns the namespace/name keys of the imports used by
// the member's HTTPRoutes of namespace.
func (m *member) importsRoutedFrom(namespace string) []string {
	return m.importsOfRoutes(cache.NamespaceIndex, namespace)
}

// importsOfRoutes returns the imports used by the routes that the route
// index indexName files under key, without duplicates.
func (m *member) importsOfRoutes(indexName, key string) []string {
	if m.routeIndexer == nil {
		return nil
	}
	objs, err := m.routeIndexer.ByIndex(indexName, key)
	if err != nil {
		return nil
	}
	var keys []string
	for _, o := range objs {
		if r, ok := o.(*gatewayv1.HTTPRoute); ok {
			for _, k := range imports.ImportBackendRefs(r) {
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
	}
	return keys
}

// poolsUsingService lists the pools of namespace whose endpointPickerRef
// names service.
func (m *member) poolsUsingService(namespace, service string) []string {
	objs, err := m.poolIndexer.ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		return nil
	}
	var names []string
	for _, o := range objs {
		if p, ok := o.(*poolv1.InferencePool); ok && p.Spec.EndpointPickerRef.Name == service {
			names = append(names, p.Namespace+"/"+p.Name)
		}
	}
	return names
}

// poolsIndexedBy returns the namespace/name keys of the pools of this
// member whose index value is key.
func (m *member) poolsIndexedBy(index, key string) []string {
	objs, err := m.poolIndexer.ByIndex(index, key)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*poolv1.InferencePool); ok {
			names = append(names, p.Namespace+"/"+p.Name)
		}
	}
	return names
}
