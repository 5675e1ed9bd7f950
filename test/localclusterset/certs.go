package localclusterset

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// MCIAPIServerServiceName and MCIAPIServerNamespace name the Service the
// APIService points at; the aggregator checks the serving certificate of
// mci-apiserver against "<service>.<namespace>.svc".
const (
	MCIAPIServerServiceName = "mci-apiserver"
	MCIAPIServerNamespace   = "mci-system"
)

// frontProxyClientName is the common name of the aggregator's client
// certificate, and the only name kube-apiserver lets set identity headers.
const frontProxyClientName = "front-proxy-client"

// memberReaderUser is the identity in the members/ kubeconfigs: what an
// mci-apiserver uses to watch the other clusters, bound to a read-only role.
const memberReaderUser = "mci-member-reader"

// memberGroupPrefix, followed by a cluster's name, is the group of the
// identity that cluster's mci-apiservers read the others with when each
// has its own (the rule mci-apiserver's summary stream identifies readers
// by, pkg/registry/inference/inferencepoolexportsummary).
const memberGroupPrefix = "mci.x-k8s.io:member:"

// keyPair is a certificate and its private key, parsed and PEM-encoded.
type keyPair struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte
}

// pki is every certificate and key the local ClusterSet uses. Separate CAs
// keep the roles apart as in a real cluster: a client certificate is not a
// front-proxy certificate, and mci-apiserver's serving CA is only what the
// APIService's caBundle trusts.
type pki struct {
	dir string

	servingCA    *keyPair // signs each kube-apiserver's serving certificate
	clientCA     *keyPair // --client-ca-file: admin and test users
	frontProxyCA *keyPair // --requestheader-client-ca-file
	frontProxy   *keyPair // --proxy-client-cert-file: the aggregator's identity
	admin        *keyPair // O=system:masters
	memberReader *keyPair // the identity in members/*.kubeconfig
	// memberReaders are, per reading cluster, the identity in
	// members-by-reader/<cluster>/*.kubeconfig: memberReaderUser, in a
	// group that names the cluster.
	memberReaders map[string]*keyPair
	mciServingCA  *keyPair // the APIService's caBundle
	mciServing    *keyPair // mci-apiserver's --tls-cert-file
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// apiServerCertName is the file name stem of a cluster's serving cert.
func apiServerCertName(cluster string) string { return "apiserver-" + cluster }

// newPKI generates every certificate for clusters and writes them under dir.
func newPKI(dir string, clusters []string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	p := &pki{dir: dir}
	var err error
	cas := []struct {
		dst  **keyPair
		name string
		cn   string
	}{
		{&p.servingCA, "serving-ca", "mci-local-serving-ca"},
		{&p.clientCA, "client-ca", "mci-local-client-ca"},
		{&p.frontProxyCA, "front-proxy-ca", "mci-local-front-proxy-ca"},
		{&p.mciServingCA, "mci-serving-ca", "mci-local-mci-apiserver-ca"},
	}
	for _, ca := range cas {
		if *ca.dst, err = newCA(ca.cn); err != nil {
			return nil, err
		}
		if err := p.write(ca.name, *ca.dst); err != nil {
			return nil, err
		}
	}

	for _, c := range clusters {
		kp, err := p.servingCA.sign(apiServerCertRequest(c))
		if err != nil {
			return nil, err
		}
		if err := p.write(apiServerCertName(c), kp); err != nil {
			return nil, err
		}
	}

	leaves := []struct {
		dst  **keyPair
		name string
		ca   *keyPair
		req  certRequest
	}{
		{&p.admin, "admin", p.clientCA, certRequest{commonName: "mci-local-admin", orgs: []string{"system:masters"}, usage: x509.ExtKeyUsageClientAuth}},
		{&p.memberReader, "member-reader", p.clientCA, certRequest{commonName: memberReaderUser, usage: x509.ExtKeyUsageClientAuth}},
		{&p.frontProxy, "front-proxy-client", p.frontProxyCA, certRequest{commonName: frontProxyClientName, usage: x509.ExtKeyUsageClientAuth}},
		{&p.mciServing, "mci-apiserver", p.mciServingCA, certRequest{
			commonName: MCIAPIServerServiceName + "." + MCIAPIServerNamespace + ".svc",
			usage:      x509.ExtKeyUsageServerAuth,
			dnsNames: []string{
				MCIAPIServerServiceName + "." + MCIAPIServerNamespace + ".svc",
				MCIAPIServerServiceName + "." + MCIAPIServerNamespace + ".svc.cluster.local",
				"localhost",
			},
			ips: []net.IP{net.ParseIP("127.0.0.1")},
		}},
	}
	readers := make([]*keyPair, len(clusters))
	for i, c := range clusters {
		leaves = append(leaves, struct {
			dst  **keyPair
			name string
			ca   *keyPair
			req  certRequest
		}{&readers[i], "member-reader-" + c, p.clientCA, certRequest{commonName: memberReaderUser, orgs: []string{memberGroupPrefix + c}, usage: x509.ExtKeyUsageClientAuth}})
	}
	defer func() {
		p.memberReaders = map[string]*keyPair{}
		for i, c := range clusters {
			p.memberReaders[c] = readers[i]
		}
	}()
	for _, l := range leaves {
		if *l.dst, err = l.ca.sign(l.req); err != nil {
			return nil, err
		}
		if err := p.write(l.name, *l.dst); err != nil {
			return nil, err
		}
	}

	// kube-apiserver signs ServiceAccount tokens with this key and verifies
	// them with its public half; ECDSA P-256 (ES256) is supported.
	saPEM, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return nil, fmt.Errorf("generating service account key: %w", err)
	}
	saKey, err := parseSigner(saPEM)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("encoding service account public key: %w", err)
	}
	if err := keyutil.WriteKey(p.path("sa.key"), saPEM); err != nil {
		return nil, fmt.Errorf("writing service account key: %w", err)
	}
	if err := os.WriteFile(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return nil, fmt.Errorf("writing service account public key: %w", err)
	}
	return p, nil
}

