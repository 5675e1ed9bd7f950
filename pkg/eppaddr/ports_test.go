package eppaddr

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
)

func TestServiceAddresses(t *testing.T) {
	clusterIP := corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}}
	loadBalancer := clusterIP
	loadBalancer.Type = corev1.ServiceTypeLoadBalancer
	tests := []struct {
		name    string
		spec    corev1.ServiceSpec
		ingress []corev1.LoadBalancerIngress
		want    []string
	}{
		{name: "a ClusterIP Service is reached at its cluster IP", spec: clusterIP, want: []string{"10.96.0.10"}},
		{
			name: "a dual-stack Service is reached at each of its cluster IPs",
			spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00::10"}},
			want: []string{"10.96.0.10", "fd00::10"},
		},
		{name: "a Service with only the singular cluster IP set is reached at it", spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}, want: []string{"10.96.0.10"}},
		{
			name:    "LoadBalancer ingress IPs and hostnames win over cluster IPs, each once",
			spec:    loadBalancer,
			ingress: []corev1.LoadBalancerIngress{{IP: "203.0.113.7", Hostname: "epp.example.com"}, {IP: "203.0.113.7"}},
			want:    []string{"203.0.113.7", "epp.example.com"},
		},
		{name: "a LoadBalancer Service without ingress yet is reached at its cluster IP", spec: loadBalancer, want: []string{"10.96.0.10"}},
		{
			name: "an ExternalName Service is reached at its external name",
			spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "epp.other.example.com"},
			want: []string{"epp.other.example.com"},
		},
		{name: "a headless Service has no address", spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, ClusterIPs: []string{corev1.ClusterIPNone}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &corev1.Service{Spec: tt.spec}
			svc.Status.LoadBalancer.Ingress = tt.ingress
			assert.Equal(t, tt.want, ServiceAddresses(svc))
		})
	}
}
