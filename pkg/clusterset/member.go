package clusterset

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gatewaylisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"
	gatewaylistersv1beta1 "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/generated/clientset/versioned/scheme"
	inferencev1alpha1client "github.com/mci-dev/mci/pkg/generated/clientset/versioned/typed/inference/v1alpha1"
	inferencelisters "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha1"
	poollisters "github.com/mci-dev/mci/pkg/generated/listers/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/jsonframe"
	"github.com/mci-dev/mci/pkg/noserver"
	"github.com/mci-dev/mci/pkg/statelog"
)

// discoveryTimeout bounds asking a member which APIs it serves.
const discoveryTimeout = 5 * time.Second

// member is one connected member cluster: its informers and listers
// (informers.go), its reachability (probe.go, reachability.go) and its route
// and pool indexes (indexes.go). It is started once and stopped once; a
// changed kubeconfig replaces the whole member.
type member struct {
	name string
	// local is the cluster this server serves: only there are HTTPRoutes
	// and ReferenceGrants watched, and only there do pools keep every
	// status.parents entry (see trimOther).
	local bool
	// source identifies the kubeconfig the member was built from, so a
	// changed Secret or file reconnects it.
	source string

	// gate holds the requests of every client of the member but the
	// probe while the probe cannot reach the member; probeClient goes
	// around it.
	gate        *linkGate
	probeClient rest.Interface
	// summaryClient reads the member's summaries (summary mode): one
	// REST client, not a clientset of every API group's.
	summaryClient inferencev1alpha1client.InferenceV1alpha1Interface
	// mci, kube and gateway are made for full mode only (objectClients),
	// from gatedConfig and gatedClient, which every gated client shares;
	// the clients asked once in a while (discovery, the cluster ID) are
	// made when asked (discoveryClient, coreClient).
	mci         mciclient.Interface
	kube        kubernetes.Interface
	gateway     gatewayclient.Interface
	gatedConfig *rest.Config
	gatedClient *http.Client
	ctx         context.Context
	cancel      context.CancelFunc
	done        chan struct{}
	synced      []cache.InformerSynced
	handler     Handler

	namespaces     corev1listers.NamespaceLister
	pools          poollisters.InferencePoolLister
	services       corev1listers.ServiceLister
	endpointSlices discoverylisters.EndpointSliceLister
	pods           corev1listers.PodLister
	gateways       gatewaylisters.GatewayLister
	poolIndexer    cache.Indexer
	// routeIndexer and grants are set for the local member only.
	routeIndexer   cache.Indexer
	grants         gatewaylistersv1beta1.ReferenceGrantLister
	poolNamespaces *poolNamespaces
	// backendTLSPolicies is nil when the member does not serve them.
	backendTLSPolicies gatewaylisters.BackendTLSPolicyLister

	// config is what the member was built from: a member whose mode
	// changes (mode.go) is rebuilt from it.
	config *rest.Config
	// summaryPolicy says whether the member may be read through its
	// summaries; mode is set once started (mode.go). In modeSummary
	// (summaries.go) summaries and clusterSummaries are its only
	// informers, and the listers of its objects above are nil; in
	// modeDiscovering it has no informer at all.
	summaryPolicy    Summaries
	mode             memberMode
	summaries        inferencelisters.InferencePoolExportSummaryLister
	clusterSummaries *clusterSummaryIndexer
	summaryStream    summaryStream

	// th are the member's thresholds, as started.
	th thresholds
	// quota bounds what the member may make this server hold (quota.go);
	// nil for the local cluster.
	quota *quota

	// created is when the member's Secret or ClusterProfile was created
	// (zero for a kubeconfig file): which of two members of one cluster
	// keeps it (identity.go).
	created time.Time
	// identity is the cluster ID the member read (identity.go).
	identity *clusterID
	// freezeLog, the Cache's, says each member's freeze once per change,
	// whichever instance of it froze; nil: every freeze is said.
	freezeLog *statelog.Log[string]
	stopOnce  sync.Once
	stopped   chan struct{}

	// reachability is what the member's probes found.
	reachability
	// credentials are what the member says of the credentials it is read
	// with, and hold its inline bearer token, client certificate and CA
	// (credentials.go).
	credentials *credentials
	// credentialless fingerprints the member's kubeconfig without the
	// values of its inline credentials and CA: a change of those alone is
	// rotated in place (Cache.rotateInPlace). "" when client-go reads any
	// of them from a file or a plugin.
	credentialless string
	// rotated is the source and configuration of the latest in-place
	// rotation, which replace source and config; guarded by rotatedMu.
	rotatedMu sync.Mutex
	rotated   *rotation
}

// rotation is a member's kubeconfig whose credentials changed in place.
type rotation struct {
	source string
	config *rest.Config
}

