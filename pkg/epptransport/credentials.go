package epptransport

import (
	"crypto/tls"
	"fmt"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/statelog"
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
	conflicts string

	// failures holds the last connection error of each address that
	// failed since it last answered.
	failures statelog.Log[string]

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
		failures:   statelog.Log[string]{Rule: failureLog},
	}
}

// RegisterMetrics registers mci_sidecar_epp_transport and
// mci_sidecar_epp_connection_failures_total in reg.
func (c *Credentials) RegisterMetrics(reg prometheus.Registerer) {
	c.transportGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mci_sidecar_epp_transport",
		Help: "1 for the transport each port of each cluster's EPP is reached with, by cluster and pool (namespace/name; one of them when pools share an EPP address): plaintext, tls-unverified (TLS asked with no Secret or BackendTLSPolicy to verify with), tls-verified (a BackendTLSPolicy), tls-secret (the pool's credentials Secret).",
	}, []string{"cluster", "pool", "port", "transport"})
	c.failureCounter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mci_sidecar_epp_connection_failures_total",
		Help: "Failed connections to a port of a cluster's EPP (refused or reset, TLS handshake or credentials failure, a transport the EPP does not serve, no answer in time: a blackholed or stalled link), by the transport asked for. The cluster fails over; nothing is retried with a weaker transport.",
	}, []string{"cluster", "port", "transport"})
	reg.MustRegister(c.transportGauge, c.failureCounter)
}

// Synced is closed once the Secrets are listed.
func (c *Credentials) Synced() <-chan struct{} { return c.synced }

func (c *Credentials) isSynced() bool {
	select {
	case <-c.synced:
		return true
	default:
		return false
	}
}

// unverifiedTLS is TLS whose serving certificate is not verified.
var unverifiedTLS = func() *EndpointTLS {
	config := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // asked for: see eppaddr.PortTransport
	return &EndpointTLS{Version: eppaddr.TransportKindUnverified, Config: config, GRPC: credentials.NewTLS(config)}
}()

// ForTarget returns how addr (an address of the table) is reached.
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
	case eppaddr.TransportKindSecret:
		t, err := c.resolve(tg.transport.Secret)
		if err != nil {
			return nil, fmt.Errorf("TLS credentials for %s: %w", addr, err)
		}
		return t, nil
	case eppaddr.TransportKindVerified:
		t, err := c.resolveValidation(tg.transport.Namespace, tg.transport.Validation, tg.key)
		if err != nil {
			return nil, fmt.Errorf("TLS validation for %s: %w", addr, err)
		}
		return t, nil
	}
	return unverifiedTLS, nil
}
