// Package servingcert gives an aggregated API server a serving certificate
// that its APIService trusts, without cert-manager and without
// insecureSkipTLSVerify: the certificate and the CA that signed it live in a
// kubernetes.io/tls Secret (created when missing, replaced when it no longer
// fits or has lived two thirds of its validity), and the CA goes into the
// APIService's caBundle. While the server runs, Serving checks the Secret
// again and again, renews the certificate in time and serves the new one
// to new connections (Serving).
//
// Replicas share the Secret: the first to start creates it, the others
// read it. The names the certificate is valid for come from the
// APIService's own spec.service, the Service the aggregator dials.
package servingcert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// CAKey is the Secret key of the CA certificate, next to the standard
// tls.crt (serving certificate, then the CA) and tls.key.
const CAKey = "ca.crt"

// Validity is how long a generated certificate and its CA are valid by
// default. A certificate is replaced once less than a third of its
// validity is left: a server that cannot reach its cluster when that time
// comes still has months to try again.
const Validity = 365 * 24 * time.Hour

// RefreshInterval is how often a running server reads the Secret again by
// default: to renew the certificate in time, and to serve the one another
// replica renewed.
const RefreshInterval = time.Minute

// APIServiceGVR is the aggregator's APIService resource.
var APIServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// Options say which Secret and which APIService.
type Options struct {
	// Namespace and SecretName locate the kubernetes.io/tls Secret.
	Namespace  string
	SecretName string
	// APIService is the name of the APIService to trust the certificate
	// (e.g. v1alpha1.inference.networking.x-k8s.io).
	APIService string
	// APIServiceWait is how long to wait for the APIService to exist: the
	// server's pod may start before `kubectl apply` reaches it.
	APIServiceWait time.Duration
	// Validity of a generated certificate (0: Validity).
	Validity time.Duration
	// RefreshInterval of a running server (0: RefreshInterval).
	RefreshInterval time.Duration
}

func (o Options) validity() time.Duration {
	if o.Validity > 0 {
		return o.Validity
	}
	return Validity
}

func (o Options) refreshInterval() time.Duration {
	if o.RefreshInterval > 0 {
		return o.RefreshInterval
	}
	return RefreshInterval
}

// Bundle is the serving certificate chain and key, and the CA that the
// APIService's caBundle now holds.
type Bundle struct {
	CertPEM []byte
	KeyPEM  []byte
	CAPEM   []byte
	// NotAfter is when the serving certificate ends.
	NotAfter time.Time
}

// Ensure returns a serving certificate valid for the APIService's Service,
// creating or renewing the Secret as needed, and makes the APIService's
// caBundle trust it.
func Ensure(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, o Options) (*Bundle, error) {
	b, _, err := ensure(ctx, kube, dyn, o)
	return b, err
}

// ensure is Ensure, and says whether the APIService trusted the
// certificate already when it was read (rather than only since this call
// wrote its caBundle, which the aggregator may not have seen yet).
func ensure(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, o Options) (b *Bundle, trusted bool, err error) {
	logger := klog.FromContext(ctx)
	apiService, err := waitForAPIService(ctx, dyn, o.APIService, o.APIServiceWait)
	if err != nil {
		return nil, false, err
	}
	hosts, err := serviceHosts(apiService)
	if err != nil {
		return nil, false, err
	}
	b, replaced, err := ensureSecret(ctx, kube, o, hosts)
	if err != nil {
		return nil, false, err
	}
	logger.V(4).Info("Read the certificate of the Secret", "secret", o.Namespace+"/"+o.SecretName, "notAfter", b.NotAfter.UTC().Format(time.RFC3339), "renewedAfter", b.NotAfter.Add(-o.validity()/3).UTC().Format(time.RFC3339))
	current, _, _ := unstructured.NestedString(apiService.Object, "spec", "caBundle")
	if replaced == nil && trusts(current, b) {
		return b, true, nil
	}
	// While other replicas still serve the certificate it replaces, the
	// aggregator must trust its CA too: the CAs the caBundle holds stay,
	// but for those that have expired.
	caBundle := mergeCAs(b.CAPEM, [][]byte{replaced, decodeBase64(current)}, time.Now())
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"caBundle": base64.StdEncoding.EncodeToString(caBundle)}})
	if err != nil {
		return nil, false, err
	}
	if _, err := dyn.Resource(APIServiceGVR).Patch(ctx, o.APIService, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, false, fmt.Errorf("writing the caBundle of APIService %s: %w", o.APIService, err)
	}
	logger.Info("APIService now trusts the serving certificate's CA", "apiService", o.APIService, "secret", o.Namespace+"/"+o.SecretName)
	return b, false, nil
}

