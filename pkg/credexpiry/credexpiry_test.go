package credexpiry

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAJWTsExpIsReadWithoutVerifyingIt(t *testing.T) {
	exp := time.Unix(2000000000, 0)
	sign := func(claims jwt.RegisteredClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte("key"))
		require.NoError(t, err)
		return s
	}
	assert.True(t, exp.Equal(JWT(sign(jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(exp)}))))
	for name, token := range map[string]string{
		"a JWT without exp": sign(jwt.RegisteredClaims{}),
		"an opaque token":   "abcdef",
		"three dots":        "a.b.c",
		"empty":             "",
		"not base64":        "!!.!!.!!",
	} {
		assert.True(t, JWT(token).IsZero(), name)
	}
}

func TestACertificatesNotAfterIsRead(t *testing.T) {
	notAfter := time.Unix(2000000000, 0)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "reader"}, NotBefore: notAfter.Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	assert.True(t, notAfter.Equal(Certificate(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))))
	assert.True(t, Certificate([]byte("not PEM")).IsZero())
	assert.True(t, Certificate(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("garbage")})).IsZero())
	assert.True(t, Certificate(nil).IsZero())
}