// apiServerCertRequest is what a cluster's kube-apiserver serving
// certificate is valid for.
func apiServerCertRequest(cluster string) certRequest {
	return certRequest{
		commonName: cluster + "-kube-apiserver",
		usage:      x509.ExtKeyUsageServerAuth,
		dnsNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		ips:        []net.IP{net.ParseIP("127.0.0.1")},
	}
}

// replace writes kp over the files of name, each through a rename so that
// a reader never sees half a file. A server that reloads them on change
// may read the new certificate with the old key in between: it keeps what
// it served until the pair matches.
func (p *pki) replace(name string, kp *keyPair) error {
	for _, f := range []struct {
		ext  string
		data []byte
		mode os.FileMode
	}{{".crt", kp.certPEM, 0o644}, {".key", kp.keyPEM, 0o600}} {
		tmp := p.path(name + f.ext + ".new")
		if err := os.WriteFile(tmp, f.data, f.mode); err != nil {
			return fmt.Errorf("writing %s%s: %w", name, f.ext, err)
		}
		if err := os.Rename(tmp, p.path(name+f.ext)); err != nil {
			return fmt.Errorf("replacing %s%s: %w", name, f.ext, err)
		}
	}
	return nil
}

// loadPKI reads back what newPKI wrote: a detached ClusterSet is attached to
// by another process, which still mints user certificates from the client CA.
func loadPKI(dir string) (*pki, error) {
	p := &pki{dir: dir}
	for _, f := range []struct {
		dst  **keyPair
		name string
	}{
		{&p.servingCA, "serving-ca"},
		{&p.clientCA, "client-ca"},
		{&p.frontProxyCA, "front-proxy-ca"},
		{&p.frontProxy, "front-proxy-client"},
		{&p.admin, "admin"},
		{&p.memberReader, "member-reader"},
		{&p.mciServingCA, "mci-serving-ca"},
		{&p.mciServing, "mci-apiserver"},
	} {
		kp, err := p.read(f.name)
		if err != nil {
			return nil, err
		}
		*f.dst = kp
	}
	return p, nil
}

func (p *pki) write(name string, kp *keyPair) error {
	if err := cert.WriteCert(p.path(name+".crt"), kp.certPEM); err != nil {
		return fmt.Errorf("writing %s certificate: %w", name, err)
	}
	if err := keyutil.WriteKey(p.path(name+".key"), kp.keyPEM); err != nil {
		return fmt.Errorf("writing %s key: %w", name, err)
	}
	return nil
}

func (p *pki) read(name string) (*keyPair, error) {
	certPEM, err := os.ReadFile(p.path(name + ".crt"))
	if err != nil {
		return nil, fmt.Errorf("reading %s certificate: %w", name, err)
	}
	keyPEM, err := os.ReadFile(p.path(name + ".key"))
	if err != nil {
		return nil, fmt.Errorf("reading %s key: %w", name, err)
	}
	certs, err := cert.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing %s certificate: %w", name, err)
	}
	key, err := parseSigner(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing %s key: %w", name, err)
	}
	return &keyPair{cert: certs[0], key: key, certPEM: certPEM, keyPEM: keyPEM}, nil
}

func newCA(commonName string) (*keyPair, error) {
	keyPEM, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return nil, fmt.Errorf("generating key for %s: %w", commonName, err)
	}
	key, err := parseSigner(keyPEM)
	if err != nil {
		return nil, err
	}
	// Backdated so that a clock step on the machine cannot make a fresh
	// ClusterSet reject its own certificates.
	c, err := cert.NewSelfSignedCACert(cert.Config{CommonName: commonName, NotBefore: time.Now().Add(-time.Hour)}, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA %s: %w", commonName, err)
	}
	return &keyPair{cert: c, key: key, certPEM: encodeCert(c), keyPEM: keyPEM}, nil
}

type certRequest struct {
	commonName string
	orgs       []string
	usage      x509.ExtKeyUsage
	dnsNames   []string
	ips        []net.IP
}

// sign issues a leaf certificate. client-go's cert package only makes
// self-signed certificates, so this is plain crypto/x509.
func (ca *keyPair) sign(req certRequest) (*keyPair, error) {
	keyPEM, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return nil, fmt.Errorf("generating key for %s: %w", req.commonName, err)
	}
	key, err := parseSigner(keyPEM)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(math.MaxInt64))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.commonName, Organization: req.orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{req.usage},
		DNSNames:     req.dnsNames,
		IPAddresses:  req.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", req.commonName, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate for %s: %w", req.commonName, err)
	}
	return &keyPair{cert: c, key: key, certPEM: encodeCert(c), keyPEM: keyPEM}, nil
}

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: cert.CertificateBlockType, Bytes: c.Raw})
}

func parseSigner(keyPEM []byte) (crypto.Signer, error) {
	k, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing private key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", k)
	}
	return s, nil
}
