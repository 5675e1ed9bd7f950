package clusterset

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func TestOnlyTheProbeAndListsAndWatchesCountAsNeeded(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         bool
	}{
		{http.MethodGet, "/readyz", true},
		{http.MethodGet, "/api/v1/namespaces", true},
		{http.MethodGet, "/api/v1/namespaces/pools/services", true},
		{http.MethodGet, "/apis/inference.networking.k8s.io/v1/inferencepools", true},
		{http.MethodGet, "/apis/discovery.k8s.io/v1/namespaces/pools/endpointslices", true},
		// The cluster ID's Namespace: a get of one object, whose 403 is
		// its own state (identity.go).
		{http.MethodGet, "/api/v1/namespaces/kube-system", false},
		{http.MethodGet, "/apis/gateway.networking.k8s.io/v1/namespaces/gw/gateways/one", false},
		{http.MethodGet, "/apis/gateway.networking.k8s.io/v1", false},
		{http.MethodGet, "/apis", false},
		{http.MethodGet, "/version", false},
		{http.MethodPost, "/api/v1/namespaces", false},
	} {
		req := httptest.NewRequest(tc.method, "https://member"+tc.path, nil)
		assert.Equal(t, tc.want, needed(req), "%s %s", tc.method, tc.path)
	}
}

func TestAMemberRejectsItsCredentialsUntilItAcceptsThemAgain(t *testing.T) {
	var changes []*rejection
	c := newCredentials(&rest.Config{}, func(_, next *rejection) { changes = append(changes, next) })
	get := func(path string) *http.Request {
		return httptest.NewRequest(http.MethodGet, "https://member"+path, nil)
	}
	t0 := time.Unix(1000, 0)

	c.answered(get("/readyz"), http.StatusOK, t0)
	assert.Nil(t, c.rejected())
	c.answered(get("/api/v1/namespaces"), http.StatusUnauthorized, t0.Add(time.Second))
	c.answered(get("/readyz"), http.StatusUnauthorized, t0.Add(2*time.Second))
	r := c.rejected()
	require.NotNil(t, r)
	assert.Equal(t, rejectedUnauthorized, r.reason)
	assert.Equal(t, t0.Add(time.Second), r.since, "rejected since its first 401")
	require.Len(t, changes, 1, "said once, not at every 401")

	c.answered(get("/readyz"), http.StatusOK, t0.Add(3*time.Second))
	assert.Nil(t, c.rejected(), "an answer to the credentials ends it")
	require.Len(t, changes, 2)
	assert.Nil(t, changes[1])

	c.answered(get("/api/v1/namespaces/kube-system"), http.StatusForbidden, t0.Add(4*time.Second))
	assert.Nil(t, c.rejected(), "a forbidden get of one object is not a rejection")
	c.answered(get("/apis/inference.networking.k8s.io/v1/inferencepools"), http.StatusForbidden, t0.Add(5*time.Second))
	r = c.rejected()
	require.NotNil(t, r)
	assert.Equal(t, rejectedForbidden, r.reason)
	assert.Contains(t, r.message, "/apis/inference.networking.k8s.io/v1/inferencepools")
	c.answered(get("/readyz"), http.StatusOK, t0.Add(6*time.Second))
	assert.NotNil(t, c.rejected(), "a 403 on a list holds until that list is answered")
	c.answered(get("/apis/inference.networking.k8s.io/v1/inferencepools"), http.StatusOK, t0.Add(7*time.Second))
	assert.Nil(t, c.rejected())

	c.answered(get("/api/v1/namespaces/gone/services"), http.StatusForbidden, t0.Add(8*time.Second))
	require.NotNil(t, c.rejected())
	c.answered(get("/readyz"), http.StatusOK, t0.Add(8*time.Second+forbiddenRetention+time.Second))
	assert.Nil(t, c.rejected(), "a list no longer asked stops counting")
	assert.Len(t, changes, 6)
}

