package sidecar

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/epp"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/epptransport/epptransporttest"
	"github.com/mci-dev/mci/pkg/extproc"
	mcifake "github.com/mci-dev/mci/pkg/generated/clientset/versioned/fake"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
	"github.com/mci-dev/mci/test/tlstest"
)

// runTLSEPP runs a pkg/epp Endpoint Picker on 127.0.0.1 that serves mutual
// TLS on every port, in front of one model server.
func runTLSEPP(t *testing.T, model *httptest.Server, serving tlstest.Serving, clientCA []byte) *epp.EPP {
	t.Helper()
	dir := t.TempDir()
	e, _ := runEPP(t, model, extproc.TLSOptions{
		CertFile:     tlstest.WriteFile(t, dir, "tls.crt", serving.CertPEM),
		KeyFile:      tlstest.WriteFile(t, dir, "tls.key", serving.KeyPEM),
		ClientCAFile: tlstest.WriteFile(t, dir, "client-ca.crt", clientCA),
	})
	return e
}

// TestSidecarReachesAMutualTLSEPPWithTheSecretOfItsImport runs the data
// path to an EPP that requires client certificates: requests, health checks
// and metric scrapes go over TLS with the Secret the import names; a wrong
// CA fails the cluster (FailClose: 503, never plaintext); fixing the Secret
// brings it back without a restart.
func TestSidecarReachesAMutualTLSEPPWithTheSecretOfItsImport(t *testing.T) {
	serving := tlstest.NewServing(t, "127.0.0.1")
	client := tlstest.NewClient(t, "sidecar")
	model := modelServer(t, "model-a")
	e := runTLSEPP(t, model, serving, client.CertPEM)

	imp := sidecartest.Import("llm")
	eppImported(t, "cluster-a", e)(imp)
	// The pool's published port: its model server's.
	_, imp.Status.Clusters[0].TargetPortNumber = hostPort(t, model.Listener.Addr().String())
	ref := &corev1.SecretReference{Namespace: ns, Name: "epp-creds"}
	epp := &imp.Status.Clusters[0].EndpointPicker
	epp.SecretRef, epp.Health.SecretRef, epp.Metrics.SecretRef = ref, ref, ref
	r := sidecartest.Route("llm-route", 0, []string{"my.model.com"}, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/v1")}, sidecartest.ImportRef("llm", nil)))
	r = sidecartest.Annotate(r, routetable.PolicyAnnotation, routingpolicy.MetricsBased)
	r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw"}}
	creds := map[string][]byte{"ca.crt": serving.CAPEM, "tls.crt": client.CertPEM, "tls.key": client.KeyPEM}
	kube := kubefake.NewSimpleClientset(epptransporttest.Secret(ns, "epp-creds", creds))

	s, err := New(Config{
		BindAddress:      "127.0.0.1",
		SecretNamespaces: []string{ns},
		Watch:            WatchConfig{LocalCluster: "cluster-b", Gateways: gatewayRefs("example/inf-gw")},
		// The EPP's model server is on loopback, as everything here.
		Server:         ServerConfig{AttemptTimeout: time.Second, Scheduling: scheduling.DefaultConfig(), RemoteDestinations: eppanswer.Policy{AllowLoopback: true}},
		HealthInterval: 50 * time.Millisecond,
		ScrapeInterval: 50 * time.Millisecond,
		DrainTimeout:   2 * time.Second,
	}, Clients{Kube: kube, MCI: mcifake.NewSimpleClientset(imp), Gateway: sidecartest.GatewayClients(r, sidecartest.Gateway("inf-gw", sidecartest.Listener("http", 80, "", nil)))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		assert.NoError(t, <-done)
	}()

	ec, err := envoyclient.Dial(s.GRPCAddr(), envoyclient.Options{MessageTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer func() { _ = ec.Close() }()
	gw := httptest.NewServer(envoyclient.NewProxy(ec, nil))
	defer gw.Close()
	send := func() (int, string) {
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/completions", strings.NewReader(`{"model":"base","prompt":"hi"}`))
		require.NoError(t, err)
		req.Host = "my.model.com"
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		var out map[string]string
		if json.Unmarshal(b, &out) == nil && out["served_by"] != "" {
			return resp.StatusCode, out["served_by"]
		}
		return resp.StatusCode, string(b)
	}
	metrics := func() string {
		_, body := get(t, "http://"+s.MetricsAddr()+"/metrics")
		return body
	}

	require.Eventually(t, func() bool { code, _ := send(); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	code, by := send()
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "model-a", by)
	// The prober and the scraper reach the EPP's TLS health and metrics
	// ports with the same Secret.
	require.Eventually(t, func() bool {
		return strings.Contains(metrics(), `mci_sidecar_epp_healthy{cluster="cluster-a",pool="example/llm"} 1`) && s.scraper.Get("https://"+e.MetricsAddr()+"/metrics", "llm") != nil
	}, 10*time.Second, 20*time.Millisecond)

	t.Run("a Secret with a CA that does not verify the EPP fails the cluster: FailClose answers 503", func(t *testing.T) {
		wrong := epptransporttest.Secret(ns, "epp-creds", map[string][]byte{"ca.crt": tlstest.NewServing(t, "127.0.0.1").CAPEM, "tls.crt": client.CertPEM, "tls.key": client.KeyPEM})
		wrong.ResourceVersion = "2"
		_, err := kube.CoreV1().Secrets(ns).Update(t.Context(), wrong, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool { code, _ := send(); return code == http.StatusServiceUnavailable }, 10*time.Second, 20*time.Millisecond)
		for range 10 {
			code, body := send()
			assert.Equal(t, http.StatusServiceUnavailable, code)
			assert.Contains(t, body, "InferencePoolImport example/llm")
		}
	})

	t.Run("the Secret fixed, new connections use it and requests succeed again", func(t *testing.T) {
		fixed := epptransporttest.Secret(ns, "epp-creds", creds)
		fixed.ResourceVersion = "3"
		_, err := kube.CoreV1().Secrets(ns).Update(t.Context(), fixed, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool { code, _ := send(); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
		for range 10 {
			code, by := send()
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, "model-a", by)
		}
	})
}
