package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/test/promtext"
)

// The README's recipe for upstream EPPs at their default flags (docs/tls.md,
// "Pointing mci at upstream EPPs"), followed as a user would, for both:
// cluster-a's EPP behaves as the Gateway API Inference Extension's cmd/epp
// does by default, cluster-c's as the llm-d router's EPP (built on the same
// runner, pool gauges under the llm_d_epp names). Both serve ext_proc over
// TLS with a self-signed certificate made at start (--secure-serving), gRPC
// health in plaintext, and /metrics in plaintext to bearer tokens that
// their own cluster reviews and authorizes (--metrics-endpoint-auth):
// mci-epp reproduces these defaults with those flags. The recipe, per
// exported pool: `endpoint-picker-transport: ext-proc=TLS`, and
// `endpoint-picker-metrics-token-secret` naming a Secret that each importing
// cluster holds with a token of the EPP's cluster allowed to read /metrics.
// Loopback blocks 127.0.196-198.x.
func TestTheREADMERecipeRoutesToUpstreamEPPsAtTheirDefaultFlags(t *testing.T) {
	const (
		ns     = "e2e-upstream-recipe"
		pool   = "llm"
		reader = "mci-e2e-recipe-metrics-reader"
	)
	ctx := t.Context()
	s := newSidecarSetupWith(t, ns, sidecarOptions{
		blockA: 196, blockC: 198, sidecarIP: "127.0.197.1",
		routeAnnotations: map[string]string{
			routetable.PolicyAnnotation:      routingpolicy.MetricsBased,
			routetable.FailureModeAnnotation: "FailClose",
		},
		probeInterval: 200 * time.Millisecond,
		eppArgs: map[string][]string{
			"cluster-a": {"--secure-serving", "--metrics-endpoint-auth"},
			"cluster-c": {"--secure-serving", "--metrics-endpoint-auth", "--pool-metrics-names=llm_d_epp"},
		},
		secretNamespaces: []string{ns},
	})
	full := ns + "/" + pool
	simA, simC := s.instances["cluster-a"], s.instances["cluster-c"]
	tokenSecret := func(cluster string) string { return "epp-metrics-token-" + cluster }

	// The ClusterRole of the README's example, as it is.
	role := exampleMetricsReader(t, reader)

	for _, cluster := range []string{"cluster-a", "cluster-c"} {
		// In the EPP's cluster: an identity allowed to read /metrics, and
		// a token of it.
		x := clusterClients(t, cluster)
		_, err := x.kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
		_, err = x.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "epp-metrics-scraper"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		// A non-resource URL is granted cluster-wide only.
		_, err = x.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: reader},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "epp-metrics-scraper"}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = x.kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), reader, metav1.DeleteOptions{})
			_ = x.kube.RbacV1().ClusterRoles().Delete(context.Background(), reader, metav1.DeleteOptions{})
		})
		tr, err := x.kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "epp-metrics-scraper", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))},
		}, metav1.CreateOptions{})
		require.NoError(t, err)

		// In the importing cluster: the token in a labelled Secret of the
		// pool's namespace.
		_, err = s.b.kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: tokenSecret(cluster), Namespace: ns, Labels: map[string]string{epptransport.CredentialsLabel: "true"}},
			Data:       map[string][]byte{epptransport.SecretTokenKey: []byte(tr.Status.Token)},
		}, metav1.CreateOptions{})
		require.NoError(t, err)

		// On the exported pool: the two annotations of the recipe.
		x.editPool(t, ctx, ns, pool, func(p *poolv1.InferencePool) {
			p.Annotations[v1alpha1.EndpointPickerTransportAnnotation] = "ext-proc=TLS"
			p.Annotations[v1alpha1.EndpointPickerMetricsTokenSecretAnnotation] = tokenSecret(cluster)
		})
	}

	waitStates := func(what string, want map[string]string) {
		t.Helper()
		waitMetricsStates(t, s.sidecar, full, what, want)
	}
	sidecarMetrics := func(t *testing.T) promtext.Metrics {
		t.Helper()
		m, err := promtext.Get(t.Context(), "http://"+s.sidecar.MetricsAddr()+"/metrics")
		require.NoError(t, err)
		return m
	}
	failures := func(t *testing.T, cluster, port string) float64 {
		t.Helper()
		v, _, err := sidecarMetrics(t).Lookup(fmt.Sprintf(`mci_sidecar_epp_connection_failures_total{cluster=%q,port=%q,transport="plaintext"}`, cluster, port))
		require.NoError(t, err)
		return v
	}
	only := func(instance string) func(int, string) bool {
		return func(code int, got string) bool { return code == http.StatusOK && got == instance }
	}

	t.Run("both EPPs are routed to over TLS without verification, and measured with their tokens", func(t *testing.T) {
		waitStates("the tokens are sent and authorized", map[string]string{"cluster-a": "fresh", "cluster-c": "fresh"})
		// MetricsBased decides by the gauges read with the tokens: the
		// cluster with capacity takes the requests, whichever it is.
		s.servers["cluster-a"].pin(t, 0, 0.1)
		s.servers["cluster-c"].pin(t, 30, 0.9)
		s.settle(t, 30*time.Second, 20, "cluster-c saturated: requests go to cluster-a", only(simA))
		s.servers["cluster-a"].pin(t, 30, 0.9)
		s.servers["cluster-c"].pin(t, 0, 0.1)
		s.settle(t, 30*time.Second, 20, "cluster-a saturated: requests go to cluster-c", only(simC))
		m := sidecarMetrics(t)
		for _, cluster := range []string{"cluster-a", "cluster-c"} {
			assert.Equal(t, 1.0, m.Value(t, fmt.Sprintf(`mci_sidecar_epp_transport{cluster=%q,pool=%q,port="ext-proc",transport="tls-unverified"}`, cluster, full)))
			assert.Equal(t, 1.0, m.Value(t, fmt.Sprintf(`mci_sidecar_epp_transport{cluster=%q,pool=%q,port="metrics",transport="plaintext"}`, cluster, full)), "the token changes no transport")
		}
	})

	t.Run("a token Secret that cannot be used fails the metrics port alone, counted; the cluster is still routed to", func(t *testing.T) {
		before := failures(t, "cluster-a", "metrics")
		require.NoError(t, s.b.kube.CoreV1().Secrets(ns).Delete(ctx, tokenSecret("cluster-a"), metav1.DeleteOptions{}))
		waitStates("cluster-a's token Secret is gone", map[string]string{"cluster-a": "unreachable", "cluster-c": "fresh"})
		assert.Greater(t, failures(t, "cluster-a", "metrics"), before, "counted with the connection failures")
		// Unmeasured comes before saturated: cluster-a's ext_proc still
		// serves.
		s.servers["cluster-c"].pin(t, 30, 0.9)
		s.settle(t, 30*time.Second, 20, "cluster-a unmeasured, cluster-c saturated: requests go to cluster-a", only(simA))
	})
}