func TestTheExpiryOfEachCredentialSentIsRead(t *testing.T) {
	exp := time.Unix(2000000000, 0)
	signed, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(exp)}).SignedString([]byte("key"))
	require.NoError(t, err)
	c := newCredentials(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: selfSignedCert(t, exp.Add(time.Hour))}}, func(_, _ *rejection) {})
	c.sent("Bearer " + signed)
	got := c.expiries()
	assert.Len(t, got, 2)
	assert.True(t, exp.Equal(got[credentialToken].at), "the token's exp: %s", got[credentialToken].at)
	assert.True(t, exp.Add(time.Hour).Equal(got[credentialClientCertificate].at), "the certificate's NotAfter: %s", got[credentialClientCertificate].at)

	for _, tc := range []struct{ name, header string }{
		{"an opaque token", "Bearer abcdef"},
		{"a JWT without exp", "Bearer " + must(jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{}).SignedString([]byte("key")))},
		{"garbage", "Bearer a.b.c"},
	} {
		c := newCredentials(&rest.Config{}, func(_, _ *rejection) {})
		c.sent(tc.header)
		assert.Empty(t, c.expiries(), tc.name)
	}
}

func TestOnlyInlineCredentialsAreRotatedInPlace(t *testing.T) {
	kubeconfigWith := func(user *clientcmdapi.AuthInfo, server string, ca []byte) MemberConfig {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
		cfg.AuthInfos["u"] = user
		cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
		cfg.CurrentContext = "c"
		data, err := clientcmd.Write(*cfg)
		require.NoError(t, err)
		return ParseMemberKubeconfig(data)
	}
	kubeconfig := func(user *clientcmdapi.AuthInfo, server string) MemberConfig {
		return kubeconfigWith(user, server, nil)
	}
	a := kubeconfig(&clientcmdapi.AuthInfo{Token: "one"}, "https://a")
	b := kubeconfig(&clientcmdapi.AuthInfo{Token: "two"}, "https://a")
	require.NoError(t, a.err)
	assert.NotEqual(t, a.fingerprint, b.fingerprint)
	assert.NotEmpty(t, a.credentialless)
	assert.Equal(t, a.credentialless, b.credentialless, "only the token differs")
	assert.NotEqual(t, a.credentialless, kubeconfig(&clientcmdapi.AuthInfo{Token: "two"}, "https://b").credentialless, "another server is another member")
	assert.Empty(t, kubeconfig(&clientcmdapi.AuthInfo{TokenFile: "/t"}, "https://a").credentialless, "client-go follows a token file itself")

	notAfter := time.Now().Add(time.Hour).Truncate(time.Second)
	cert1, key1 := selfSignedKeyPair(t, notAfter)
	cert2, key2 := selfSignedKeyPair(t, notAfter.Add(time.Hour))
	ca1, _ := selfSignedKeyPair(t, notAfter)
	ca2, _ := selfSignedKeyPair(t, notAfter)
	withCert1 := kubeconfigWith(&clientcmdapi.AuthInfo{ClientCertificateData: cert1, ClientKeyData: key1}, "https://a", ca1)
	require.NoError(t, withCert1.err)
	for _, tc := range []struct {
		name string
		mc   MemberConfig
		same bool
	}{
		{"a new client certificate and key", kubeconfigWith(&clientcmdapi.AuthInfo{ClientCertificateData: cert2, ClientKeyData: key2}, "https://a", ca1), true},
		{"a new CA bundle", kubeconfigWith(&clientcmdapi.AuthInfo{ClientCertificateData: cert1, ClientKeyData: key1}, "https://a", append(append([]byte{}, ca1...), ca2...)), true},
		{"a new certificate, key and CA bundle", kubeconfigWith(&clientcmdapi.AuthInfo{ClientCertificateData: cert2, ClientKeyData: key2}, "https://a", ca2), true},
		{"a token instead of the certificate", kubeconfigWith(&clientcmdapi.AuthInfo{Token: "one"}, "https://a", ca1), false},
		{"a token beside the certificate", kubeconfigWith(&clientcmdapi.AuthInfo{Token: "one", ClientCertificateData: cert1, ClientKeyData: key1}, "https://a", ca1), false},
		{"the system's CAs instead of the bundle", kubeconfigWith(&clientcmdapi.AuthInfo{ClientCertificateData: cert1, ClientKeyData: key1}, "https://a", nil), false},
		{"another server", kubeconfigWith(&clientcmdapi.AuthInfo{ClientCertificateData: cert2, ClientKeyData: key2}, "https://b", ca1), false},
	} {
		require.NoError(t, tc.mc.err, tc.name)
		assert.Equal(t, tc.same, withCert1.credentialless == tc.mc.credentialless, tc.name)
	}

	config := rest.CopyConfig(a.rest)
	c := newCredentials(config, func(_, _ *rejection) {})
	assert.Empty(t, config.BearerToken, "the token is sent through the credentials")
	assert.Equal(t, "Bearer one", authorizationSent(t, config), "the inline token is sent")
	require.True(t, c.rotate(b.rest))
	assert.Equal(t, "Bearer two", authorizationSent(t, config), "the rotated token is sent from then on")
	assert.False(t, newCredentials(&rest.Config{}, func(_, _ *rejection) {}).rotate(b.rest), "no inline token, nothing to swap")

	config = rest.CopyConfig(withCert1.rest)
	c = newCredentials(config, func(_, _ *rejection) {})
	assert.Empty(t, config.CertData, "the certificate is sent through the credentials' transport")
	assert.Empty(t, config.CAData, "the CA is verified by the credentials' transport")
	before := c.base.current()
	assert.True(t, notAfter.Equal(c.expiries()[credentialClientCertificate].at))
	rotated := kubeconfigWith(&clientcmdapi.AuthInfo{ClientCertificateData: cert2, ClientKeyData: key2}, "https://a", ca1)
	require.True(t, c.rotate(rotated.rest))
	assert.NotSame(t, before, c.base.current(), "a new certificate comes with a new transport")
	assert.True(t, notAfter.Add(time.Hour).Equal(c.expiries()[credentialClientCertificate].at), "the new certificate's NotAfter")
	assert.False(t, c.rotate(b.rest), "a token where none was sent")

	// A server named without a scheme is reached over TLS because of the
	// CA and certificate: it still is once they are in the credentials'
	// transport.
	// (clientcmd resolves such a kubeconfig without its CA and
	// certificate; a configuration made in code may have them.)
	config = &rest.Config{Host: "127.0.0.1:6443", TLSClientConfig: rest.TLSClientConfig{CAData: ca1, CertData: cert1, KeyData: key1}}
	newCredentials(config, func(_, _ *rejection) {})
	require.Empty(t, config.CAData)
	server, _, err := rest.DefaultServerUrlFor(config)
	require.NoError(t, err)
	assert.Equal(t, "https://127.0.0.1:6443", server.String())
}

