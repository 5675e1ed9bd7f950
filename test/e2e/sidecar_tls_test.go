package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/epptransport"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/promtext"
	"github.com/mci-dev/mci/test/simulator"
	"github.com/mci-dev/mci/test/tlstest"
	"github.com/mci-dev/mci/test/waitfor"
)

// These tests run the sidecar's hop to an EPP over mutual TLS on the local
// ClusterSet, with the loopback blocks 127.0.131-132.x: cluster-a exports
// a pool whose mci-epp requires client certificates, cluster-b holds the
// Secret its import names and runs the sidecar.

func TestSidecarReachesAMutualTLSEPPWithTheSecretOfTheImportingCluster(t *testing.T) {
	const (
		ns, pool   = "e2e-sidecar-tls", "llm"
		secretName = "epp-client-tls"
		eppIP      = "127.0.131.100"
		sidecarIP  = "127.0.132.1"
	)
	ctx := t.Context()
	serving := tlstest.NewServing(t, eppIP)
	client := tlstest.NewClient(t, "mci-sidecar-cluster-b")

	// cluster-a: a model server, the exported pool naming the Secret, and
	// its mci-epp serving every port with mutual TLS.
	a := clusterClients(t, "cluster-a")
	a.createNamespace(t, ctx, ns)
	m := &modelServer{pod: "sim-cluster-a", ip: "127.0.131.1"}
	m.sim = startSimulator(t, m.address(), simulator.Options{InstanceID: m.pod, Model: baseModel, MaxLoRA: 1, Latency: time.Millisecond})
	_, err := a.kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: m.pod, Namespace: ns, Labels: map[string]string{"app": pool}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	(&eppPool{t: t, cluster: a, ns: ns, name: pool}).setReady(m, true)
	exported := exportedPool(ns, pool, v1alpha1.RoutingModeEndpoint)
	exported.Annotations[v1alpha1.EndpointPickerSecretAnnotation] = secretName
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exported, metav1.CreateOptions{})
	require.NoError(t, err)
	dir := t.TempDir()
	startClusterEPPWith(t, "cluster-a", ns, pool, eppIP, eppProcessOptions{
		args: []string{
			"--tls-cert-file=" + tlstest.WriteFile(t, dir, "tls.crt", serving.CertPEM),
			"--tls-private-key-file=" + tlstest.WriteFile(t, dir, "tls.key", serving.KeyPEM),
			"--tls-client-ca-file=" + tlstest.WriteFile(t, dir, "client-ca.crt", client.CertPEM),
		},
		healthCreds: credentials.NewTLS(tlstest.ClientConfig(t, serving.CAPEM, &client)),
	})
	a.createEPPService(t, ctx, ns, eppIP)
	a.setEPPEndpoint(t, ctx, ns, true)
	eppAddr := net.JoinHostPort(eppIP, strconv.Itoa(eppGRPCPort))

	t.Run("the EPP answers only clients with a certificate it trusts", func(t *testing.T) {
		stranger := tlstest.NewClient(t, "stranger")
		for name, dial := range map[string][]grpc.DialOption{
			"plaintext":                 nil,
			"an untrusted certificate":  {grpc.WithTransportCredentials(credentials.NewTLS(tlstest.ClientConfig(t, serving.CAPEM, &stranger)))},
			"the sidecar's certificate": {grpc.WithTransportCredentials(credentials.NewTLS(tlstest.ClientConfig(t, serving.CAPEM, &client)))},
		} {
			c, err := envoyclient.Dial(eppAddr, envoyclient.Options{MessageTimeout: 5 * time.Second}, dial...)
			require.NoError(t, err)
			res, err := c.Do(ctx, envoyclient.Request{Path: "/v1/completions", Body: completion(baseModel)})
			_ = c.Close()
			if name == "the sidecar's certificate" {
				require.NoError(t, err, name)
				assert.Equal(t, m.address(), res.Destination, name)
				continue
			}
			assert.Error(t, err, name)
		}
	})

	// cluster-b: the route to the import, failing closed, and the import
	// naming the Secret through the aggregated API.
	b := clusterClients(t, "cluster-b")
	b.createNamespace(t, ctx, ns)
	createRoute(t, b, ns, pool, map[string]string{
		routetable.PolicyAnnotation:      routingpolicy.Weighted,
		routetable.FailureModeAnnotation: "FailClose",
	})
	wantRef := &corev1.SecretReference{Namespace: ns, Name: secretName}
	waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
		imp, err := b.importOf(ctx, ns, pool)
		if err != nil || imp == nil || len(imp.Status.Clusters) != 1 {
			return false, fmt.Sprintf("import %+v (err=%v)", imp, err)
		}
		c := imp.Status.Clusters[0]
		ok := conditionStatus(c.Conditions, "Ready") == metav1.ConditionTrue && c.EndpointPicker.Health != nil && c.EndpointPicker.Metrics != nil
		return ok, fmt.Sprintf("%+v", c)
	})
	imp, err := b.importOf(ctx, ns, pool)
	require.NoError(t, err)
	epp := imp.Status.Clusters[0].EndpointPicker
	assert.Equal(t, wantRef, epp.SecretRef, "the import names the Secret for the ext-proc port")
	assert.Equal(t, wantRef, epp.Health.SecretRef, "and for the health port")
	assert.Equal(t, wantRef, epp.Metrics.SecretRef, "and for the metrics port")

	secrets := b.kube.CoreV1().Secrets(ns)
	good := map[string][]byte{"ca.crt": serving.CAPEM, "tls.crt": client.CertPEM, "tls.key": client.KeyPEM}
	setSecret := func(t *testing.T, data map[string][]byte) {
		t.Helper()
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ns, Labels: map[string]string{epptransport.CredentialsLabel: "true"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       data,
		}
		_, err := secrets.Update(t.Context(), s, metav1.UpdateOptions{})
		if err != nil {
			_, err = secrets.Create(t.Context(), s, metav1.CreateOptions{})
		}
		require.NoError(t, err)
	}
	setSecret(t, good)

	sc, err := sidecar.New(sidecar.Config{
		BindAddress:      sidecarIP,
		SecretNamespaces: []string{ns},
		Watch:            sidecar.WatchConfig{LocalCluster: "cluster-b", Gateways: []types.NamespacedName{{Namespace: ns, Name: "inference-gateway"}}},
		Server:           sidecar.ServerConfig{AttemptTimeout: 2 * time.Second, RemoteDestinations: eppanswer.Policy{AllowLoopback: true}},
		HealthInterval:   200 * time.Millisecond,
	}, sidecar.Clients{Kube: b.kube, MCI: b.mci, Gateway: b.gateway})
	require.NoError(t, err)
	runSidecar(t, sc)
	ec, err := envoyclient.Dial(sc.GRPCAddr(), envoyclient.Options{MessageTimeout: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ec.Close() })
	gw := httptest.NewServer(envoyclient.NewProxy(ec, nil))
	t.Cleanup(gw.Close)
	s := &sidecarSetup{ns: ns, gateway: gw, b: b, sidecar: sc}

	routed := func(code int, instance string) bool { return code == http.StatusOK && instance == m.pod }
	failedClosed := func(code int, _ string) bool { return code == http.StatusServiceUnavailable }
	// requireAll sends n requests and requires each to get code, with the
	// body the sidecar's FailClose answer carries.
	requireAll := func(t *testing.T, n, code int, body string) {
		t.Helper()
		for i := range n {
			got, instance, text := s.send(t)
			require.Equal(t, code, got, "request %d answered by %q: %s", i+1, instance, text)
			if body != "" {
				require.Contains(t, text, body)
			}
		}
	}

	t.Run("requests from cluster-b's gateway reach cluster-a's model server over mutual TLS", func(t *testing.T) {
		s.settle(t, 30*time.Second, 20, "with the Secret", routed)
		got := s.spread(t, 50)
		assert.Equal(t, map[string]int{m.pod: 50}, got)
	})

	t.Run("a Secret without the client certificate fails the cluster: FailClose answers 503", func(t *testing.T) {
		setSecret(t, map[string][]byte{"ca.crt": serving.CAPEM})
		s.settle(t, 15*time.Second, 10, "without a client certificate", failedClosed)
		requireAll(t, 20, http.StatusServiceUnavailable, "no cluster's EPP answered")
	})

	t.Run("the Secret rotated to the right material, requests succeed again", func(t *testing.T) {
		setSecret(t, good)
		s.settle(t, 15*time.Second, 20, "with the client certificate back", routed)
	})

	t.Run("a Secret whose CA does not verify the EPP fails the cluster: FailClose answers 503", func(t *testing.T) {
		setSecret(t, map[string][]byte{"ca.crt": tlstest.NewServing(t, eppIP).CAPEM, "tls.crt": client.CertPEM, "tls.key": client.KeyPEM})
		s.settle(t, 15*time.Second, 10, "with the wrong CA", failedClosed)
		requireAll(t, 20, http.StatusServiceUnavailable, "no cluster's EPP answered")
	})

	t.Run("a Secret without the sidecar's label is not used, as if missing: 503", func(t *testing.T) {
		setSecret(t, good)
		s.settle(t, 15*time.Second, 5, "with the right material", routed)
		unlabelled, err := secrets.Get(ctx, secretName, metav1.GetOptions{})
		require.NoError(t, err)
		unlabelled.Labels = nil
		_, err = secrets.Update(ctx, unlabelled, metav1.UpdateOptions{})
		require.NoError(t, err)
		s.settle(t, 15*time.Second, 10, "with an unlabelled Secret", failedClosed)
	})

	t.Run("a deleted Secret fails the cluster, and a new one brings it back", func(t *testing.T) {
		require.NoError(t, secrets.Delete(ctx, secretName, metav1.DeleteOptions{}))
		s.settle(t, 15*time.Second, 10, "without the Secret", failedClosed)
		setSecret(t, good)
		s.settle(t, 15*time.Second, 20, "with a new Secret", routed)
		got := s.spread(t, 50)
		assert.Equal(t, map[string]int{m.pod: 50}, got)
	})

	t.Run("the sidecar's metrics show the requests routed and those failed closed", func(t *testing.T) {
		m, err := promtext.Get(t.Context(), "http://"+sc.MetricsAddr()+"/metrics")
		require.NoError(t, err)
		routed, err := m.SumMatching(`mci_sidecar_requests_total{cluster="cluster-a",code="200",outcome="routed"}`)
		require.NoError(t, err)
		assert.Positive(t, routed, "the routed requests are counted")
		unavailable, err := m.SumMatching(`mci_sidecar_requests_total{code="503",outcome="unavailable"}`)
		require.NoError(t, err)
		assert.Positive(t, unavailable, "the requests failed closed are counted")
	})
}
