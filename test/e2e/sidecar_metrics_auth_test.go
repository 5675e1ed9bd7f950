package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/waitfor"
)

// This test runs mci-sidecar on the local ClusterSet like sidecar_test.go,
// with the loopback blocks 127.0.176-178.x, against EPPs that serve their
// metrics as the upstream ones do: cluster-a's mci-epp requires a bearer
// token on /metrics (--metrics-endpoint-auth: TokenReview and
// SubjectAccessReview against cluster-a's kube-apiserver, as the GIE and
// llm-d EPPs do by default), cluster-c's serves its pool gauges under the
// llm-d router's names.

// capturedLogs keeps the lines of a logger, for counting.
type capturedLogs struct {
	mu    sync.Mutex
	lines []string
}

func (c *capturedLogs) logger() klog.Logger {
	return funcr.New(func(prefix, args string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lines = append(c.lines, args)
	}, funcr.Options{})
}

// count counts the lines that contain every one of parts.
func (c *capturedLogs) count(parts ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			n++
		}
	}
	return n
}

// metricsStates returns the state of each cluster's pool metrics that the
// sidecar's mci_sidecar_epp_metrics_state reports (the label whose value
// is 1), by cluster.
func metricsStates(ctx context.Context, sc *sidecar.Sidecar, pool string) (map[string]string, error) {
	m, err := promtext.Get(ctx, "http://"+sc.MetricsAddr()+"/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range m.Samples("mci_sidecar_epp_metrics_state") {
		if s.Labels["pool"] == pool && s.Value == 1 {
			out[s.Labels["cluster"]] = s.Labels["state"]
		}
	}
	return out, nil
}

