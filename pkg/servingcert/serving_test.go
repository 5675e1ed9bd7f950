package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/util/cert"
	"k8s.io/component-base/metrics/testutil"
)

func gaugeValue(t *testing.T) float64 {
	t.Helper()
	v, err := testutil.GetGaugeMetricValue(certificateExpiry)
	require.NoError(t, err)
	return v
}

// A server that runs past two thirds of its certificate's validity renews
// it while running, the way the generic API server serves it (a dynamic
// serving certificate controller that listens to Serving): new handshakes
// get the new certificate, verified by the CA the APIService now trusts,
// and a connection opened before goes on. The cluster is a fake: what is
// under test is the renewal and the serving, not the API calls.
func TestTheServingCertificateIsRenewedWhileTheServerRuns(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": "v1alpha1.inference.networking.x-k8s.io"},
		"spec":       map[string]any{"service": map[string]any{"name": "mci-apiserver", "namespace": "mci-system"}},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{APIServiceGVR: "APIServiceList"}, apiService)
	kube := kubefake.NewClientset()
	// Short, with room for a loaded machine: renewal starts 5s before its
	// end. A new key, the APIService's wait and the controller's pickup
	// took 2.2s on 2 cores under a load of 14, past the 2s a 6s validity
	// left.
	validity := 15 * time.Second
	serving, err := NewServing(ctx, kube, dyn, Options{
		Namespace:       "mci-system",
		SecretName:      "mci-apiserver-serving-cert",
		APIService:      "v1alpha1.inference.networking.x-k8s.io",
		APIServiceWait:  time.Second,
		Validity:        validity,
		RefreshInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	first := serving.NotAfter()
	assert.Equal(t, float64(first.Unix()), gaugeValue(t), "the expiry metric follows the certificate")

	// Serve as the generic API server does.
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	controller := dynamiccertificates.NewDynamicServingCertificateController(tlsConfig, nil, serving, nil, nil)
	serving.AddListener(controller)
	require.NoError(t, controller.RunOnce())
	go controller.Run(1, ctx.Done())
	go serving.Run(ctx, 1)
	tlsConfig.GetConfigForClient = controller.GetConfigForClient
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsConfig)
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	// Clients verify what the aggregator would: the APIService's caBundle
	// and the Service's name.
	handshake := func() (*x509.Certificate, *tls.Conn, error) {
		got, err := dyn.Resource(APIServiceGVR).Get(ctx, "v1alpha1.inference.networking.x-k8s.io", metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		bundle, _, _ := unstructured.NestedString(got.Object, "spec", "caBundle")
		roots, err := cert.NewPoolFromBytes(decodeBase64(bundle))
		if err != nil {
			return nil, nil, err
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "mci-apiserver.mci-system.svc", MinVersion: tls.VersionTLS12})
		if err != nil {
			return nil, nil, err
		}
		return conn.ConnectionState().PeerCertificates[0], conn, nil
	}
	before, open, err := handshake()
	require.NoError(t, err)
	defer open.Close()
	assert.Equal(t, first, before.NotAfter)
	request := func() string {
		req, err := http.NewRequest(http.MethodGet, "https://mci-apiserver.mci-system.svc/", nil)
		require.NoError(t, err)
		require.NoError(t, req.Write(open))
		require.NoError(t, open.SetReadDeadline(time.Now().Add(time.Second)))
		buf := make([]byte, 512)
		n, err := open.Read(buf)
		require.NoError(t, err)
		return string(buf[:n])
	}
	assert.Contains(t, request(), "200 OK")

	var renewed *x509.Certificate
	require.Eventually(t, func() bool {
		c, conn, err := handshake()
		if err != nil {
			t.Logf("handshake: %v", err)
			return false
		}
		_ = conn.Close()
		renewed = c
		return !c.Equal(before)
	}, 3*validity, 20*time.Millisecond, "the certificate was never renewed while the server ran")
	renewedAt := time.Now()
	assert.True(t, renewedAt.Before(first), "renewed before the old certificate ended")
	assert.True(t, renewed.NotAfter.After(first), "the new certificate ends later")
	assert.Equal(t, float64(renewed.NotAfter.Unix()), gaugeValue(t), "the expiry metric follows the renewal")

	// The connection opened before the renewal still serves requests.
	assert.Contains(t, request(), "200 OK", "a connection opened before the renewal goes on")
}