// current is the source and configuration the member now reads with: the
// ones it was built from, or its latest in-place rotation.
func (m *member) current() (string, *rest.Config) {
	m.rotatedMu.Lock()
	defer m.rotatedMu.Unlock()
	if m.rotated != nil {
		return m.rotated.source, m.rotated.config
	}
	return m.source, m.config
}

func newMember(name, source string, config *rest.Config, responseBytes int64, handler Handler) (*member, error) {
	config = rest.CopyConfig(config)
	config.UserAgent = "mci-apiserver"
	// Hundreds of pools across many members should not queue behind the
	// default client-side rate limit at start-up.
	if config.QPS == 0 {
		config.QPS = 50
		config.Burst = 100
	}
	// Uncompressed: a gzip-encoded watch holds a decompressor with its
	// 32 KiB window for as long as it lives, about 40 KiB per stream and
	// two streams per member in summary mode, more than the member's
	// summaries take; what a member sends is small, and its size is
	// bounded as decoded either way (boundResponses).
	config.DisableCompression = true
	m := &member{name: name, source: source, config: rest.CopyConfig(config), gate: newLinkGate(), handler: handler, identity: &clusterID{}, stopped: make(chan struct{})}
	m.credentials = newCredentials(config, m.credentialsChanged)
	if responseBytes > 0 {
		config.Wrap(boundResponses(responseBytes, m.responseTooLarge))
	}
	// A member's kube-apiserver that is starting is asked again within a
	// second (noserver), not after the 5 s it asks for.
	config.Wrap(noserver.WithoutRetryAfter)
	// The probe goes around the gate: it is what opens it again.
	// One REST client, not a clientset of every API group's.
	probe, err := discovery.NewDiscoveryClientForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	m.probeClient = probe.RESTClient()
	gated := rest.CopyConfig(config)
	gated.Wrap(m.gate.wrap)
	// One HTTP client for every request that waits at the gate.
	if m.gatedClient, err = rest.HTTPClientFor(gated); err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	m.gatedConfig = gated
	if m.summaryClient, err = summaryClientFor(gated, m.gatedClient); err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	// The clients made when asked are made from this configuration: an
	// error here would be theirs.
	if _, err := m.discoveryClient(); err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	return m, nil
}

// summaryClientFor is the generated client of the summary API, configured
// as its constructor would, but for the framer of its watches: a member
// has its two summary watches open at any time, and apimachinery's JSON
// framer keeps a buffer as large as the largest event for each watch's
// life (jsonframe).
func summaryClientFor(config *rest.Config, httpClient *http.Client) (*inferencev1alpha1client.InferenceV1alpha1Client, error) {
	config = rest.CopyConfig(config)
	gv := v1alpha1.SchemeGroupVersion
	config.GroupVersion, config.APIPath = &gv, "/apis"
	config.NegotiatedSerializer = jsonframe.NegotiatedSerializer(rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion())
	client, err := rest.RESTClientForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	return inferencev1alpha1client.New(client), nil
}

// discoveryClient asks which optional APIs the member serves, within
// discoveryTimeout: discovery must not wait forever on a hung member. It
// is asked when the member starts and at each recheck (mode.go), so it is
// made then rather than kept by every member.
func (m *member) discoveryClient() (discovery.DiscoveryInterface, error) {
	bounded := rest.CopyConfig(m.gatedConfig)
	bounded.Timeout = discoveryTimeout
	return discovery.NewDiscoveryClientForConfigAndClient(bounded, &http.Client{Transport: m.gatedClient.Transport, Timeout: discoveryTimeout})
}

// coreClient reads the member's cluster ID (identity.go), asked when the
// member joins and at rechecks while it could not be read.
func (m *member) coreClient() (corev1client.CoreV1Interface, error) {
	return corev1client.NewForConfigAndClient(m.gatedConfig, m.gatedClient)
}

// objectClients makes the clientsets full mode watches the member's
// objects with. A clientset holds a REST client, and its rate limiter, for
// each API group it knows, about 10 KiB for Kubernetes' own: a member read
// in summary mode, which has no use for them, does without.
func (m *member) objectClients() error {
	if m.kube != nil {
		return nil
	}
	kube, err := kubernetes.NewForConfigAndClient(m.gatedConfig, m.gatedClient)
	if err != nil {
		return fmt.Errorf("member %s: %w", m.name, err)
	}
	gateway, err := gatewayclient.NewForConfigAndClient(m.gatedConfig, m.gatedClient)
	if err != nil {
		return fmt.Errorf("member %s: %w", m.name, err)
	}
	mci, err := mciclient.NewForConfigAndClient(m.gatedConfig, m.gatedClient)
	if err != nil {
		return fmt.Errorf("member %s: %w", m.name, err)
	}
	m.kube, m.gateway, m.mci = kube, gateway, mci
	return nil
}

