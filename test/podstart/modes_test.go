package podstart

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
)

// poolNamespace and poolName are the pool memberCluster exports and the
// pool of the chart's cluster that mci-epp serves.
const (
	poolNamespace = "example"
	poolName      = "llm"
)

// memberSecret makes memberCluster a member of the chart's cluster through
// the Secret the chart renders from membership.secrets (its kubeconfig, a
// read-only identity of memberCluster with its credentials inline, is the
// ClusterSet's), exports a pool from memberCluster, and gives the chart's
// cluster the pool's namespace and a pool of its own for mci-epp.
func memberSecret(t *testing.T, ctx context.Context, f *fixture) []string {
	t.Helper()
	memberSecretless(t, ctx, f)
	return []string{"--set-file", "membership.secrets[0].kubeconfig=" + filepath.Join(f.cs.MembersDir(), memberCluster+".kubeconfig")}
}

// memberSecretless exports a pool from memberCluster and gives the
// chart's cluster the pool's namespace and a pool of its own for mci-epp;
// membership is the caller's.
func memberSecretless(t *testing.T, ctx context.Context, f *fixture) []string {
	t.Helper()
	member, err := f.cs.Cluster(memberCluster)
	require.NoError(t, err)
	for _, c := range []*kubernetesCluster{{f.cluster.Name, f.kube}, {member.Name, kubernetes.NewForConfigOrDie(member.Config)}} {
		_, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: poolNamespace}}, metav1.CreateOptions{})
		require.NoError(t, err, "namespace %s in %s", poolNamespace, c.name)
	}
	exported := pool(true)
	_, err = mciclient.NewForConfigOrDie(member.Config).InferencePoolV1().InferencePools(poolNamespace).Create(ctx, exported, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = mciclient.NewForConfigOrDie(f.cluster.Config).InferencePoolV1().InferencePools(poolNamespace).Create(ctx, pool(false), metav1.CreateOptions{})
	require.NoError(t, err)
	return nil
}

type kubernetesCluster struct {
	name string
	kube kubernetes.Interface
}

// pool is the InferencePool poolNamespace/poolName, exported or not.
func pool(exported bool) *poolv1.InferencePool {
	p := &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: poolName, Namespace: poolNamespace},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": poolName}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}
	if exported {
		p.Annotations = map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}
	}
	return p
}

// requireImportServed reads, through the chart's APIService, the import
// of the pool memberCluster exports: served by the started mci-apiservers
// from what they read of memberCluster with the member Secret's
// credentials.
func requireImportServed(t *testing.T, ctx context.Context, f *fixture) {
	t.Helper()
	imports := mciclient.NewForConfigOrDie(f.cluster.Config).InferenceV1alpha1().InferencePoolImports(poolNamespace)
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		imp, err := imports.Get(ctx, poolName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			last = "not served yet"
			return false, nil
		case err != nil:
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("%+v", imp.Status.Clusters)
		return len(imp.Status.Clusters) == 1 && imp.Status.Clusters[0].Name == memberCluster, nil
	})
	require.NoError(t, err, "%s imports %s/%s from %s through the chart's APIService; last: %s", f.cluster.Name, poolNamespace, poolName, memberCluster, last)
	t.Logf("InferencePoolImport %s/%s served through the chart's APIService, from %s", poolNamespace, poolName, memberCluster)
}

var (
	certificateGVK = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"}
	apiServiceGVR  = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
)

// certManager does what cert-manager and its CA injector would, which
// cannot run here: for every Certificate the chart renders that is not a
// CA, the Secret its CA Issuer would write (tls.crt and tls.key for its
// dnsNames, ca.crt, signed by a CA generated here), and the caBundle of
// each APIService whose cert-manager.io/inject-ca-from annotation names
// it.
func certManager(t *testing.T, ctx context.Context, f *fixture, objs []*unstructured.Unstructured) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mci-apiserver-ca"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, caKey.Public(), caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	issued := map[types.NamespacedName][]byte{}
	for i, o := range objs {
		if o.GroupVersionKind() != certificateGVK {
			continue
		}
		if isCA, _, _ := unstructured.NestedBool(o.Object, "spec", "isCA"); isCA {
			continue
		}
		secretName, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
		dnsNames, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "dnsNames")
		require.NotEmpty(t, dnsNames, "Certificate %s names no dnsNames", o.GetName())
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{},
			DNSNames: dnsNames, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}, ca, key.Public(), caKey)
		require.NoError(t, err)
		keyDER, err := x509.MarshalECPrivateKey(key)
		require.NoError(t, err)
		_, err = f.kube.CoreV1().Secrets(o.GetNamespace()).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: o.GetNamespace(), Annotations: map[string]string{"cert-manager.io/certificate-name": o.GetName()}},
			Type:       corev1.SecretTypeTLS,
			Data: map[string][]byte{
				"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
				"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
				"ca.crt":  caPEM,
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err, "the Secret of Certificate %s", o.GetName())
		issued[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}] = caPEM
		t.Logf("Certificate %s/%s: Secret %s issued for %s by a CA of the test, as cert-manager's CA Issuer would", o.GetNamespace(), o.GetName(), secretName, strings.Join(dnsNames, ", "))
	}
	require.NotEmpty(t, issued, "the chart renders no serving Certificate")

	apiServices := dynamic.NewForConfigOrDie(f.cluster.Config).Resource(apiServiceGVR)
	var injected int
	for _, o := range objs {
		from := o.GetAnnotations()["cert-manager.io/inject-ca-from"]
		if o.GetKind() != "APIService" || from == "" {
			continue
		}
		ns, name, _ := strings.Cut(from, "/")
		bundle, ok := issued[types.NamespacedName{Namespace: ns, Name: name}]
		require.True(t, ok, "APIService %s injects the CA of Certificate %s, which the chart does not render", o.GetName(), from)
		patch := fmt.Sprintf(`{"spec":{"caBundle":%q}}`, base64.StdEncoding.EncodeToString(bundle))
		_, err := apiServices.Patch(ctx, o.GetName(), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)
		injected++
	}
	require.NotZero(t, injected, "no APIService of the chart asks for cert-manager's CA injection")
}