func selfSignedCert(t *testing.T, notAfter time.Time) []byte {
	cert, _ := selfSignedKeyPair(t, notAfter)
	return cert
}

// selfSignedKeyPair is a PEM certificate valid until notAfter and its key.
func selfSignedKeyPair(t testing.TB, notAfter time.Time) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "reader"}, NotBefore: notAfter.Add(-2 * time.Hour), NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}

// A credential that something else renews (a projected token in a file, a
// certificate file, an exec plugin's token) has its expiry exported too,
// with its source, so that an alert meant for what someone must rotate by
// hand can leave out what renews itself.
func TestTheExpiryOfACredentialRenewedOutsideTheKubeconfigIsReadWithItsSource(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	token := must(jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(exp)}).SignedString([]byte("key")))
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token), 0o600))
	// The plugin's expirationTimestamp is a minute before the token's exp:
	// what is exported is the exp.
	credential := `{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"` + token +
		`","expirationTimestamp":"` + exp.Add(-time.Minute).UTC().Format(time.RFC3339) + `"}}`
	plugin := filepath.Join(dir, "plugin")
	require.NoError(t, os.WriteFile(plugin, []byte("#!/bin/sh\nprintf '%s\\n' '"+credential+"'\n"), 0o700))
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeCert := func(notAfter time.Time) {
		cert, key := selfSignedKeyPair(t, notAfter)
		require.NoError(t, os.WriteFile(certFile, cert, 0o600))
		require.NoError(t, os.WriteFile(keyFile, key, 0o600))
	}
	writeCert(exp)

	for _, tc := range []struct {
		name   string
		config rest.Config
		kind   string
		source string
	}{
		{"a token file", rest.Config{BearerTokenFile: tokenFile}, credentialToken, sourceFile},
		{"an exec plugin's token", rest.Config{ExecProvider: &clientcmdapi.ExecConfig{Command: plugin, APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}}, credentialToken, sourcePlugin},
		{"an inline token", rest.Config{BearerToken: token}, credentialToken, sourceInline},
		{"a certificate file", rest.Config{TLSClientConfig: rest.TLSClientConfig{CertFile: certFile, KeyFile: keyFile}}, credentialClientCertificate, sourceFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := tc.config
			config.Host, config.CAData = srv.URL, ca
			c := newCredentials(&config, func(_, _ *rejection) {})
			client, err := rest.HTTPClientFor(&config)
			require.NoError(t, err)
			resp, err := client.Get(srv.URL + "/readyz")
			require.NoError(t, err)
			_ = resp.Body.Close()
			got, ok := c.expiries()[tc.kind]
			require.True(t, ok, "the expiry is read")
			assert.True(t, exp.Equal(got.at), "when it expires: %s", got.at)
			assert.Equal(t, tc.source, got.source)
		})
	}

	c := newCredentials(&rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CertFile: certFile, KeyFile: keyFile, CAData: ca}}, func(_, _ *rejection) {})
	writeCert(exp.Add(24 * time.Hour))
	assert.True(t, exp.Add(24*time.Hour).Equal(c.expiries()[credentialClientCertificate].at), "a renewed certificate file is read again")
}

