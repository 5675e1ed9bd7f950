package epptransport

import (
	"crypto/tls"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/test/tlstest"
)

func TestSecretTLSConfig(t *testing.T) {
	serving := tlstest.NewServing(t, "127.0.0.1")
	client, other := tlstest.NewClient(t, "sidecar"), tlstest.NewClient(t, "other")
	tests := []struct {
		name       string
		data       map[string][]byte
		wantErr    []string
		wantClient bool
		wantName   string
	}{
		{name: "a CA alone verifies the EPP without a client certificate", data: map[string][]byte{"ca.crt": serving.CAPEM}},
		{
			name:       "a CA with a client certificate and key is mutual TLS",
			data:       map[string][]byte{"ca.crt": serving.CAPEM, "tls.crt": client.CertPEM, "tls.key": client.KeyPEM},
			wantClient: true,
		},
		{
			name:     "server-name overrides the name verified, trimmed as a file's newline",
			data:     map[string][]byte{"ca.crt": serving.CAPEM, "server-name": []byte("epp.example.svc\n")},
			wantName: "epp.example.svc",
		},
		{name: "without ca.crt nothing can verify the EPP", data: map[string][]byte{"tls.crt": client.CertPEM, "tls.key": client.KeyPEM}, wantErr: []string{"example/creds", "has no ca.crt"}},
		{name: "a ca.crt without certificates is refused", data: map[string][]byte{"ca.crt": []byte("not PEM")}, wantErr: []string{"example/creds", "ca.crt"}},
		{name: "a client certificate without its key is refused", data: map[string][]byte{"ca.crt": serving.CAPEM, "tls.crt": client.CertPEM}, wantErr: []string{"has tls.crt but no tls.key"}},
		{name: "a client key without its certificate is refused", data: map[string][]byte{"ca.crt": serving.CAPEM, "tls.key": client.KeyPEM}, wantErr: []string{"has tls.key but no tls.crt"}},
		{
			name:    "a client key of another certificate is refused",
			data:    map[string][]byte{"ca.crt": serving.CAPEM, "tls.crt": client.CertPEM, "tls.key": other.KeyPEM},
			wantErr: []string{"example/creds", "tls.crt with tls.key", "does not match"},
		},
		{name: "a client key that is not PEM is refused", data: map[string][]byte{"ca.crt": serving.CAPEM, "tls.crt": client.CertPEM, "tls.key": []byte("oops")}, wantErr: []string{"tls.key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := secretTLSConfig(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "example", Name: "creds"}, Data: tc.data})
			if len(tc.wantErr) > 0 {
				require.Error(t, err)
				for _, s := range tc.wantErr {
					assert.Contains(t, err.Error(), s)
				}
				for _, v := range tc.data {
					assert.NotContains(t, err.Error(), strings.TrimSpace(string(v)), "no Secret data in errors")
				}
				return
			}
			require.NoError(t, err)
			assert.NotNil(t, c.RootCAs)
			assert.Equal(t, tc.wantClient, len(c.Certificates) == 1)
			assert.Equal(t, tc.wantName, c.ServerName)
			assert.GreaterOrEqual(t, c.MinVersion, uint16(tls.VersionTLS12))
		})
	}
}
