// Package credexpiry reads when a credential mci sends expires, to export
// it as a metric: a bearer token's exp claim when the token is a JWT, and
// a client certificate's NotAfter. Nothing is verified: whoever receives
// the credential verifies it; this only says when it will stop doing so.
package credexpiry

import (
	"crypto/x509"
	"encoding/pem"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// JWT is token's exp claim; zero when token is not a JWT or has none.
func JWT(token string) time.Time {
	claims := jwt.RegisteredClaims{}
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil || claims.ExpiresAt == nil {
		return time.Time{}
	}
	return claims.ExpiresAt.Time
}

// Certificate is the NotAfter of the first block of data, a PEM client
// certificate; zero when it is none.
func Certificate(data []byte) time.Time {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return time.Time{}
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return time.Time{}
	}
	return cert.NotAfter
}