// mergeCAs is ca followed by the certificates of others that are not ca
// and have not expired at now.
func mergeCAs(ca []byte, others [][]byte, now time.Time) []byte {
	out := append([]byte{}, ca...)
	seen := map[string]bool{}
	if certs, err := cert.ParseCertsPEM(ca); err == nil {
		for _, c := range certs {
			seen[string(c.Raw)] = true
		}
	}
	for _, pemBytes := range others {
		certs, err := cert.ParseCertsPEM(pemBytes)
		if err != nil {
			continue
		}
		for _, c := range certs {
			if seen[string(c.Raw)] || now.After(c.NotAfter) {
				continue
			}
			seen[string(c.Raw)] = true
			if enc, err := cert.EncodeCertificates(c); err == nil {
				out = append(out, enc...)
			}
		}
	}
	return out
}

func decodeBase64(s string) []byte {
	b, _ := base64.StdEncoding.DecodeString(s)
	return b
}

func waitForAPIService(ctx context.Context, dyn dynamic.Interface, name string, timeout time.Duration) (*unstructured.Unstructured, error) {
	var (
		found   *unstructured.Unstructured
		lastErr error
		logged  bool
	)
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		found, lastErr = dyn.Resource(APIServiceGVR).Get(ctx, name, metav1.GetOptions{})
		switch {
		case lastErr == nil:
			return true, nil
		case apierrors.IsNotFound(lastErr):
			if !logged {
				klog.FromContext(ctx).Info("Waiting for the APIService to exist", "apiService", name)
				logged = true
			}
			return false, nil
		}
		return false, fmt.Errorf("reading APIService %s: %w", name, lastErr)
	})
	if err != nil {
		if wait.Interrupted(err) {
			return nil, fmt.Errorf("APIService %s does not exist after %s (last error: %v)", name, timeout, lastErr)
		}
		return nil, err
	}
	return found, nil
}

// serviceHosts are the names the aggregator verifies the serving
// certificate against: <service>.<namespace>.svc, and the fully qualified
// form for clients inside the cluster.
func serviceHosts(apiService *unstructured.Unstructured) ([]string, error) {
	if skip, _, _ := unstructured.NestedBool(apiService.Object, "spec", "insecureSkipTLSVerify"); skip {
		return nil, fmt.Errorf("APIService %s sets insecureSkipTLSVerify: remove it, the serving certificate is verified through caBundle", apiService.GetName())
	}
	name, _, _ := unstructured.NestedString(apiService.Object, "spec", "service", "name")
	namespace, _, _ := unstructured.NestedString(apiService.Object, "spec", "service", "namespace")
	if name == "" || namespace == "" {
		return nil, fmt.Errorf("APIService %s names no spec.service: the aggregator would not dial this server", apiService.GetName())
	}
	svc := name + "." + namespace + ".svc"
	return []string{svc, svc + ".cluster.local"}, nil
}

// ensureSecret reads the Secret and keeps it when it fits, else generates a
// certificate and stores it. replaced is the CA of a certificate it
// replaced, nil otherwise.
func ensureSecret(ctx context.Context, kube kubernetes.Interface, o Options, hosts []string) (b *Bundle, replaced []byte, err error) {
	logger := klog.FromContext(ctx)
	secrets := kube.CoreV1().Secrets(o.Namespace)
	// Two rounds: another replica may create or replace the Secret between
	// our read and our write; its certificate is then as good as ours.
	for range 2 {
		existing, err := secrets.Get(ctx, o.SecretName, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, nil, fmt.Errorf("reading Secret %s/%s: %w", o.Namespace, o.SecretName, err)
		}
		if err == nil {
			b, problem := usable(existing, hosts, time.Now(), o.validity())
			if problem == "" {
				return b, nil, nil
			}
			logger.Info("Replacing the serving certificate", "secret", o.Namespace+"/"+o.SecretName, "reason", problem)
			fresh, err := generate(hosts, o.validity())
			if err != nil {
				return nil, nil, err
			}
			updated := existing.DeepCopy()
			updated.Type = corev1.SecretTypeTLS
			updated.Data = fresh.data()
			if _, err := secrets.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
				if apierrors.IsConflict(err) {
					continue
				}
				return nil, nil, fmt.Errorf("replacing Secret %s/%s: %w", o.Namespace, o.SecretName, err)
			}
			return fresh, existing.Data[CAKey], nil
		}
		fresh, err := generate(hosts, o.validity())
		if err != nil {
			return nil, nil, err
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:      o.SecretName,
				Namespace: o.Namespace,
				Labels:    map[string]string{"app.kubernetes.io/managed-by": "mci-apiserver"},
			},
			Type: corev1.SecretTypeTLS,
			Data: fresh.data(),
		}
		if _, err := secrets.Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			return nil, nil, fmt.Errorf("creating Secret %s/%s: %w", o.Namespace, o.SecretName, err)
		}
		logger.Info("Created a self-signed serving certificate", "secret", o.Namespace+"/"+o.SecretName, "hosts", hosts)
		return fresh, nil, nil
	}
	return nil, nil, fmt.Errorf("Secret %s/%s kept changing while this server read it; another writer is at work", o.Namespace, o.SecretName)
}

