package routetable

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/eppaddr"
)

func TestBuildNamesTheSecretsOfEachAddress(t *testing.T) {
	withSecrets := func(imp *v1alphaImport, refs ...*corev1.SecretReference) *v1alphaImport {
		for i := range imp.Status.Clusters {
			epp := &imp.Status.Clusters[i].EndpointPicker
			epp.SecretRef, epp.Health.SecretRef, epp.Metrics.SecretRef = refs[i], refs[i], refs[i]
		}
		return imp
	}
	creds := types.NamespacedName{Namespace: ns, Name: "epp-creds"}
	secretTLS := eppaddr.PortTransport{TLS: true, Secret: creds, Namespace: ns}
	routes := []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))}

	t.Run("an import's secretRefs name the Secrets of the EPP, health and metrics addresses; metrics go over HTTPS", func(t *testing.T) {
		imp := withSecrets(importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}, imported{name: "cluster-c", addr: "127.0.3.1"}),
			&corev1.SecretReference{Namespace: ns, Name: "epp-creds"}, &corev1.SecretReference{Name: "epp-creds"})
		tbl, errs := Build(Inputs{Routes: routes, Imports: []*v1alphaImport{imp}})
		require.Empty(t, errs)
		b := only(t, tbl)
		require.Len(t, b.Clusters, 2)
		assert.Equal(t, Cluster{Name: "cluster-a", Pool: "example/llm", Mode: v1alpha1.RoutingModeEndpoint, EPP: "127.0.2.1:9002",
			Health: "127.0.2.1:9003", Metrics: "https://127.0.2.1:9090/metrics", Weight: 1, Published: publishedLoopback,
			EPPTransport: secretTLS, HealthTransport: secretTLS, MetricsTransport: secretTLS}, *b.Clusters[0])
		assert.Equal(t, creds, b.Clusters[1].EPPTransport.Secret, "a secretRef without a namespace is in the import's")
	})

	t.Run("a secretRef to another namespace skips the cluster rather than reach it in plaintext", func(t *testing.T) {
		imp := withSecrets(importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}, imported{name: "cluster-c", addr: "127.0.3.1"}),
			&corev1.SecretReference{Namespace: "kube-system", Name: "epp-creds"}, nil)
		tbl, errs := Build(Inputs{Routes: routes, Imports: []*v1alphaImport{imp}})
		assert.Equal(t, []string{ReasonInvalidImportedCluster}, reasons(errs))
		require.Len(t, errs, 1)
		assert.Contains(t, errs[0].Error(), "kube-system/epp-creds")
		b := only(t, tbl)
		require.Len(t, b.Clusters, 1)
		assert.Equal(t, "cluster-c", b.Clusters[0].Name)
		assert.Equal(t, eppaddr.PortTransport{}, b.Clusters[0].EPPTransport)
	})

	localRoutes := []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, poolRef("llm", nil)))}
	annotated := func(value string) *poolv1.InferencePool {
		return annotate(pool("llm", ""), v1alpha1.EndpointPickerSecretAnnotation, value)
	}
	t.Run("a local pool's annotation names the Secret its EPP is reached with", func(t *testing.T) {
		tbl, errs := Build(Inputs{Routes: localRoutes, Pools: []*poolv1.InferencePool{annotated("epp-creds")}, Services: []*corev1.Service{eppService("llm", "127.0.1.1")}})
		require.Empty(t, errs)
		c := only(t, tbl).Clusters[0]
		assert.Equal(t, [3]eppaddr.PortTransport{secretTLS, secretTLS, secretTLS}, [3]eppaddr.PortTransport{c.EPPTransport, c.HealthTransport, c.MetricsTransport})
		assert.Equal(t, "https://127.0.1.1:9090/metrics", c.Metrics)
	})

	t.Run("a local pool whose annotation is not a Secret name is reported and not routed to", func(t *testing.T) {
		tbl, errs := Build(Inputs{Routes: localRoutes, Pools: []*poolv1.InferencePool{annotated("no/such name")}, Services: []*corev1.Service{eppService("llm", "127.0.1.1")}})
		assert.Equal(t, []string{ReasonInvalidAnnotation}, reasons(errs))
		require.Len(t, errs, 1)
		assert.Contains(t, errs[0].Error(), `"no/such name"`)
		assert.Empty(t, only(t, tbl).Clusters)
	})
}

// A metrics token Secret configures the token of the metrics port and
// nothing else; one that cannot be used fails that port alone.
func TestBuildNamesTheMetricsTokenSecret(t *testing.T) {
	token := types.NamespacedName{Namespace: ns, Name: "epp-metrics-token"}
	routes := []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))}
	withToken := func(ref *corev1.SecretReference) *v1alphaImport {
		imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"})
		imp.Status.Clusters[0].EndpointPicker.Metrics.TokenSecretRef = ref
		return imp
	}

	t.Run("an import's tokenSecretRef names the metrics token; every port stays plaintext", func(t *testing.T) {
		tbl, errs := Build(Inputs{Routes: routes, Imports: []*v1alphaImport{withToken(&corev1.SecretReference{Name: token.Name})}})
		require.Empty(t, errs)
		c := only(t, tbl).Clusters[0]
		assert.Equal(t, token, c.MetricsToken)
		assert.Equal(t, "http://127.0.2.1:9090/metrics", c.Metrics)
		assert.Equal(t, [3]eppaddr.PortTransport{}, [3]eppaddr.PortTransport{c.EPPTransport, c.HealthTransport, c.MetricsTransport})
	})

	t.Run("a tokenSecretRef to another namespace fails the metrics port alone", func(t *testing.T) {
		tbl, errs := Build(Inputs{Routes: routes, Imports: []*v1alphaImport{withToken(&corev1.SecretReference{Namespace: "kube-system", Name: token.Name})}})
		assert.Equal(t, []string{ReasonInvalidImportedCluster}, reasons(errs))
		assert.Contains(t, errs[0].Error(), "kube-system/epp-metrics-token")
		c := only(t, tbl).Clusters[0]
		assert.Equal(t, "127.0.2.1:9002", c.EPP, "still routed to")
		assert.Empty(t, c.Metrics, "unmeasured rather than scraped with another token")
	})

	localRoutes := []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, poolRef("llm", nil)))}
	annotated := func(value string) *poolv1.InferencePool {
		return annotate(pool("llm", ""), v1alpha1.EndpointPickerMetricsTokenSecretAnnotation, value)
	}
	t.Run("a local pool's annotation names the metrics token", func(t *testing.T) {
		tbl, errs := Build(Inputs{Routes: localRoutes, Pools: []*poolv1.InferencePool{annotated(token.Name)}, Services: []*corev1.Service{eppService("llm", "127.0.1.1")}})
		require.Empty(t, errs)
		c := only(t, tbl).Clusters[0]
		assert.Equal(t, token, c.MetricsToken)
		assert.Equal(t, "http://127.0.1.1:9090/metrics", c.Metrics)
		assert.False(t, c.EPPTransport.TLS || c.MetricsTransport.TLS)
	})

	t.Run("a local pool whose annotation is not a Secret name is routed to, unmeasured", func(t *testing.T) {
		tbl, errs := Build(Inputs{Routes: localRoutes, Pools: []*poolv1.InferencePool{annotated("no/such name")}, Services: []*corev1.Service{eppService("llm", "127.0.1.1")}})
		assert.Equal(t, []string{ReasonInvalidAnnotation}, reasons(errs))
		c := only(t, tbl).Clusters[0]
		assert.Equal(t, "127.0.1.1:9002", c.EPP)
		assert.Empty(t, c.Metrics)
	})
}
