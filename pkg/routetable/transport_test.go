package routetable

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/eppaddr"
)

func TestLocalPoolsFollowTheirBackendTLSPolicy(t *testing.T) {
	policy := &gatewayv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "epp-tls"},
		Spec: gatewayv1.BackendTLSPolicySpec{
			TargetRefs: []gatewayv1.LocalPolicyTargetReferenceWithSectionName{{
				LocalPolicyTargetReference: gatewayv1.LocalPolicyTargetReference{Kind: "Service", Name: "llm-epp"},
				SectionName:                ptr.To(gatewayv1.SectionName("grpc-ext-proc")),
			}},
			Validation: gatewayv1.BackendTLSPolicyValidation{
				CACertificateRefs: []gatewayv1.LocalObjectReference{{Kind: "ConfigMap", Name: "epp-ca"}},
				Hostname:          "epp.example.com",
			},
		},
	}
	want := &v1alpha1.BackendTLSValidation{PolicyName: "epp-tls", CACertificateRefs: []v1alpha1.CACertificateRef{{Kind: "ConfigMap", Name: "epp-ca"}}, Hostname: "epp.example.com"}
	in := Inputs{
		Routes:   []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, poolRef("llm", nil)))},
		Pools:    []*poolv1.InferencePool{pool("llm", "")},
		Services: []*corev1.Service{eppService("llm", "127.0.1.1")},
	}
	local := func(t *testing.T, tbl *Table) *Cluster {
		t.Helper()
		cs := only(t, tbl).Clusters
		require.Len(t, cs, 1)
		return cs[0]
	}

	t.Run("Build: the policy of the ext-proc port makes it TLS, verified; health and metrics stay plaintext", func(t *testing.T) {
		in := in
		in.BackendTLSPolicies = []*gatewayv1.BackendTLSPolicy{policy}
		tbl, errs := Build(in)
		require.Empty(t, errs)
		c := local(t, tbl)
		assert.Equal(t, eppaddr.PortTransport{TLS: true, Validation: want, Namespace: ns}, c.EPPTransport)
		assert.Equal(t, eppaddr.PortTransport{}, c.HealthTransport)
		assert.Equal(t, "http://127.0.1.1:9090/metrics", c.Metrics)
	})

	t.Run("Incremental: the policy arriving and leaving changes the local EPP's transport", func(t *testing.T) {
		x := NewIncremental(Inputs{})
		for _, r := range in.Routes {
			x.SetRoute(r)
		}
		x.SetPool(in.Pools[0])
		x.SetService(in.Services[0])
		tbl, _ := x.Table()
		assert.Equal(t, eppaddr.TransportKindPlaintext, local(t, tbl).EPPTransport.Kind())
		x.SetBackendTLSPolicy(policy)
		tbl, changed := x.Table()
		require.True(t, changed)
		assert.Equal(t, eppaddr.TransportKindVerified, local(t, tbl).EPPTransport.Kind())
		x.DeleteBackendTLSPolicy(types.NamespacedName{Namespace: ns, Name: "epp-tls"})
		tbl, changed = x.Table()
		require.True(t, changed)
		assert.Equal(t, eppaddr.TransportKindPlaintext, local(t, tbl).EPPTransport.Kind())
	})

	t.Run("a local pool that asks Plaintext for a port its policy makes TLS is reported and not routed to", func(t *testing.T) {
		in := in
		in.Pools = []*poolv1.InferencePool{annotate(pool("llm", ""), v1alpha1.EndpointPickerTransportAnnotation, "Plaintext")}
		in.BackendTLSPolicies = []*gatewayv1.BackendTLSPolicy{policy}
		tbl, errs := Build(in)
		require.Len(t, errs, 1)
		assert.Contains(t, errs[0].Error(), "BackendTLSPolicy epp-tls targets the EPP's ext-proc port")
		assert.Empty(t, only(t, tbl).Clusters)
	})
}