func generate(hosts []string, validity time.Duration) (*Bundle, error) {
	chain, key, err := cert.GenerateSelfSignedCertKeyWithOptions(cert.SelfSignedCertKeyOptions{
		Host:         hosts[0],
		AlternateDNS: hosts[1:],
		// client-go back-dates the certificate by an hour (for clocks
		// behind), and counts MaxAge from there.
		MaxAge: validity + time.Hour,
	})
	if err != nil {
		return nil, fmt.Errorf("generating a serving certificate for %v: %w", hosts, err)
	}
	certs, err := cert.ParseCertsPEM(chain)
	if err != nil || len(certs) != 2 {
		return nil, fmt.Errorf("generated certificate chain for %v is not a certificate and its CA: %v", hosts, err)
	}
	caPEM, err := cert.EncodeCertificates(certs[1])
	if err != nil {
		return nil, err
	}
	return &Bundle{CertPEM: chain, KeyPEM: key, CAPEM: caPEM, NotAfter: certs[0].NotAfter}, nil
}

func (b *Bundle) data() map[string][]byte {
	return map[string][]byte{corev1.TLSCertKey: b.CertPEM, corev1.TLSPrivateKeyKey: b.KeyPEM, CAKey: b.CAPEM}
}

// usable says why the Secret's certificate does not fit ("" when it does):
// it must parse, match its key, be signed by the Secret's CA for every
// host, and stay valid for more than a third of validity.
func usable(s *corev1.Secret, hosts []string, now time.Time, validity time.Duration) (*Bundle, string) {
	b := &Bundle{CertPEM: s.Data[corev1.TLSCertKey], KeyPEM: s.Data[corev1.TLSPrivateKeyKey], CAPEM: s.Data[CAKey]}
	if _, err := tls.X509KeyPair(b.CertPEM, b.KeyPEM); err != nil {
		return nil, fmt.Sprintf("tls.crt and tls.key are not a key pair: %v", err)
	}
	leaf, err := leafOf(b.CertPEM)
	if err != nil {
		return nil, err.Error()
	}
	roots, err := cert.NewPoolFromBytes(b.CAPEM)
	if err != nil {
		return nil, fmt.Sprintf("%s holds no CA certificate: %v", CAKey, err)
	}
	for _, h := range hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return nil, fmt.Sprintf("the certificate does not verify for %s: %v", h, err)
		}
	}
	if left := leaf.NotAfter.Sub(now); left < validity/3 {
		return nil, fmt.Sprintf("the certificate expires at %s, within a third of its validity (%s)", leaf.NotAfter.UTC().Format(time.RFC3339), validity/3)
	}
	b.NotAfter = leaf.NotAfter
	return b, ""
}

func leafOf(chainPEM []byte) (*x509.Certificate, error) {
	certs, err := cert.ParseCertsPEM(chainPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.crt: %w", err)
	}
	if len(certs) == 0 {
		return nil, errors.New("tls.crt holds no certificate")
	}
	return certs[0], nil
}

// trusts says whether a base64 caBundle already contains b's CA, so that a
// restart does not rewrite an APIService that is already right.
func trusts(caBundleB64 string, b *Bundle) bool {
	pem, err := base64.StdEncoding.DecodeString(caBundleB64)
	if err != nil {
		return false
	}
	have, err := cert.ParseCertsPEM(pem)
	if err != nil {
		return false
	}
	want, err := cert.ParseCertsPEM(b.CAPEM)
	if err != nil || len(want) == 0 {
		return false
	}
	for _, c := range have {
		if bytes.Equal(c.Raw, want[0].Raw) {
			return true
		}
	}
	return false
}
