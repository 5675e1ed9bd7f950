package epptransport

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/imports"
)

// CredentialsLabel marks the Secrets the sidecar may use as EPP
// credentials (what an InferencePool's mci.x-k8s.io/endpoint-picker-secret,
// and so an import's secretRefs, name): it reads only Secrets labelled
// CredentialsLabel=true, and only in the namespaces it is given. So it never
// holds another Secret, and the Secrets it uses are opted in by their owner.
const CredentialsLabel = "mci.x-k8s.io/endpoint-picker-credentials"

// The keys of an EPP credentials Secret. A kubernetes.io/tls Secret with a
// ca.crt (as cert-manager writes them) has this shape.
const (
	// SecretCAKey (required) is the PEM bundle of the CAs that verify the
	// EPP's serving certificate.
	SecretCAKey = "ca.crt"
	// SecretCertKey and SecretKeyKey (optional, together) are the client
	// certificate and its private key, for EPPs that require mutual TLS.
	SecretCertKey = corev1.TLSCertKey
	SecretKeyKey  = corev1.TLSPrivateKeyKey
	// SecretServerNameKey (optional) is the name the serving certificate is
	// verified against; without it, the host the sidecar dials (the import's
	// address: an IP or a hostname).
	SecretServerNameKey = "server-name"
)

// Credentials gives each address of the routing table (EPP ext_proc and
// health addresses, metrics URLs) what it is reached with: plaintext, or TLS
// with the credentials of the Secret its cluster names. Secrets come from
// informers, one per namespace given, restricted to CredentialsLabel; a
// Secret is parsed once per version, and its problems are logged once per
// change. An address whose Secret is missing or unusable gets an error: the
// cluster fails (the next one is tried), it is never reached in plaintext.
//
// A nil *Credentials reaches every address in plaintext.
type Credentials struct {
	client     kubernetes.Interface
	namespaces []string
	logger     klog.Logger
	synced     chan struct{}
	// listers by namespace; written before synced is closed, read after.
	listers map[string]corelisters.SecretNamespaceLister

	// configMaps are the CA ConfigMaps of BackendTLSPolicies, by
	// namespace; written before synced is closed, read after.
	configMaps map[string]corelisters.ConfigMapNamespaceLister

	mu sync.RWMutex
	// targets are the addresses of the table, with how each is reached.
	targets map[string]target
	// loaded is the last outcome of each Secret in use.
	loaded map[types.NamespacedName]*loadedSecret
	// validated is the last outcome of each BackendTLSPolicy validation
	// in use, by namespace and validation.
	validated map[string]*loadedValidation
	// failures is the last connection error of each address that failed
	// since it last answered.
	failures  map[string]failure
	conflicts string

	transportGauge *prometheus.GaugeVec
	failureCounter *prometheus.CounterVec
}

// EndpointTLS is how an address is reached.
type EndpointTLS struct {
	// Version identifies the credentials, "" for plaintext: connections are
	// kept per address and version, so that changed credentials dial anew.
	Version string
	// Config is nil for plaintext.
	Config *tls.Config
	// GRPC are the same credentials for a gRPC client.
	GRPC credentials.TransportCredentials
}

var plaintext = &EndpointTLS{GRPC: insecure.NewCredentials()}

// loadedSecret is what one version of a Secret gave.
type loadedSecret struct {
	// version is the Secret's uid and resourceVersion; "" when it does not
	// exist.
	version string
	tls     *EndpointTLS
	err     error
}

// NewCredentials returns credentials read with client from the Secrets of
// namespaces. Without namespaces no Secret is read, and every address that
// needs one fails.
func NewCredentials(client kubernetes.Interface, namespaces []string, logger klog.Logger) *Credentials {
	return &Credentials{
		client:     client,
		namespaces: slices.Compact(slices.Sorted(slices.Values(namespaces))),
		logger:     logger,
		synced:     make(chan struct{}),
		listers:    map[string]corelisters.SecretNamespaceLister{},
		configMaps: map[string]corelisters.ConfigMapNamespaceLister{},
		targets:    map[string]target{},
		loaded:     map[types.NamespacedName]*loadedSecret{},
		validated:  map[string]*loadedValidation{},
		failures:   map[string]failure{},
	}
}

