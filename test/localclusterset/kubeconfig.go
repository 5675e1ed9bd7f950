package localclusterset

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Tests create many objects in a row; client-go's default of 5 requests a
// second would make them crawl against a local apiserver.
const (
	clientQPS   = 100
	clientBurst = 200
)

// kubeconfig builds a kubeconfig for one cluster and one client identity.
// Cluster, user and context names are distinct per cluster, so that the
// files can be merged with KUBECONFIG=a:b:c and chosen with --context.
func kubeconfig(cluster, server string, ca []byte, user string, client *keyPair) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	authName := user + "@" + cluster
	cfg.AuthInfos[authName] = &clientcmdapi.AuthInfo{ClientCertificateData: client.certPEM, ClientKeyData: client.keyPEM}
	cfg.Contexts[cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: authName, Namespace: "default"}
	cfg.CurrentContext = cluster
	return cfg
}

func writeKubeconfig(path string, cfg *clientcmdapi.Config) error {
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

func restConfig(cfg *clientcmdapi.Config) (*rest.Config, error) {
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("building client config: %w", err)
	}
	rc.QPS, rc.Burst = clientQPS, clientBurst
	return rc, nil
}

// UserConfig returns a client configuration for cluster that authenticates
// as user in groups, with a certificate minted from the client CA, for
// tests of what RBAC lets a user see. The user has no permissions beyond
// those of system:authenticated until the test binds some.
func (cs *ClusterSet) UserConfig(cluster, user string, groups ...string) (*rest.Config, error) {
	c, err := cs.Cluster(cluster)
	if err != nil {
		return nil, err
	}
	kp, err := cs.pki.clientCA.sign(certRequest{commonName: user, orgs: groups, usage: x509.ExtKeyUsageClientAuth})
	if err != nil {
		return nil, err
	}
	return restConfig(kubeconfig(c.Name, c.Server, cs.pki.servingCA.certPEM, user, kp))
}

// FrontProxyClientCert mints a client certificate with commonName from the
// requestheader (front-proxy) CA, the CA the aggregator's own certificate
// comes from, for tests of whom an mci-apiserver lets assert identities in
// X-Remote-User headers: only the name kube-apiserver's
// --requestheader-allowed-names lists.
func (cs *ClusterSet) FrontProxyClientCert(commonName string) (tls.Certificate, error) {
	kp, err := cs.pki.frontProxyCA.sign(certRequest{commonName: commonName, usage: x509.ExtKeyUsageClientAuth})
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(kp.certPEM, kp.keyPEM)
}

// FrontProxyClientName is the common name of the aggregator's client
// certificate, the one name allowed to assert identities.
const FrontProxyClientName = frontProxyClientName

// MCIServingCA is the PEM of the CA that signed every mci-apiserver's
// serving certificate (the APIService's caBundle), for clients that talk
// to an mci-apiserver directly.
func (cs *ClusterSet) MCIServingCA() []byte { return cs.pki.mciServingCA.certPEM }
