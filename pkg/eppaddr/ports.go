// Package eppaddr holds the rules of where each port of an EPP is and how
// it is reached: which ports of its Service are its ext_proc, gRPC health
// and metrics ports (ResolvePorts), at which addresses the Service is
// reached (ServiceAddresses), and the transport of each port
// (PortTransport, ResolvePortTransport) from what its pool says (the
// endpoint-picker-transport and endpoint-picker-secret annotations,
// ParseTransport), the BackendTLSPolicy that targets it (TLSPolicyForPort)
// and the sidecar's default.
//
// It is pure: callers pass the objects their caches hold. mci-apiserver
// (pkg/imports) uses it to compute what an import says of its EPP, and
// mci-sidecar (pkg/routetable, pkg/epptransport) to reach an imported EPP
// or its cluster's local one, so that both read the rules alike.
package eppaddr

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The ports of an EPP, as a transport setting names them.
const (
	PortExtProc = "ext-proc"
	PortHealth  = "health"
	PortMetrics = "metrics"
)

// Conventional port numbers of an EPP, used when no Service port is named
// for its job.
const (
	conventionalHealthPort  = 9003
	conventionalMetricsPort = 9090
)

// ServiceAddresses are where a client outside the Service's own namespace
// reaches it, without duplicates: its LoadBalancer ingress IPs and
// hostnames, else its cluster IPs ("None", the headless marker, is no
// address), else its ExternalName. A headless Service without any of these
// has no address (nil).
func ServiceAddresses(svc *corev1.Service) []string {
	var out []string
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP != "" {
			out = appendUnique(out, ing.IP)
		}
		if ing.Hostname != "" {
			out = appendUnique(out, ing.Hostname)
		}
	}
	if len(out) > 0 {
		return out
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if ip != "" && ip != corev1.ClusterIPNone {
			out = appendUnique(out, ip)
		}
	}
	if len(out) > 0 {
		return out
	}
	if svc.Spec.ExternalName != "" {
		return []string{svc.Spec.ExternalName}
	}
	return nil
}

func appendUnique[T comparable](list []T, v T) []T {
	if slices.Contains(list, v) {
		return list
	}
	return append(list, v)
}

// isHealthPortName: "health", "grpc-health", "health-grpc" or "*-health".
func isHealthPortName(name string) bool {
	return name == "health" || name == "grpc-health" || name == "health-grpc" || strings.HasSuffix(name, "-health")
}

// isMetricsPortName: "metrics", "http-metrics" or "*-metrics".
func isMetricsPortName(name string) bool {
	return name == "metrics" || name == "http-metrics" || strings.HasSuffix(name, "-metrics")
}

// isExtProcPortName: "ext-proc", "extproc", "grpc", "grpc-ext-proc" or
// "*-ext-proc".
func isExtProcPortName(name string) bool {
	return name == "ext-proc" || name == "extproc" || name == "grpc" || name == "grpc-ext-proc" || strings.HasSuffix(name, "-ext-proc")
}

// findPort returns the number of the first Service port whose name matches,
// else of the first one numbered fallback, else 0.
func findPort(ports []corev1.ServicePort, nameMatches func(string) bool, fallback int32) int32 {
	for _, p := range ports {
		if nameMatches(p.Name) {
			return p.Port
		}
	}
	for _, p := range ports {
		if p.Port == fallback {
			return p.Port
		}
	}
	return 0
}

// Ports are the ports of an EPP Service, as importing gateways and the
// sidecar (for a local pool) use them; 0 is unknown.
type Ports struct {
	ExtProc, Health, Metrics int32
}

// ResolvePorts finds the EPP's ports on its Service: the one rule for an
// exported pool's import and for the sidecar's local pool, so that both
// reach the same port of the same Service. The ext-proc port is the
// endpointPickerRef's port (refPort) when it has one. Otherwise it is the
// Service port named for ext-proc (see isExtProcPortName), else the only
// port that is neither the health nor the metrics port, else 0 (unknown):
// a port number alone (such as upstream's 9002) names nothing. The health
// and metrics ports are the ports named for them, else the one numbered
// 9003 (health) or 9090 (metrics), else 0.
func ResolvePorts(svc *corev1.Service, refPort int32) Ports {
	p := Ports{
		ExtProc: refPort,
		Health:  findPort(svc.Spec.Ports, isHealthPortName, conventionalHealthPort),
		Metrics: findPort(svc.Spec.Ports, isMetricsPortName, conventionalMetricsPort),
	}
	if p.ExtProc != 0 {
		return p
	}
	for _, sp := range svc.Spec.Ports {
		if isExtProcPortName(sp.Name) {
			p.ExtProc = sp.Port
			return p
		}
	}
	var rest []int32
	for _, sp := range svc.Spec.Ports {
		if sp.Port != p.Health && sp.Port != p.Metrics {
			rest = appendUnique(rest, sp.Port)
		}
	}
	if len(rest) == 1 {
		p.ExtProc = rest[0]
	}
	return p
}

// PortName is the name of svc's port number, "" when unnamed or absent:
// what a BackendTLSPolicy's sectionName names.
func PortName(svc *corev1.Service, number int32) string {
	for _, p := range svc.Spec.Ports {
		if p.Port == number {
			return p.Name
		}
	}
	return ""
}