// registerMetrics registers mci_sidecar_epp_transport and
// mci_sidecar_epp_connection_failures_total in reg.
func (c *Credentials) RegisterMetrics(reg prometheus.Registerer) {
	c.transportGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mci_sidecar_epp_transport",
		Help: "1 for the transport each port of each cluster's EPP is reached with: plaintext, tls-unverified (TLS asked with no Secret or BackendTLSPolicy to verify with), tls-verified (a BackendTLSPolicy), tls-secret (the pool's credentials Secret).",
	}, []string{"cluster", "port", "transport"})
	c.failureCounter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mci_sidecar_epp_connection_failures_total",
		Help: "Failed connections to a port of a cluster's EPP (refused or reset, TLS handshake or credentials failure, a transport the EPP does not serve, no answer in time: a blackholed or stalled link), by the transport asked for. The cluster fails over; nothing is retried with a weaker transport.",
	}, []string{"cluster", "port", "transport"})
	reg.MustRegister(c.transportGauge, c.failureCounter)
}

// Synced is closed once the Secrets are listed.
func (c *Credentials) Synced() <-chan struct{} { return c.synced }

// Run watches the Secrets until ctx ends.
func (c *Credentials) Run(ctx context.Context) error {
	selector := labels.Set{CredentialsLabel: "true"}.AsSelector().String()
	var synced []cache.InformerSynced
	var factories []kubeinformers.SharedInformerFactory
	for _, ns := range c.namespaces {
		f := kubeinformers.NewSharedInformerFactoryWithOptions(c.client, 0,
			kubeinformers.WithNamespace(ns),
			kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }),
			kubeinformers.WithTransform(StripManagedFields))
		inf := f.Core().V1().Secrets()
		reg, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    c.changed,
			UpdateFunc: func(_, obj any) { c.changed(obj) },
			DeleteFunc: c.changed,
		})
		if err != nil {
			return err
		}
		c.listers[ns] = inf.Lister().Secrets(ns)
		// The CA ConfigMaps of BackendTLSPolicies, with the same label:
		// resolved on use, by version, like the Secrets.
		cms := f.Core().V1().ConfigMaps()
		c.configMaps[ns] = cms.Lister().ConfigMaps(ns)
		synced = append(synced, reg.HasSynced, cms.Informer().HasSynced)
		factories = append(factories, f)
		f.Start(ctx.Done())
	}
	defer func() {
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	if len(c.namespaces) > 0 {
		c.logger.Info("Waiting for the Secrets of EPP credentials", "namespaces", c.namespaces, "labelSelector", selector)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	close(c.synced)
	c.mu.RLock()
	inUse := slices.Collect(func(yield func(types.NamespacedName) bool) {
		for _, tg := range c.targets {
			if tg.transport.TLS && tg.transport.Secret.Name != "" && !yield(tg.transport.Secret) {
				return
			}
		}
	})
	c.mu.RUnlock()
	for _, ref := range inUse {
		_, _ = c.resolve(ref)
	}
	<-ctx.Done()
	return nil
}

// changed loads a Secret in use again as soon as it changes, so that its
// problems (or their fix) are logged without waiting for a request.
func (c *Credentials) changed(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	ref := types.NamespacedName{Namespace: ns, Name: name}
	c.mu.RLock()
	_, inUse := c.loaded[ref]
	c.mu.RUnlock()
	if inUse && c.isSynced() {
		_, _ = c.resolve(ref)
	}
}

func (c *Credentials) isSynced() bool {
	select {
	case <-c.synced:
		return true
	default:
		return false
	}
}

// Target is one address of a cluster's EPP (its ext_proc, health or
// metrics port) and how it is reached.
type Target struct {
	// Addr is the address as it is dialled ("host:port") or scraped (the
	// metrics URL); "" is none.
	Addr string
	// Cluster names the cluster, Port the port (imports.PortExtProc,
	// PortHealth or PortMetrics), for logs and metrics.
	Cluster, Port string
	Transport     imports.PortTransport
}

// SetTargets makes the addresses of the routing table's clusters reached
// with their transports, and forgets Secrets no longer named. An address that clusters
// name with different transports (pools sharing one EPP but not their
// annotations) is reached with the first TLS one rather than plaintext,
// and the problem is logged. Each address's transport is logged when it
// changes and exposed as mci_sidecar_epp_transport.
func (c *Credentials) SetTargets(list []Target) {
	if c == nil {
		return
	}
	targets := map[string]target{}
	conflicts := map[string][]string{}
	for _, tg := range list {
		addr, pt := tg.Addr, tg.Transport
		if addr == "" {
			continue
		}
		next := target{cluster: tg.Cluster, port: tg.Port, transport: pt, key: pt.Key()}
		prev, seen := targets[addr]
		if seen && prev.transport.Key() != pt.Key() {
			conflicts[addr] = append(conflicts[addr], describe(prev.transport), describe(pt))
		}
		// TLS over plaintext; among TLS ones, the first by key.
		if !seen || (!prev.transport.TLS && pt.TLS) || (pt.TLS && pt.Key() < prev.transport.Key()) {
			targets[addr] = next
		}
	}
	inUse := map[types.NamespacedName]bool{}
	for _, tg := range targets {
		if tg.transport.TLS && tg.transport.Secret.Name != "" {
			inUse[tg.transport.Secret] = true
		}
	}

	c.mu.Lock()
	prevTargets := c.targets
	c.targets = targets
	for ref := range c.loaded {
		if !inUse[ref] {
			delete(c.loaded, ref)
		}
	}
	for k := range c.failures {
		if _, ok := targets[k]; !ok {
			delete(c.failures, k)
		}
	}
	report := describeConflicts(conflicts)
	changed := report != c.conflicts
	c.conflicts = report
	c.mu.Unlock()
	if changed && report != "" {
		c.logger.Info("Addresses are named with different transports by different clusters; each is reached with TLS", "conflicts", report)
	}
	c.reportTransports(prevTargets, targets)
	if c.isSynced() {
		for ref := range inUse {
			_, _ = c.resolve(ref)
		}
	}
}

// target is an address of the table: the cluster and port it is of, and
// how it is reached.
type target struct {
	cluster, port string
	transport     imports.PortTransport
	// key is transport.Key(), computed once rather than per request.
	key string
}

// describe names a transport for the logs.
func describe(p imports.PortTransport) string {
	switch p.Kind() {
	case imports.TransportKindSecret:
		return "TLS with Secret " + p.Secret.String()
	case imports.TransportKindVerified:
		return "TLS verified by BackendTLSPolicy " + p.Namespace + "/" + p.Validation.PolicyName
	}
	return p.Kind()
}

// reportTransports logs each address whose transport is new or changed,
// and sets mci_sidecar_epp_transport.
func (c *Credentials) reportTransports(prev, next map[string]target) {
	for addr, tg := range next {
		if p, ok := prev[addr]; ok && p.transport.Key() == tg.transport.Key() && p.cluster == tg.cluster {
			continue
		}
		kv := []any{"cluster", tg.cluster, "port", tg.port, "address", addr, "transport", describe(tg.transport)}
		if tg.transport.Kind() == imports.TransportKindUnverified {
			// Asked for (a TLS mode with no Secret and no BackendTLSPolicy
			// to verify with), as gateways reach an EPP's self-signed
			// certificate; said once, so that nobody takes it for verified.
			c.logger.Info("EPP port reached with TLS whose certificate is not verified: add a BackendTLSPolicy for its Service (or the pool's credentials Secret) to verify it", kv...)
			continue
		}
		c.logger.Info("EPP port transport", kv...)
	}
	if c.transportGauge == nil {
		return
	}
	c.transportGauge.Reset()
	for _, tg := range next {
		c.transportGauge.WithLabelValues(tg.cluster, tg.port, tg.transport.Kind()).Set(1)
	}
}

func describeConflicts(conflicts map[string][]string) string {
	var out []string
	for target, refs := range conflicts {
		refs = slices.Compact(slices.Sorted(slices.Values(refs)))
		out = append(out, target+": "+strings.Join(refs, ", "))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// unverifiedTLS is TLS whose serving certificate is not verified.
var unverifiedTLS = func() *EndpointTLS {
	config := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // asked for: see imports.PortTransport
	return &EndpointTLS{Version: imports.TransportKindUnverified, Config: config, GRPC: credentials.NewTLS(config)}
}()

// forTarget returns how target (an address of the table) is reached.
func (c *Credentials) ForTarget(addr string) (*EndpointTLS, error) {
	if c == nil {
		return plaintext, nil
	}
	c.mu.RLock()
	tg, ok := c.targets[addr]
	c.mu.RUnlock()
	if !ok || !tg.transport.TLS {
		return plaintext, nil
	}
	switch tg.transport.Kind() {
	case imports.TransportKindSecret:
		t, err := c.resolve(tg.transport.Secret)
		if err != nil {
			return nil, fmt.Errorf("TLS credentials for %s: %w", addr, err)
		}
		return t, nil
	case imports.TransportKindVerified:
		t, err := c.resolveValidation(tg.transport.Namespace, tg.transport.Validation, tg.key)
		if err != nil {
			return nil, fmt.Errorf("TLS validation for %s: %w", addr, err)
		}
		return t, nil
	}
	return unverifiedTLS, nil
}

// Failed records that addr could not be reached (a refused or reset
// connection, a failed TLS handshake, a transport of the wrong kind, no
// answer in time: the error says which). Every failure is counted in
// mci_sidecar_epp_connection_failures_total. It is logged when addr turns
// unreachable, and again when its error changes: at once when the gRPC
// code changes, else at most once a minute (a reset link alternates
// between "EOF" and "connection reset by peer" from one attempt to the
// next), the other changes at level 2.
func (c *Credentials) Failed(addr string, err error) {
	if c == nil || err == nil {
		return
	}
	now := time.Now()
	c.mu.Lock()
	tg := c.targets[addr]
	prev, known := c.failures[addr]
	f := failure{msg: err.Error(), code: status.Code(err), logged: prev.logged}
	changed := !known || prev.msg != f.msg
	loud := !known || prev.code != f.code || now.Sub(prev.logged) >= failureLogInterval
	if changed && loud {
		f.logged = now
	}
	c.failures[addr] = f
	c.mu.Unlock()
	kind := tg.transport.Kind()
	if c.failureCounter != nil {
		c.failureCounter.WithLabelValues(tg.cluster, tg.port, kind).Inc()
	}
	if !changed {
		return
	}
	const msg = "EPP port unreachable with its transport: the cluster fails over or follows its failure mode, never a weaker transport"
	kv := []any{"cluster", tg.cluster, "port", tg.port, "address", addr, "transport", describe(tg.transport)}
	if loud {
		c.logger.Error(err, msg, kv...)
		return
	}
	// logr's Error ignores verbosity: the quiet changes are Info.
	c.logger.V(2).Info(msg, append(kv, "err", err)...)
}

// failureLogInterval bounds how often the changing errors of one
// unreachable address are logged at level 0.
const failureLogInterval = time.Minute

// failure is the last error of an address that failed, and when an error
// of it was last logged at level 0.
type failure struct {
	msg    string
	code   codes.Code
	logged time.Time
}

// Reached records that addr answered, so that its next failure is logged
// again.
func (c *Credentials) Reached(addr string) {
	if c == nil {
		return
	}
	c.mu.RLock()
	_, failed := c.failures[addr]
	c.mu.RUnlock()
	if failed {
		c.mu.Lock()
		delete(c.failures, addr)
		c.mu.Unlock()
		c.logger.Info("EPP port reachable again", "address", addr)
	}
}

// resolve returns the credentials of the Secret's current version, loading
// them when it changed.
func (c *Credentials) resolve(ref types.NamespacedName) (*EndpointTLS, error) {
	if !c.isSynced() {
		return nil, fmt.Errorf("the sidecar has not listed the Secrets of EPP credentials yet (Secret %s)", ref)
	}
	lister := c.listers[ref.Namespace]
	var secret *corev1.Secret
	version := ""
	if lister != nil {
		if s, err := lister.Get(ref.Name); err == nil {
			secret, version = s, string(s.UID)+"/"+s.ResourceVersion
		}
	}
	c.mu.RLock()
	l := c.loaded[ref]
	c.mu.RUnlock()
	if l != nil && l.version == version {
		return l.tls, l.err
	}

	l = &loadedSecret{version: version}
	switch {
	case lister == nil:
		l.err = fmt.Errorf("Secret %s: namespace %s is not one of the sidecar's --endpoint-picker-secret-namespaces, so the sidecar reads no Secret there", ref, ref.Namespace)
	case secret == nil:
		l.err = fmt.Errorf("Secret %s labelled %s=true does not exist", ref, CredentialsLabel)
	default:
		var config *tls.Config
		if config, l.err = secretTLSConfig(secret); l.err == nil {
			l.tls = &EndpointTLS{Version: ref.String() + "/" + version, Config: config, GRPC: credentials.NewTLS(config)}
		}
	}

	c.mu.Lock()
	prev := c.loaded[ref]
	if prev != nil && prev.version == version {
		// Loaded meanwhile by another caller, who logged it.
		c.mu.Unlock()
		return prev.tls, prev.err
	}
	c.loaded[ref] = l
	c.mu.Unlock()
	c.log(ref, prev, l, secret)
	return l.tls, l.err
}

// log reports a Secret's new outcome: its problem when it has a new one,
// that it is in use when it was not or changed. Never its data.
func (c *Credentials) log(ref types.NamespacedName, prev, l *loadedSecret, secret *corev1.Secret) {
	switch {
	case l.err != nil:
		if prev == nil || prev.err == nil || prev.err.Error() != l.err.Error() {
			c.logger.Error(l.err, "EPP credentials are unusable: the EPPs that need them are not reached, and their clusters fail over or follow the failure mode", "secret", klog.KRef(ref.Namespace, ref.Name))
		}
	default:
		c.logger.Info("EPP credentials loaded", "secret", klog.KRef(ref.Namespace, ref.Name), "resourceVersion", secret.ResourceVersion,
			"clientCertificate", len(l.tls.Config.Certificates) > 0, "serverName", l.tls.Config.ServerName)
	}
}

// secretTLSConfig is the client TLS configuration of an EPP credentials
// Secret. Errors name the Secret and the key, never the data.
func secretTLSConfig(s *corev1.Secret) (*tls.Config, error) {
	ref := s.Namespace + "/" + s.Name
	caPEM := s.Data[SecretCAKey]
	if len(caPEM) == 0 {
		return nil, fmt.Errorf("Secret %s has no %s: the CA that verifies the EPP's serving certificate is required", ref, SecretCAKey)
	}
	roots, err := certutil.NewPoolFromBytes(caPEM)
	if err != nil {
		return nil, fmt.Errorf("Secret %s: %s: %w", ref, SecretCAKey, err)
	}
	config := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    roots,
		ServerName: strings.TrimSpace(string(s.Data[SecretServerNameKey])),
	}
	certPEM, hasCert := s.Data[SecretCertKey]
	keyPEM, hasKey := s.Data[SecretKeyKey]
	switch {
	case hasCert && hasKey:
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("Secret %s: the client certificate %s with %s: %w", ref, SecretCertKey, SecretKeyKey, err)
		}
		config.Certificates = []tls.Certificate{pair}
	case hasCert:
		return nil, fmt.Errorf("Secret %s has %s but no %s: a client certificate needs its key", ref, SecretCertKey, SecretKeyKey)
	case hasKey:
		return nil, fmt.Errorf("Secret %s has %s but no %s: a client key needs its certificate", ref, SecretKeyKey, SecretCertKey)
	}
	return config, nil
}

// StripManagedFields is the transform of the sidecar's informers (these
// and the routing table's): nothing reads managed fields, so the caches
// drop them.
func StripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}
