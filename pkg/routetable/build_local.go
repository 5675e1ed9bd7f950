package routetable

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/eppaddr"
)

// localPool resolves a local InferencePool and its EPP, once.
func (b *builder) localPool(key types.NamespacedName) localResult {
	ref := objectRef{key: key}
	b.use(ref)
	if lr, ok := b.locals[key]; ok {
		return lr
	}
	mark := len(b.errs)
	lr := b.resolveLocal(key)
	lr.errs = b.resolved(ref, mark)
	b.locals[key] = lr
	return lr
}

func (b *builder) resolveLocal(key types.NamespacedName) localResult {
	lr := localResult{pool: b.pools[key]}
	if lr.pool == nil {
		return lr
	}
	secret, secretErr := eppaddr.EndpointPickerSecret(lr.pool.Annotations)
	if secretErr != nil {
		// Never plaintext to an EPP that its pool says serves TLS.
		b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%v; the pool's local EPP is not routed to", secretErr)
	}
	modes, transportErr := eppaddr.EndpointPickerTransport(lr.pool.Annotations)
	if transportErr != nil {
		b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%v; the pool's local EPP is not routed to", transportErr)
		secretErr = transportErr
	}
	switch {
	case isShim(lr.pool, b.in.EndpointPickerServices):
		lr.shim = true
		if v, ok := lr.pool.Annotations[ClusterWeightsAnnotation]; ok {
			w, err := parseClusterWeights(v)
			if err != nil {
				b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%s: %v; clusters weigh 1 each", ClusterWeightsAnnotation, err)
			}
			lr.weights = w
		}
		v, ok := lr.pool.Annotations[LocalEndpointPickerAnnotation]
		if !ok {
			break
		}
		ref, err := parseEndpointPicker(v)
		if err == nil && secretErr == nil {
			lr.cluster, err = b.localCluster(lr.pool, ref, secret, modes)
		}
		if err != nil {
			b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidAnnotation, "%s: %v; the pool's local model servers are not routed to", LocalEndpointPickerAnnotation, err)
		}
	case secretErr == nil:
		c, err := b.localCluster(lr.pool, lr.pool.Spec.EndpointPickerRef, secret, modes)
		if err != nil {
			b.report(InferencePoolKind, key.Namespace, key.Name, ReasonInvalidEndpointPicker, "%v; the pool has no cluster to route to", err)
		}
		lr.cluster = c
	}
	return lr
}

// parseEndpointPicker parses LocalEndpointPickerAnnotation: "service" or
// "service:port".
func parseEndpointPicker(v string) (poolv1.EndpointPickerRef, error) {
	name, port, hasPort := strings.Cut(strings.TrimSpace(v), ":")
	ref := poolv1.EndpointPickerRef{Name: name}
	// A Service's name is a DNS-1035 label: checked here, so that a value
	// that could never name one is reported as such rather than as a
	// Service that does not exist.
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		return ref, fmt.Errorf("%q is not a Service name of the pool's namespace, with an optional :port: %s", v, strings.Join(errs, "; "))
	}
	if hasPort {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n < 1 {
			return ref, fmt.Errorf("port %q of %q is not a port number", port, v)
		}
		ref.Port = &poolv1.Port{Number: int32(n)}
	}
	return ref, nil
}

