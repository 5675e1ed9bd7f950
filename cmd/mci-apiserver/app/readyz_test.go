package app

import (
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// caContent is a CA provider whose bundle a test sets, as the client CA
// controller sets its own once it has read its ConfigMap.
type caContent struct{ bundle []byte }

func (c *caContent) Name() string {
	return "request-header::kube-system::extension-apiserver-authentication::requestheader-client-ca-file"
}
func (c *caContent) CurrentCABundleContent() []byte { return c.bundle }
func (c *caContent) VerifyOptions() (x509.VerifyOptions, bool) {
	return x509.VerifyOptions{}, len(c.bundle) > 0
}
func (c *caContent) AddListener(dynamiccertificates.Listener) {}

func TestAReplicaIsNotReadyUntilTheAggregatorsCAIsLoaded(t *testing.T) {
	ca := &caContent{}
	check := aggregatorCALoaded(ca)
	assert.Equal(t, "aggregator-client-ca", check.Name())
	err := check.Check(nil)
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "would be taken as anonymous")
	}
	ca.bundle = []byte("-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n")
	assert.NoError(t, check.Check(nil))
}
