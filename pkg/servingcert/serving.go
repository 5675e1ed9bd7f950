package servingcert

import (
	"bytes"
	"context"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Serving is the serving certificate of a running server, kept current
// from the Secret: a dynamiccertificates.CertKeyContentProvider that the
// generic API server runs (it is a ControllerRunner) and listens to. Every
// RefreshInterval it ensures the Secret again (Ensure): it renews the
// certificate once two thirds of its validity have passed, and picks up the
// one another replica renewed. A new certificate goes to new TLS
// handshakes; connections already open keep theirs.
type Serving struct {
	kube    kubernetes.Interface
	dyn     dynamic.Interface
	options Options

	mu        sync.RWMutex
	bundle    *Bundle
	listeners []dynamiccertificates.Listener
	// failing is the error of the last refresh that failed, "" after one
	// that succeeded: a failure is logged once per change.
	failing string
}

var (
	_ dynamiccertificates.CertKeyContentProvider = &Serving{}
	_ dynamiccertificates.ControllerRunner       = &Serving{}
)

// NewServing ensures the Secret and returns its certificate, to serve with.
func NewServing(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, o Options) (*Serving, error) {
	s := &Serving{kube: kube, dyn: dyn, options: o}
	if err := s.RunOnce(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Name implements dynamiccertificates.CertKeyContentProvider.
func (s *Serving) Name() string {
	return "serving-cert-secret::" + s.options.Namespace + "/" + s.options.SecretName
}

// CurrentCertKeyContent implements dynamiccertificates.CertKeyContentProvider.
func (s *Serving) CurrentCertKeyContent() ([]byte, []byte) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.bundle == nil {
		return nil, nil
	}
	return s.bundle.CertPEM, s.bundle.KeyPEM
}

// NotAfter is when the certificate served now ends.
func (s *Serving) NotAfter() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.bundle == nil {
		return time.Time{}
	}
	return s.bundle.NotAfter
}

// AddListener implements dynamiccertificates.Notifier.
func (s *Serving) AddListener(l dynamiccertificates.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, l)
}

// RunOnce ensures the Secret and serves its certificate from now on if it
// changed. A new certificate is served once the APIService was seen
// trusting it (at the next refresh, when this call wrote the caBundle), so
// that the aggregator does not meet it before its CA; the first one is
// served at once.
func (s *Serving) RunOnce(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	b, trusted, err := ensure(ctx, s.kube, s.dyn, s.options)
	s.mu.Lock()
	if err != nil {
		refreshFailures.Inc()
		if s.failing != err.Error() {
			s.failing = err.Error()
			logger.Error(err, "Cannot check or renew the serving certificate; serving the current one until it can", "secret", s.options.Namespace+"/"+s.options.SecretName, "notAfter", s.notAfterLocked())
		}
		s.mu.Unlock()
		return err
	}
	if s.failing != "" {
		logger.Info("The serving certificate can be checked again", "secret", s.options.Namespace+"/"+s.options.SecretName)
		s.failing = ""
	}
	changed := s.bundle == nil || !bytes.Equal(s.bundle.CertPEM, b.CertPEM) || !bytes.Equal(s.bundle.KeyPEM, b.KeyPEM)
	if !changed || (s.bundle != nil && !trusted) {
		s.mu.Unlock()
		return nil
	}
	s.bundle = b
	listeners := append([]dynamiccertificates.Listener(nil), s.listeners...)
	s.mu.Unlock()
	certificateExpiry.Set(float64(b.NotAfter.Unix()))
	logger.Info("Serving with the certificate of the Secret", "secret", s.options.Namespace+"/"+s.options.SecretName, "notAfter", b.NotAfter.UTC().Format(time.RFC3339), "renewedAfter", b.NotAfter.Add(-s.options.validity()/3).UTC().Format(time.RFC3339))
	for _, l := range listeners {
		l.Enqueue()
	}
	return nil
}

// Run implements dynamiccertificates.ControllerRunner: it refreshes the
// certificate every RefreshInterval until ctx ends.
func (s *Serving) Run(ctx context.Context, _ int) {
	t := time.NewTicker(s.options.refreshInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = s.RunOnce(ctx) // logged and counted
		}
	}
}

func (s *Serving) notAfterLocked() string {
	if s.bundle == nil {
		return ""
	}
	return s.bundle.NotAfter.UTC().Format(time.RFC3339)
}