func (m *member) stop() {
	m.cancel()
	<-m.done
	if m.stopped != nil {
		m.stopOnce.Do(func() { close(m.stopped) })
	}
}

// isStopped reports whether stop has returned.
func (m *member) isStopped() bool {
	if m.stopped == nil {
		return false
	}
	select {
	case <-m.stopped:
		return true
	default:
		return false
	}
}

// hasSynced is true once every informer of the member has listed.
func (m *member) hasSynced() bool {
	for _, s := range m.synced {
		if !s() {
			return false
		}
	}
	return m.poolNamespaces == nil || m.poolNamespaces.hasSynced()
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
	if m.hasSynced() || m.flaggedUnlistable() {
		return nil
	}
	st := m.status()
	switch {
	case st != nil && !st.removed:
		return fmt.Errorf("member %s has not listed since this replica started and is unreachable (since %s: %s); its pools may still be served by replicas that listed them, so this one waits until it lists or the removal threshold passes",
			m.name, st.Since.UTC().Format(time.RFC3339), st.Message)
	case st != nil:
		return nil
	case m.mode == modeDiscovering:
		// A member that answers its probe but not its discovery would
		// otherwise hold readiness for good: it holds it as one that does
		// not answer at all, until its removal threshold from joining.
		if m.th.removeAfter > 0 && time.Since(m.joined) >= m.th.removeAfter {
			return nil
		}
		return fmt.Errorf("member %s has not said yet whether it publishes summaries (its API discovery cannot be asked); it is asked again with backoff", m.name)
	}
	return fmt.Errorf("member %s has not listed yet", m.name)
}

// flaggedUnlistable reports whether the member answers but is flagged for
// a reason that keeps it from listing: frozen for what it sends, or
// refusing the credentials it is read with. Such a member does not hold
// readiness once flagged, as a removed one: it is never removed while it
// answers, so waiting for its removal threshold would only delay the same
// outcome (the replica serving it without what it never listed), while
// every replica that restarts during an operator's mistake on one member
// stays out of service. It is served flagged, with what it last listed, or
// nothing of it when it has listed nothing since this replica started.
// A member that refuses the credentials and then stops answering is
// unreachable, flagged and held as such (view, readyErr).
func (m *member) flaggedUnlistable() bool {
	return m.frozen() || (m.status() == nil && m.credentials.rejected() != nil)
}

func (m *member) view() imports.Member {
	st := m.status()
	if st == nil {
		// A member that refuses its credentials answers: its last known
		// data is served, flagged, however long it refuses them (see
		// docs/membership.md, Credentials).
		return m.viewWith(m.frozenFlag(m.credentialsFlag()))
	}
	if st.removed {
		// Past the removal threshold only the member's namespaces are
		// kept: they say whether it would import (as InferencePoolExports
		// report), while nothing it exported is served any more.
		return imports.Member{Name: m.name, Unreachable: m.frozenFlag(&st.Unreachable), Namespaces: m.namespaceLister()}
	}
	return m.viewWith(m.frozenFlag(&st.Unreachable))
}

// namespaceLister is the member's namespaces: watched, or as its cluster
// summary lists them.
func (m *member) namespaceLister() corev1listers.NamespaceLister {
	switch m.mode {
	case modeSummary:
		return m.summaryNamespaces(m.heldClusterSummary())
	case modeDiscovering:
		return imports.SummaryNamespaces(nil)
	}
	return m.namespaces
}

func (m *member) viewWith(u *imports.Unreachable) imports.Member {
	held := m.heldClusterSummary()
	if m.speaksForAnother(held) {
		// What it sent is another cluster's, in whichever mode it was
		// read: serving it under this member's name would count that
		// cluster's exports twice.
		return imports.Member{Name: m.name, Unreachable: u, Namespaces: imports.SummaryNamespaces(nil), Summaries: noSummaries}
	}
	switch m.mode {
	case modeSummary:
		return imports.Member{Name: m.name, Unreachable: u, Namespaces: m.summaryNamespaces(held), Summaries: m.summaries}
	case modeDiscovering:
		// Nothing is known of the member yet: it imports and exports
		// nothing, as a member that has not listed.
		return imports.Member{Name: m.name, Unreachable: u, Namespaces: imports.SummaryNamespaces(nil), Summaries: noSummaries}
	}
	v := imports.Member{
		Name:           m.name,
		Unreachable:    u,
		Namespaces:     m.namespaces,
		Pools:          m.pools,
		Services:       m.services,
		EndpointSlices: m.endpointSlices,
		Pods:           m.pods,
		Gateways:       m.gateways,

		BackendTLSPolicies: m.backendTLSPolicies,
	}
	if m.local {
		v.Routes = imports.NewRouteIndex(m.routeIndexer)
		v.ReferenceGrants = m.grants
	}
	return v
}
