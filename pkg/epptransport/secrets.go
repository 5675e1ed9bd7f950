package epptransport

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/informerhealth"
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

// loadedSecret is what one version of a Secret gave.
type loadedSecret struct {
	// version is the Secret's uid and resourceVersion; "" when it does not
	// exist.
	version string
	tls     *EndpointTLS
	err     error
}

// Run watches the Secrets until ctx ends.
func (c *Credentials) Run(ctx context.Context) error {
	selector := labels.Set{CredentialsLabel: "true"}.AsSelector().String()
	var synced []cache.InformerSynced
	var factories []kubeinformers.SharedInformerFactory
	for _, ns := range c.namespaces {
		f := kubeinformers.NewSharedInformerFactoryWithOptions(c.client, 0,
			kubeinformers.WithNamespace(ns),
			kubeinformers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }),
			kubeinformers.WithTransform(informerhealth.StripManagedFields))
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

// SecretTokenKey of a metrics token Secret (Target.Token), or optionally of
// an EPP credentials Secret, is a bearer token the sidecar sends with its
// scrapes of the EPP's /metrics, for EPPs that require one (upstream EPPs
// do by default). It takes precedence over the sidecar's own token file.
const SecretTokenKey = "token"

// MetricsToken returns the bearer token for a metrics URL and the Secret it
// comes from: the URL's token Secret, else its credentials Secret; "" when
// it has neither, or the credentials Secret no token. A token Secret that
// is missing, outside the sidecar's namespaces or without a token is an
// error (the scrape fails, never sent without the token it names); a
// missing credentials Secret is not this function's to report: ForTarget
// fails the scrape first.
func (c *Credentials) MetricsToken(target string) (token, secret string, err error) {
	if c == nil {
		return "", "", nil
	}
	c.mu.RLock()
	tg, ok := c.targets[target]
	c.mu.RUnlock()
	if ok && tg.token.Name != "" {
		return c.tokenSecret(tg.token)
	}
	// The pool's Secret, whether the port is reached over TLS or not.
	ref := tg.transport.Secret
	if !ok || ref.Name == "" {
		return "", "", nil
	}
	if !c.isSynced() {
		return "", ref.String(), fmt.Errorf("the sidecar has not listed the Secrets of EPP credentials yet (Secret %s)", ref)
	}
	lister := c.listers[ref.Namespace]
	if lister == nil {
		return "", ref.String(), nil
	}
	s, err := lister.Get(ref.Name)
	if err != nil {
		return "", ref.String(), nil
	}
	return strings.TrimSpace(string(s.Data[SecretTokenKey])), ref.String(), nil
}

// tokenSecret reads the token of a metrics token Secret.
func (c *Credentials) tokenSecret(ref types.NamespacedName) (token, secret string, err error) {
	if !c.isSynced() {
		return "", ref.String(), fmt.Errorf("the sidecar has not listed the Secrets of EPP credentials yet (metrics token Secret %s)", ref)
	}
	lister := c.listers[ref.Namespace]
	if lister == nil {
		return "", ref.String(), fmt.Errorf("metrics token Secret %s: namespace %s is not one of the sidecar's --endpoint-picker-secret-namespaces, so the sidecar reads no Secret there", ref, ref.Namespace)
	}
	s, err := lister.Get(ref.Name)
	if err != nil {
		return "", ref.String(), fmt.Errorf("metrics token Secret %s labelled %s=true does not exist", ref, CredentialsLabel)
	}
	token = strings.TrimSpace(string(s.Data[SecretTokenKey]))
	if token == "" {
		return "", ref.String(), fmt.Errorf("metrics token Secret %s has no %s", ref, SecretTokenKey)
	}
	return token, ref.String(), nil
}