// localCluster locates a local pool's EPP through its Service, the way
// mci-apiserver locates an exported one: the Service's LoadBalancer ingress,
// else its cluster IP, else its ExternalName; the endpointPickerRef's port,
// else the Service port named for ext-proc; health and metrics ports by name,
// else the conventional 9003 and 9090 when the Service has them. secret,
// when set, names the Secret of the pool's namespace to reach all three
// with; modes are the pool's transport annotation.
func (b *builder) localCluster(p *poolv1.InferencePool, ref poolv1.EndpointPickerRef, secret string, modes eppaddr.TransportModes) (*Cluster, error) {
	svc, addr, ports, err := b.localEPPService(p, ref)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Name:   b.local,
		Pool:   p.Namespace + "/" + p.Name,
		Mode:   v1alpha1.RoutingModeEndpoint,
		EPP:    net.JoinHostPort(addr, strconv.Itoa(int(ports.ExtProc))),
		Weight: 1,
		Region: b.in.LocalRegion,
		Local:  true,
		// ServiceAddresses falls back to the ExternalName last.
		ExternalName: svc.Spec.Type == corev1.ServiceTypeExternalName || (svc.Spec.ExternalName != "" && addr == svc.Spec.ExternalName),
	}
	var secretRef types.NamespacedName
	if secret != "" {
		secretRef = types.NamespacedName{Namespace: p.Namespace, Name: secret}
	}
	def := b.in.DefaultTransport
	validation := b.localValidation(p.Namespace, svc)
	if c.EPPTransport, err = eppaddr.ResolvePortTransport(eppaddr.PortExtProc, modes.ExtProc, secretRef, validation(ports.ExtProc), p.Namespace, def.ExtProc); err != nil {
		return nil, err
	}
	if hp := ports.Health; hp != 0 {
		c.Health = net.JoinHostPort(addr, strconv.Itoa(int(hp)))
		if c.HealthTransport, err = eppaddr.ResolvePortTransport(eppaddr.PortHealth, modes.Health, secretRef, validation(hp), p.Namespace, def.Health); err != nil {
			return nil, err
		}
	}
	if mp := ports.Metrics; mp != 0 {
		if c.MetricsTransport, err = eppaddr.ResolvePortTransport(eppaddr.PortMetrics, modes.Metrics, secretRef, validation(mp), p.Namespace, def.Metrics); err != nil {
			return nil, err
		}
		c.Metrics = metricsURL(addr, mp, c.MetricsTransport.TLS)
		// A token that cannot be used fails the metrics port alone.
		token, err := eppaddr.EndpointPickerMetricsTokenSecret(p.Annotations)
		switch {
		case err != nil:
			b.report(InferencePoolKind, p.Namespace, p.Name, ReasonInvalidAnnotation, "%v; its EPP's metrics are not scraped", err)
			c.Metrics = ""
		case token != "":
			c.MetricsToken = types.NamespacedName{Namespace: p.Namespace, Name: token}
		}
	}
	return c, nil
}

// localEPPService is the Service a local pool's endpointPickerRef names,
// its first address and its ports, the ext-proc one known.
func (b *builder) localEPPService(p *poolv1.InferencePool, ref poolv1.EndpointPickerRef) (*corev1.Service, string, eppaddr.Ports, error) {
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != "" && ref.Kind != "Service") {
		return nil, "", eppaddr.Ports{}, fmt.Errorf("endpointPickerRef names a %s; only a core Service is supported", cmp.Or(ref.Kind, "Service"))
	}
	if ref.Name == "" {
		return nil, "", eppaddr.Ports{}, fmt.Errorf("endpointPickerRef has no name")
	}
	svc := b.svcs[types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}]
	if svc == nil {
		return nil, "", eppaddr.Ports{}, fmt.Errorf("Service %s/%s of the endpointPickerRef does not exist", p.Namespace, ref.Name)
	}
	addrs := eppaddr.ServiceAddresses(svc)
	if len(addrs) == 0 {
		return nil, "", eppaddr.Ports{}, fmt.Errorf("Service %s/%s of the endpointPickerRef has no address", p.Namespace, ref.Name)
	}
	refPort := int32(0)
	if ref.Port != nil {
		refPort = ref.Port.Number
	}
	// The rule mci-apiserver uses for the pool's import, so that the local
	// pool and its import reach the same port of the same Service.
	ports := eppaddr.ResolvePorts(svc, refPort)
	if ports.ExtProc == 0 {
		return nil, "", eppaddr.Ports{}, fmt.Errorf("the ext-proc port of Service %s/%s is unknown: set endpointPickerRef.port", p.Namespace, ref.Name)
	}
	return svc, addrs[0], ports, nil
}

// localValidation returns, for a port number of a local EPP Service, the
// validation of the local cluster's BackendTLSPolicy for that port (see
// eppaddr.TLSPolicyFor), nil without one.
func (b *builder) localValidation(namespace string, svc *corev1.Service) func(port int32) *v1alpha1.BackendTLSValidation {
	var policies []*gatewayv1.BackendTLSPolicy
	for k, p := range b.btls {
		if k.Namespace == namespace {
			policies = append(policies, p)
		}
	}
	return func(port int32) *v1alpha1.BackendTLSValidation {
		p := eppaddr.TLSPolicyFor(policies, svc, port)
		if p == nil {
			return nil
		}
		var out v1alpha1.BackendTLSValidation
		// The import's own conversion, so that local and imported
		// validations are alike.
		_ = v1alpha1.Convert_inference_BackendTLSValidation_To_v1alpha1_BackendTLSValidation(eppaddr.ValidationOf(p), &out, nil)
		return &out
	}
}

// metricsURL is where an EPP's metrics are scraped: over HTTPS when its
// transport is TLS.
func metricsURL(host string, port int32, tls bool) string {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, strconv.Itoa(int(port))) + "/metrics"
}

func failureMode(p *poolv1.InferencePool) poolv1.EndpointPickerFailureMode {
	if p.Spec.EndpointPickerRef.FailureMode == poolv1.FailOpen {
		return poolv1.FailOpen
	}
	return poolv1.FailClose
}
