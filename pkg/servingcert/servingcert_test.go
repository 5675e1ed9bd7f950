package servingcert

import (
	"crypto/x509"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/cert"
)

var testHosts = []string{"mci-apiserver.mci-system.svc", "mci-apiserver.mci-system.svc.cluster.local"}

func secretOf(b *Bundle) *corev1.Secret {
	return &corev1.Secret{Type: corev1.SecretTypeTLS, Data: b.data()}
}

func TestUsable(t *testing.T) {
	good, err := generate(testHosts, Validity)
	require.NoError(t, err)
	other, err := generate([]string{"other.mci-system.svc"}, Validity)
	require.NoError(t, err)
	leaf, err := leafOf(good.CertPEM)
	require.NoError(t, err)
	assert.Equal(t, leaf.NotAfter, good.NotAfter, "a bundle knows when its serving certificate ends")
	assert.WithinDuration(t, time.Now().Add(Validity), good.NotAfter, 2*time.Hour, "about Validity from now (client-go back-dates a certificate by an hour)")

	tests := []struct {
		name        string
		secret      *corev1.Secret
		now         time.Time
		wantProblem string // "" when usable
	}{
		{name: "a fresh certificate for the service is kept", secret: secretOf(good), now: time.Now()},
		{name: "a certificate for another service is replaced", secret: secretOf(other), now: time.Now(), wantProblem: "does not verify for mci-apiserver.mci-system.svc"},
		{name: "a certificate with more than a third of its validity left is kept", secret: secretOf(good), now: leaf.NotAfter.Add(-Validity / 2)},
		{name: "a certificate near its end is replaced", secret: secretOf(good), now: leaf.NotAfter.Add(-Validity / 4), wantProblem: "expires at"},
		{name: "a certificate with someone else's key is replaced", secret: secretOf(&Bundle{CertPEM: good.CertPEM, KeyPEM: other.KeyPEM, CAPEM: good.CAPEM}), now: time.Now(), wantProblem: "not a key pair"},
		{name: "a certificate that the stored CA did not sign is replaced", secret: secretOf(&Bundle{CertPEM: good.CertPEM, KeyPEM: good.KeyPEM, CAPEM: other.CAPEM}), now: time.Now(), wantProblem: "does not verify"},
		{name: "a Secret without a CA is replaced", secret: secretOf(&Bundle{CertPEM: good.CertPEM, KeyPEM: good.KeyPEM}), now: time.Now(), wantProblem: "holds no CA certificate"},
		{name: "an empty Secret is replaced", secret: &corev1.Secret{}, now: time.Now(), wantProblem: "not a key pair"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, problem := usable(tc.secret, testHosts, tc.now, Validity)
			if tc.wantProblem == "" {
				assert.Empty(t, problem)
				assert.Equal(t, good, b)
				return
			}
			assert.Contains(t, problem, tc.wantProblem)
			assert.Nil(t, b)
		})
	}
}

func TestServiceHosts(t *testing.T) {
	tests := []struct {
		name    string
		spec    map[string]any
		want    []string
		wantErr string
	}{
		{name: "the service's names", spec: map[string]any{"service": map[string]any{"name": "mci-apiserver", "namespace": "mci-system"}}, want: testHosts},
		{name: "a local APIService names no service", spec: map[string]any{}, wantErr: "names no spec.service"},
		{name: "insecureSkipTLSVerify is refused", spec: map[string]any{"insecureSkipTLSVerify": true, "service": map[string]any{"name": "a", "namespace": "b"}}, wantErr: "sets insecureSkipTLSVerify"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "v1alpha1.example.com"}, "spec": tc.spec}}
			got, err := serviceHosts(u)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestTrusts(t *testing.T) {
	a, err := generate(testHosts, Validity)
	require.NoError(t, err)
	b, err := generate(testHosts, Validity)
	require.NoError(t, err)
	enc := base64.StdEncoding.EncodeToString
	assert.True(t, trusts(enc(a.CAPEM), a))
	assert.True(t, trusts(enc(append(append([]byte{}, b.CAPEM...), a.CAPEM...)), a), "a bundle that holds the CA among others")
	assert.False(t, trusts(enc(b.CAPEM), a))
	assert.False(t, trusts("not base64!", a))
	assert.False(t, trusts("", a))
}

// The caBundle written at a renewal trusts the new CA first, keeps the CAs
// that other replicas may still serve, each once, and drops those expired.
func TestMergeCAs(t *testing.T) {
	a, err := generate(testHosts, Validity)
	require.NoError(t, err)
	b, err := generate(testHosts, Validity)
	require.NoError(t, err)
	old, err := generate(testHosts, time.Minute)
	require.NoError(t, err)
	merged := mergeCAs(a.CAPEM, [][]byte{b.CAPEM, append(append([]byte{}, a.CAPEM...), b.CAPEM...), old.CAPEM, []byte("not PEM")}, time.Now())
	certs, err := cert.ParseCertsPEM(merged)
	require.NoError(t, err)
	require.Len(t, certs, 3)
	want := func(b *Bundle) *x509.Certificate {
		c, err := cert.ParseCertsPEM(b.CAPEM)
		require.NoError(t, err)
		return c[0]
	}
	assert.True(t, certs[0].Equal(want(a)), "the new CA first")
	assert.True(t, certs[1].Equal(want(b)))
	assert.True(t, certs[2].Equal(want(old)), "a CA that has not expired stays")

	merged = mergeCAs(a.CAPEM, [][]byte{old.CAPEM}, time.Now().Add(2*time.Minute))
	certs, err = cert.ParseCertsPEM(merged)
	require.NoError(t, err)
	assert.Len(t, certs, 1, "an expired CA is dropped")
}