func TestSidecarReadsEPPMetricsBehindAuthenticationAndRoutesAroundUnknownLoad(t *testing.T) {
	const (
		ns     = "e2e-metrics-auth"
		pool   = "llm"
		reader = "mci-e2e-epp-metrics-reader"
	)
	ctx := t.Context()

	// The sidecar's identity in cluster-a: a ServiceAccount. Its token is
	// first the sidecar's own token file, which never goes to another
	// cluster's EPP in plaintext, then the pool's metrics token Secret,
	// meant for that EPP.
	a := clusterClients(t, "cluster-a")
	a.createNamespace(t, ctx, ns)
	_, err := a.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "mci-sidecar"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	tr, err := a.kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "mci-sidecar", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600))

	logs := &capturedLogs{}
	logger := logs.logger()
	s := newSidecarSetupWith(t, ns, sidecarOptions{
		blockA: 176, blockC: 178, sidecarIP: "127.0.177.1",
		routeAnnotations: map[string]string{
			routetable.PolicyAnnotation:      routingpolicy.MetricsBased,
			routetable.FailureModeAnnotation: "FailClose",
		},
		probeInterval: 200 * time.Millisecond,
		eppArgs: map[string][]string{
			"cluster-a": {"--metrics-endpoint-auth"},
			"cluster-c": {"--pool-metrics-names=llm_d_epp"},
		},
		metricsTokenFile: tokenFile,
		secretNamespaces: []string{ns},
		logger:           &logger,
	})
	t.Cleanup(func() {
		if t.Failed() {
			logs.mu.Lock()
			defer logs.mu.Unlock()
			for _, l := range logs.lines {
				if strings.Contains(l, "metrics") {
					t.Logf("sidecar: %s", l)
				}
			}
		}
	})
	simA, simC := s.instances["cluster-a"], s.instances["cluster-c"]
	urlA := `"url"="http://` + net.JoinHostPort(s.epps["cluster-a"].ip, strconv.Itoa(eppMetricsPort)) + `/metrics"`
	full := ns + "/" + pool
	waitStates := func(what string, want map[string]string) {
		t.Helper()
		waitMetricsStates(t, s.sidecar, full, what, want)
	}

	t.Run("the sidecar's own token does not go to another cluster's EPP in plaintext", func(t *testing.T) {
		// The EPP sees no token at all (401), not one it may not use (403).
		waitStates("no token is sent", map[string]string{"cluster-a": "unauthorized", "cluster-c": "fresh"})
		waitfor.Eventually(t, ctx, 10*time.Second, func(ctx context.Context) (bool, string) {
			n := logs.count(urlA, `"state"="unauthorized"`, "401 Unauthorized")
			return n == 1, fmt.Sprintf("%d log lines of a 401", n)
		})
		assert.Equal(t, 1, logs.count(urlA, "own metrics token is not sent", `"reason"="plaintext"`), "said once")
		m, err := promtext.Get(ctx, "http://"+s.sidecar.MetricsAddr()+"/metrics")
		require.NoError(t, err)
		withheld := map[string]string{}
		for _, sample := range m.Samples("mci_sidecar_epp_metrics_token_withheld") {
			if sample.Labels["pool"] == full && sample.Value == 1 {
				withheld[sample.Labels["cluster"]] = sample.Labels["reason"]
			}
		}
		assert.Equal(t, map[string]string{"cluster-a": "plaintext", "cluster-c": "plaintext"}, withheld)
	})

	// The token meant for cluster-a's EPP: in a labelled Secret of
	// cluster-b, which cluster-a's exported pool names.
	_, err = s.b.kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "epp-metrics-token", Namespace: ns, Labels: map[string]string{epptransport.CredentialsLabel: "true"}},
		Data:       map[string][]byte{epptransport.SecretTokenKey: []byte(tr.Status.Token)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	a.editPool(t, ctx, ns, pool, func(p *poolv1.InferencePool) {
		p.Annotations[v1alpha1.EndpointPickerMetricsTokenSecretAnnotation] = "epp-metrics-token"
	})
	// Sent once the import names it: authenticated, not yet authorized.
	waitfor.Eventually(t, ctx, 30*time.Second, func(context.Context) (bool, string) {
		n := logs.count(urlA, `"state"="unauthorized"`, "403 Forbidden")
		return n == 1, fmt.Sprintf("%d log lines of a 403", n)
	})

	t.Run("without RBAC in the EPP's cluster the cluster is unauthorized, logged once, and unmeasured", func(t *testing.T) {
		s.servers["cluster-a"].pin(t, 0, 0.1)
		s.servers["cluster-c"].pin(t, 0, 0.1)
		// cluster-c's gauges are read under the llm-d names.
		waitStates("the token is authenticated but not authorized (403)", map[string]string{"cluster-a": "unauthorized", "cluster-c": "fresh"})

		// Unknown load is not zero load: a measured cluster with
		// capacity takes every request...
		s.settle(t, 30*time.Second, 30, "cluster-a unmeasured, cluster-c measured with capacity: requests go to cluster-c", func(code int, instance string) bool {
			return code == http.StatusOK && instance == simC
		})
		// ...nor is it saturation: the unmeasured cluster comes before a
		// saturated one.
		s.servers["cluster-c"].pin(t, 10, 0.9)
		s.settle(t, 30*time.Second, 30, "cluster-a unmeasured, cluster-c measured and saturated: requests go to cluster-a", func(code int, instance string) bool {
			return code == http.StatusOK && instance == simA
		})

		// Scraped every 200ms for seconds now: one line for the change.
		assert.Equal(t, 1, logs.count(urlA, `"state"="unauthorized"`, "403 Forbidden"), "one log line per change of state")
		assert.Zero(t, logs.count(urlA, `"state"="fresh"`))
	})

	t.Run("with the ClusterRole of the README bound to the sidecar's identity, its metrics are read and used", func(t *testing.T) {
		// The ClusterRole of artifacts/deploy/mci-sidecar/examples/
		// epp-metrics-reader.yaml as it is, bound to the test's
		// ServiceAccount (the manifest binds mci-system's).
		role := exampleMetricsReader(t, reader)
		_, err := a.kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
		t.Cleanup(func() {
			_ = a.kube.RbacV1().ClusterRoles().Delete(context.Background(), reader, metav1.DeleteOptions{})
		})
		_, err = a.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: reader},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "mci-sidecar"}},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			require.NoError(t, a.kube.RbacV1().ClusterRoleBindings().Delete(ctx, reader, metav1.DeleteOptions{}))
			t.Fatalf("a ClusterRoleBinding %s was left over; deleted, run again", reader)
		}
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = a.kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), reader, metav1.DeleteOptions{})
		})

		// The EPP caches a denial for metricsauth.CacheTTL (10s).
		waitStates("the token is authorized", map[string]string{"cluster-a": "fresh", "cluster-c": "fresh"})
		// Seconds of refused scrapes every 200ms until then, one line.
		assert.Equal(t, 1, logs.count(urlA, `"state"="unauthorized"`, "403 Forbidden"), "one log line per change of state")
		assert.Equal(t, 1, logs.count(urlA, `"state"="fresh"`), "one log line per change of state")

		// Both measured and saturated, cluster-a worse: the metrics read
		// behind authentication decide (unmeasured, cluster-a would come
		// first).
		s.servers["cluster-a"].pin(t, 30, 0.9)
		s.settle(t, 30*time.Second, 30, "both measured and saturated, cluster-a's queue longer: requests go to cluster-c", func(code int, instance string) bool {
			return code == http.StatusOK && instance == simC
		})
		s.servers["cluster-a"].pin(t, 0, 0.1)
		s.settle(t, 30*time.Second, 30, "cluster-a measured with capacity: requests go to cluster-a", func(code int, instance string) bool {
			return code == http.StatusOK && instance == simA
		})
	})
}

// waitMetricsStates waits until mci_sidecar_epp_metrics_state of pool says
// want, by cluster, and logs how long it took.
func waitMetricsStates(t *testing.T, sc *sidecar.Sidecar, pool, what string, want map[string]string) {
	t.Helper()
	start := time.Now()
	last := ""
	waitfor.Eventually(t, t.Context(), 30*time.Second, func(ctx context.Context) (bool, string) {
		got, err := metricsStates(ctx, sc, pool)
		if err != nil {
			return false, last + "; " + err.Error()
		}
		last = what + ": " + fmt.Sprint(got)
		return fmt.Sprint(got) == fmt.Sprint(want), last
	})
	t.Logf("%s: mci_sidecar_epp_metrics_state says %v after %s", what, want, time.Since(start).Round(time.Millisecond))
}

// exampleMetricsReader is the ClusterRole of
// artifacts/deploy/mci-sidecar/examples/epp-metrics-reader.yaml as it is,
// named name.
func exampleMetricsReader(t *testing.T, name string) *rbacv1.ClusterRole {
	t.Helper()
	var role *rbacv1.ClusterRole
	for _, obj := range readManifests(t, "../../artifacts/deploy/mci-sidecar/examples/epp-metrics-reader.yaml") {
		if obj.GetKind() == "ClusterRole" {
			role = &rbacv1.ClusterRole{}
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, role))
		}
	}
	require.NotNil(t, role, "the manifest has a ClusterRole")
	role.Name = name
	return role
}
