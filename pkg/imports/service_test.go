package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
)

func TestServiceAddresses(t *testing.T) {
	tests := []struct {
		name string
		svc  *corev1.Service
		want []string
	}{
		{
			name: "a ClusterIP Service is reached at its cluster IP",
			svc:  service("ns", "epp"),
			want: []string{"10.96.0.10"},
		},
		{
			name: "a dual-stack Service is reached at each of its cluster IPs",
			svc:  service("ns", "epp", clusterIPs("10.96.0.10", "fd00::10")),
			want: []string{"10.96.0.10", "fd00::10"},
		},
		{
			name: "a Service with only the singular cluster IP set is reached at it",
			svc:  service("ns", "epp", func(s *corev1.Service) { s.Spec.ClusterIPs = nil }),
			want: []string{"10.96.0.10"},
		},
		{
			name: "LoadBalancer ingress IPs and hostnames win over cluster IPs, each once",
			svc: service("ns", "epp", ingress(
				corev1.LoadBalancerIngress{IP: "203.0.113.7", Hostname: "epp.example.com"},
				corev1.LoadBalancerIngress{IP: "203.0.113.7"},
			)),
			want: []string{"203.0.113.7", "epp.example.com"},
		},
		{
			name: "a LoadBalancer Service without ingress yet is reached at its cluster IP",
			svc:  service("ns", "epp", ingress()),
			want: []string{"10.96.0.10"},
		},
		{
			name: "an ExternalName Service is reached at its external name",
			svc:  service("ns", "epp", externalName("epp.other.example.com")),
			want: []string{"epp.other.example.com"},
		},
		{
			name: "a headless Service has no address",
			svc:  service("ns", "epp", clusterIPs(corev1.ClusterIPNone)),
			want: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, ServiceAddresses(tt.svc))
		})
	}
}
