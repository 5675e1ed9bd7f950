package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
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

// These tests point the sidecar at an EPP that serves as the upstream EPPs
// (Gateway API Inference Extension's cmd/epp and the llm-d router's EPP,
// built on it) do with their default flags: --secure-serving=true, so
// ext_proc over TLS with a self-signed certificate made at start, and the
// gRPC health port in plaintext. mci-epp --secure-serving reproduces that
// behaviour (the metrics token is another test's). Loopback blocks
// 127.0.151-152.x: cluster-a exports the pool and runs the EPP, cluster-b
// runs the sidecar.

func TestSidecarReachesAnEPPWithTheUpstreamDefaultsAndHonoursBackendTLSPolicy(t *testing.T) {
	const (
		ns, pool  = "e2e-upstream-tls", "llm"
		eppIP     = "127.0.151.100"
		sidecarIP = "127.0.152.1"
		eppHost   = "epp.e2e-upstream-tls.example"
		caName    = "epp-ca"
	)
	ctx := t.Context()

	a := clusterClients(t, "cluster-a")
	a.createNamespace(t, ctx, ns)
	m := &modelServer{pod: "sim-upstream-a", ip: "127.0.151.1"}
	m.sim = startSimulator(t, m.address(), simulator.Options{InstanceID: m.pod, Model: baseModel, MaxLoRA: 1, Latency: time.Millisecond})
	_, err := a.kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: m.pod, Namespace: ns, Labels: map[string]string{"app": pool}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	(&eppPool{t: t, cluster: a, ns: ns, name: pool}).setReady(m, true)
	_, err = a.mci.InferencePoolV1().InferencePools(ns).Create(ctx, exportedPool(ns, pool, v1alpha1.RoutingModeEndpoint), metav1.CreateOptions{})
	require.NoError(t, err)
	// The upstream defaults: ext_proc over self-signed TLS, plaintext health.
	upstream := startClusterEPPWith(t, "cluster-a", ns, pool, eppIP, eppProcessOptions{args: []string{"--secure-serving"}})
	a.createEPPService(t, ctx, ns, eppIP)
	a.setEPPEndpoint(t, ctx, ns, true)

	b := clusterClients(t, "cluster-b")
	b.createNamespace(t, ctx, ns)
	createRoute(t, b, ns, pool, map[string]string{
		routetable.PolicyAnnotation:      routingpolicy.HealthBased,
		routetable.FailureModeAnnotation: "FailClose",
	})
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
	metrics := func(t *testing.T) promtext.Metrics {
		t.Helper()
		m, err := promtext.Get(t.Context(), "http://"+sc.MetricsAddr()+"/metrics")
		require.NoError(t, err)
		return m
	}
	setPoolTransport := func(t *testing.T, value string) {
		t.Helper()
		a.editPool(t, ctx, ns, pool, func(p *poolv1.InferencePool) {
			p.Annotations[v1alpha1.EndpointPickerTransportAnnotation] = value
		})
	}
	importTransport := func(t *testing.T, want func(v1alpha1.EndpointPickerImport) bool) v1alpha1.EndpointPickerImport {
		t.Helper()
		var epp v1alpha1.EndpointPickerImport
		waitfor.Eventually(t, ctx, 30*time.Second, func(ctx context.Context) (bool, string) {
			imp, err := b.importOf(ctx, ns, pool)
			if err != nil || imp == nil || len(imp.Status.Clusters) != 1 {
				return false, fmt.Sprintf("import %+v (err=%v)", imp, err)
			}
			epp = imp.Status.Clusters[0].EndpointPicker
			return want(epp), fmt.Sprintf("%+v transport %+v", epp, epp.Transport)
		})
		return epp
	}

	t.Run("with no transport set the sidecar speaks plaintext, which the EPP refuses: 503 under FailClose, the failure logged and counted, never silent", func(t *testing.T) {
		s.settle(t, 30*time.Second, 10, "plaintext to a TLS ext_proc port", failedClosed)
		m := metrics(t)
		assert.Equal(t, 1.0, m.Value(t, `mci_sidecar_epp_transport{cluster="cluster-a",pool="e2e-upstream-tls/llm",port="ext-proc",transport="plaintext"}`))
		_, counted, err := m.Lookup(`mci_sidecar_epp_connection_failures_total{cluster="cluster-a",port="ext-proc",transport="plaintext"}`)
		require.NoError(t, err)
		assert.True(t, counted, "the failed plaintext connections are counted")
	})

	t.Run("the one setting for upstream EPPs, ext-proc=TLS on the exported pool, routes through it: TLS without verification, plaintext health", func(t *testing.T) {
		setPoolTransport(t, "ext-proc=TLS")
		epp := importTransport(t, func(e v1alpha1.EndpointPickerImport) bool {
			return e.Transport != nil && e.Transport.Mode == v1alpha1.TransportTLS
		})
		assert.Nil(t, epp.Health.Transport, "the health port is left to the importer's default: plaintext")
		s.settle(t, 30*time.Second, 20, "ext_proc over TLS", routed)
		assert.Equal(t, map[string]int{m.pod: 30}, s.spread(t, 30))
		m := metrics(t)
		assert.Equal(t, 1.0, m.Value(t, `mci_sidecar_epp_transport{cluster="cluster-a",pool="e2e-upstream-tls/llm",port="ext-proc",transport="tls-unverified"}`))
		assert.Equal(t, 1.0, m.Value(t, `mci_sidecar_epp_transport{cluster="cluster-a",pool="e2e-upstream-tls/llm",port="health",transport="plaintext"}`))
		assert.Equal(t, 1.0, m.Value(t, `mci_sidecar_epp_healthy{cluster="cluster-a",pool="e2e-upstream-tls/llm"}`), "the prober reaches the plaintext health port")
	})

	// The EPP gets a certificate from a CA (upstream: --cert-path), which
	// cluster-a's BackendTLSPolicy names for its Service, and cluster-b
	// holds the CA ConfigMap of the same namespace.
	serving := tlstest.NewServing(t, eppIP, eppHost)
	upstream.stop()
	dir := t.TempDir()
	startClusterEPPWith(t, "cluster-a", ns, pool, eppIP, eppProcessOptions{
		args: []string{
			"--tls-cert-file=" + tlstest.WriteFile(t, dir, "tls.crt", serving.CertPEM),
			"--tls-private-key-file=" + tlstest.WriteFile(t, dir, "tls.key", serving.KeyPEM),
		},
		healthCreds: credentials.NewTLS(tlstest.ClientConfig(t, serving.CAPEM, nil)),
	})
	setPoolTransport(t, "TLS")
	configMaps := b.kube.CoreV1().ConfigMaps(ns)
	setCA := func(t *testing.T, caPEM []byte) {
		t.Helper()
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: caName, Namespace: ns, Labels: map[string]string{epptransport.CredentialsLabel: "true"}},
			Data:       map[string]string{"ca.crt": string(caPEM)},
		}
		if _, err := configMaps.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			_, err = configMaps.Create(t.Context(), cm, metav1.CreateOptions{})
			require.NoError(t, err)
		}
	}
	setCA(t, serving.CAPEM)
	_, err = a.gateway.GatewayV1().BackendTLSPolicies(ns).Create(ctx, &gatewayv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "epp-tls", Namespace: ns},
		Spec: gatewayv1.BackendTLSPolicySpec{
			TargetRefs: []gatewayv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gatewayv1.LocalPolicyTargetReference{Kind: "Service", Name: "epp"}}},
			Validation: gatewayv1.BackendTLSPolicyValidation{
				CACertificateRefs: []gatewayv1.LocalObjectReference{{Kind: "ConfigMap", Name: caName}},
				Hostname:          eppHost,
			},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	t.Run("the exporting cluster's BackendTLSPolicy reaches the import, and the sidecar verifies every TLS port with it", func(t *testing.T) {
		epp := importTransport(t, func(e v1alpha1.EndpointPickerImport) bool {
			return e.Transport != nil && e.Transport.Validation != nil && e.Health.Transport != nil && e.Health.Transport.Validation != nil
		})
		assert.Equal(t, &v1alpha1.BackendTLSValidation{PolicyName: "epp-tls", CACertificateRefs: []v1alpha1.CACertificateRef{{Kind: "ConfigMap", Name: caName}}, Hostname: eppHost}, epp.Transport.Validation)
		s.settle(t, 30*time.Second, 20, "verified TLS", routed)
		assert.Equal(t, map[string]int{m.pod: 30}, s.spread(t, 30))
		m := metrics(t)
		assert.Equal(t, 1.0, m.Value(t, `mci_sidecar_epp_transport{cluster="cluster-a",pool="e2e-upstream-tls/llm",port="ext-proc",transport="tls-verified"}`))
		assert.Equal(t, 1.0, m.Value(t, `mci_sidecar_epp_transport{cluster="cluster-a",pool="e2e-upstream-tls/llm",port="health",transport="tls-verified"}`))
	})

	t.Run("a CA that does not verify the EPP fails closed (503), never unverified, and says why", func(t *testing.T) {
		setCA(t, tlstest.NewServing(t, eppIP, eppHost).CAPEM)
		s.settle(t, 30*time.Second, 10, "with the wrong CA", failedClosed)
		for i := range 10 {
			code, instance, text := s.send(t)
			require.Equal(t, http.StatusServiceUnavailable, code, "request %d answered by %q: %s", i+1, instance, text)
		}
		// The route is HealthBased: the health prober may meet the wrong CA
		// before a request does, and then the cluster is skipped without an
		// ext_proc dial. Either way the failed verified handshake is counted.
		failures, err := metrics(t).SumMatching(`mci_sidecar_epp_connection_failures_total{cluster="cluster-a",transport="tls-verified"}`)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, failures, 1.0, "the failed verified handshakes (ext-proc or health) are counted")
	})

	t.Run("the right CA back, requests succeed again", func(t *testing.T) {
		setCA(t, serving.CAPEM)
		s.settle(t, 30*time.Second, 20, "with the right CA", routed)
	})

	t.Run("Plaintext asked for an ext-proc port that a BackendTLSPolicy targets is refused: the cluster is skipped, 503", func(t *testing.T) {
		setPoolTransport(t, "Plaintext")
		s.settle(t, 30*time.Second, 10, "Plaintext against the policy", failedClosed)
	})
}