// authorizationSent is the Authorization header a request made through
// config's wrappers carries when it leaves them.
func authorizationSent(t *testing.T, config *rest.Config) string {
	t.Helper()
	var got string
	rt := config.WrapTransport(roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		got = req.Header.Get("Authorization")
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
	}))
	req, err := http.NewRequest(http.MethodGet, "https://a/api", nil)
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Empty(t, req.Header.Get("Authorization"), "the caller's request is not changed")
	return got
}

// A member whose kubeconfig holds its CA inline is read over HTTP/2 and
// verified TLS through the transport mci makes for it, its responses'
// headers whole though no header table is kept; a server whose
// certificate that CA did not sign is refused.
func TestAMemberWithInlineTLSIsReadOverVerifiedHTTP2(t *testing.T) {
	served := 0
	member := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		w.Header().Set("Audit-Id", fmt.Sprintf("audit-%d-%s", served, r.Proto))
		w.WriteHeader(http.StatusOK)
	}))
	member.EnableHTTP2 = true
	member.StartTLS()
	defer member.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: member.Certificate().Raw})

	config := &rest.Config{Host: member.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	c := newCredentials(config, func(_, _ *rejection) {})
	require.NotNil(t, c.base, "an inline CA is taken into the credentials' transport")
	for i := 1; i <= 3; i++ {
		req, err := http.NewRequest(http.MethodGet, member.URL+"/api", nil)
		require.NoError(t, err)
		resp, err := c.base.RoundTrip(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, 2, resp.ProtoMajor, "HTTP/2: a member's requests share one connection")
		assert.Equal(t, fmt.Sprintf("audit-%d-HTTP/2.0", i), resp.Header.Get("Audit-Id"))
	}

	otherCert, otherKey := selfSignedKeyPair(t, time.Now().Add(time.Hour))
	otherPair, err := tls.X509KeyPair(otherCert, otherKey)
	require.NoError(t, err)
	other := httptest.NewUnstartedServer(http.NotFoundHandler())
	other.EnableHTTP2 = true
	other.TLS = &tls.Config{Certificates: []tls.Certificate{otherPair}}
	other.StartTLS()
	defer other.Close()
	req, err := http.NewRequest(http.MethodGet, other.URL+"/api", nil)
	require.NoError(t, err)
	_, err = c.base.RoundTrip(req)
	require.Error(t, err, "a certificate the member's CA did not sign")
	assert.Contains(t, err.Error(), "certificate")
}
