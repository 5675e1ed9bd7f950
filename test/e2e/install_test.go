package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/servingcert"
	"github.com/mci-dev/mci/test/localclusterset"
	"github.com/mci-dev/mci/test/waitfor"
)

const (
	deployRoot         = "../../artifacts/deploy"
	certManagerOverlay = deployRoot + "/mci-apiserver-cert-manager"
	sidecarDeployDir   = deployRoot + "/mci-sidecar"
	eppDeployDir       = deployRoot + "/mci-epp"
	servingCertSecret  = "mci-apiserver-tls"
	servedAs           = localclusterset.MCIAPIServerServiceName + "." + localclusterset.MCIAPIServerNamespace + ".svc"
)

// kustomize builds a kustomization with kubectl, as `kubectl apply -k`
// does before applying.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	require.NoError(t, err, "kubectl kustomize %s: %s", dir, exitStderr(err))
	return decodeManifests(t, out, dir)
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// kubectl runs kubectl against cluster with stdin, returning its output.
func kubectl(t *testing.T, cluster *localclusterset.Cluster, stdin []byte, args ...string) string {
	t.Helper()
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", cluster.Kubeconfig}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

func findObject(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in the kustomization", kind, name)
	return nil
}

// containerEnv is the env of the Deployment's only container, by name.
func containerEnv(t *testing.T, deployment *unstructured.Unstructured) map[string]string {
	t.Helper()
	containers, _, err := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "containers")
	require.NoError(t, err)
	require.Len(t, containers, 1)
	env := map[string]string{}
	list, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "env")
	for _, e := range list {
		m := e.(map[string]any)
		value, _ := m["value"].(string)
		env[m["name"].(string)] = value
	}
	return env
}

// The one-command installs are accepted by a real kube-apiserver: every
// object of mci-sidecar and of mci-apiserver with cert-manager is validated
// and admitted (a server-side dry run: the shared ClusterSet runs its own
// mci-apiserver under the same names). cert-manager's own kinds cannot be
// checked by a server without cert-manager's CRDs, which cannot be fetched
// here; what ties them to the rest is checked instead.
func TestInstallKustomizationsAreAcceptedByARealCluster(t *testing.T) {
	kb, err := clusters.Cluster("cluster-b")
	require.NoError(t, err)

	t.Run("kubectl apply -k artifacts/deploy/mci-sidecar", func(t *testing.T) {
		// The gateway's namespace, which the kustomization creates too: a
		// dry run creates nothing, and the objects in it need it.
		_, err := kubernetes.NewForConfigOrDie(kb.Config).CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mci-gateway"}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
		out := kubectl(t, kb, nil, "apply", "-k", sidecarDeployDir, "--dry-run=server")
		for _, want := range []string{"deployment.apps/inference-gateway", "service/inference-gateway", "configmap/inference-gateway-envoy", "clusterrole.rbac.authorization.k8s.io/mci-sidecar",
			"poddisruptionbudget.policy/inference-gateway", "networkpolicy.networking.k8s.io/inference-gateway"} {
			assert.Contains(t, out, want+" created (server dry run)")
		}
	})

	t.Run("an overlay of artifacts/deploy/mci-epp for a pool of another namespace", func(t *testing.T) {
		// What a user does for their own pool: the kustomization as a base,
		// with the pool's namespace. The ServiceAccount's bindings follow
		// the namespace, and the namespace exists (the pool's).
		ns := "epp-install"
		_, err := kubernetes.NewForConfigOrDie(kb.Config).CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
		base, err := filepath.Abs(eppDeployDir)
		require.NoError(t, err)
		overlay := t.TempDir()
		// kustomize takes bases by relative path only.
		rel, err := filepath.Rel(overlay, base)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(overlay, "kustomization.yaml"),
			[]byte("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: "+ns+"\nresources:\n- "+rel+"\n"), 0o600))
		objs := kustomize(t, overlay)
		for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
			binding := findObject(t, objs, kind, map[string]string{"RoleBinding": "mci-epp", "ClusterRoleBinding": "mci-epp-metrics-auth"}[kind])
			subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
			require.Len(t, subjects, 1)
			assert.Equal(t, ns, subjects[0].(map[string]any)["namespace"], "%s binds the ServiceAccount of the pool's namespace", kind)
		}
		out := kubectl(t, kb, nil, "apply", "-k", overlay, "--dry-run=server")
		for _, want := range []string{"serviceaccount/mci-epp", "role.rbac.authorization.k8s.io/mci-epp", "rolebinding.rbac.authorization.k8s.io/mci-epp",
			"clusterrole.rbac.authorization.k8s.io/mci-epp-metrics-auth", "deployment.apps/mci-epp", "service/epp"} {
			assert.Contains(t, out, want+" created (server dry run)")
		}
	})

	t.Run("the cert-manager overlay lets cert-manager issue the certificate and inject its CA", func(t *testing.T) {
		objs := kustomize(t, certManagerOverlay)
		apiService := findObject(t, objs, "APIService", localclusterset.APIServiceName)
		injectFrom := apiService.GetAnnotations()["cert-manager.io/inject-ca-from"]
		ns, name, ok := strings.Cut(injectFrom, "/")
		require.True(t, ok, "inject-ca-from %q is not namespace/name", injectFrom)
		certificate := findObject(t, objs, "Certificate", name)
		assert.Equal(t, ns, certificate.GetNamespace())
		_, hasCABundle, _ := unstructured.NestedString(apiService.Object, "spec", "caBundle")
		assert.False(t, hasCABundle, "the CA injector writes caBundle")
		skip, _, _ := unstructured.NestedBool(apiService.Object, "spec", "insecureSkipTLSVerify")
		assert.False(t, skip)

		dnsNames, _, _ := unstructured.NestedStringSlice(certificate.Object, "spec", "dnsNames")
		assert.Contains(t, dnsNames, servedAs, "the certificate is valid for the name the aggregator verifies")
		secretName, _, _ := unstructured.NestedString(certificate.Object, "spec", "secretName")

		deployment := findObject(t, objs, "Deployment", "mci-apiserver")
		volumes, _, _ := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "volumes")
		var mounted bool
		for _, v := range volumes {
			if s, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName"); s == secretName {
				mounted = true
			}
		}
		assert.True(t, mounted, "the Deployment mounts the Certificate's Secret %s", secretName)
		env := containerEnv(t, deployment)
		assert.Empty(t, env["MCI_SERVING_CERT_SECRET"], "the server does not make its own certificate")
		assert.Equal(t, "/etc/mci-apiserver/tls/tls.crt", env["MCI_TLS_CERT_FILE"])
		for _, o := range objs {
			assert.NotContains(t, o.GetName(), "serving-cert-writer", "cert-manager writes the Secret, not the server")
			assert.NotContains(t, o.GetName(), "apiservice-ca-writer", "cert-manager writes the caBundle, not the server")
		}

		// The Service is the base's, applied for real by the tests that
		// install the base; here it would merge with the ExternalName
		// Service the shared ClusterSet reaches its own mci-apiserver by.
		var rest []byte
		for _, o := range objs {
			if o.GroupVersionKind().Group == "cert-manager.io" || o.GetKind() == "Service" {
				continue
			}
			data, err := o.MarshalJSON()
			require.NoError(t, err)
			rest = append(append(rest, data...), '\n')
		}
		out := kubectl(t, kb, rest, "apply", "--server-side", "--force-conflicts", "--field-manager=mci-e2e-install", "--dry-run=server", "-f", "-")
		assert.Contains(t, out, "apiservice.apiregistration.k8s.io/"+localclusterset.APIServiceName+" serverside-applied (server dry run)")
		assert.Contains(t, out, "deployment.apps/mci-apiserver serverside-applied (server dry run)")
	})
}

// `kubectl apply -k artifacts/deploy/mci-apiserver` on a cluster of its
// own, applied for real, then mci-apiserver run as the ServiceAccount the
// kustomization creates, with the Deployment's --serving-cert-secret: the
// server makes its certificate, writes the CA into the APIService, and the
// aggregator, verifying it with that caBundle, reports the APIService
// Available. No image is pulled and no pod runs: the server runs on this
// machine, reached through an ExternalName Service as in the local
// ClusterSet (the test plays kube-proxy's part, nothing else).
func TestInstallInOneCommandWithASelfContainedServingCertificate(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"install"}, Log: testWriter{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	c, err := cs.Cluster("install")
	require.NoError(t, err)
	kube := kubernetes.NewForConfigOrDie(c.Config)
	dyn := dynamic.NewForConfigOrDie(c.Config)

	out := kubectl(t, c, nil, "apply", "-k", deployDir)
	t.Logf("kubectl apply -k %s:\n%s", deployDir, out)
	assert.Contains(t, out, "apiservice.apiregistration.k8s.io/"+localclusterset.APIServiceName+" created")
	assert.Contains(t, out, "deployment.apps/mci-apiserver created")

	objs := kustomize(t, deployDir)
	env := containerEnv(t, findObject(t, objs, "Deployment", "mci-apiserver"))
	secretName := env["MCI_SERVING_CERT_SECRET"]
	require.Equal(t, servingCertSecret, secretName, "the Deployment serves the certificate it keeps in a Secret")

	port := freeLoopbackPort(t)
	pointServiceAtLoopback(t, ctx, kube, dyn, port)
	kubeconfig := serviceAccountKubeconfig(t, ctx, kube, c, localclusterset.MCIAPIServerNamespace, "mci-apiserver")
	startMCIAPIServerAsDeployed(t, port,
		"--cluster-name=install",
		"--clusterset-name=install",
		"--kubeconfig="+kubeconfig,
		"--namespace="+localclusterset.MCIAPIServerNamespace,
		"--serving-cert-secret="+secretName,
	)

	t.Run("the aggregator verifies the server with the caBundle the server wrote", func(t *testing.T) {
		mci := mciclient.NewForConfigOrDie(c.Config)
		// Available is written by the aggregator's availability
		// controller; its proxy learns of it from its own APIService
		// informer and answers 503 "service unavailable" until then, so
		// the List is retried after the condition turns True (the same
		// lag test/localclusterset's apiServiceAvailable waits out).
		waitfor.Eventually(t, ctx, 2*time.Minute, func(ctx context.Context) (bool, string) {
			as, err := dyn.Resource(servingcert.APIServiceGVR).Get(ctx, localclusterset.APIServiceName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if ok, why := apiServiceAvailable(as); !ok {
				return false, why
			}
			if _, err := mci.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err != nil {
				return false, "imports through the aggregator: " + err.Error()
			}
			return true, ""
		})
	})

	secret, err := kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Get(ctx, secretName, metav1.GetOptions{})
	require.NoError(t, err)
	apiService, err := dyn.Resource(servingcert.APIServiceGVR).Get(ctx, localclusterset.APIServiceName, metav1.GetOptions{})
	require.NoError(t, err)

	t.Run("the caBundle verifies the certificate in the Secret, without insecureSkipTLSVerify", func(t *testing.T) {
		assert.Equal(t, corev1.SecretTypeTLS, secret.Type)
		caB64, _, _ := unstructured.NestedString(apiService.Object, "spec", "caBundle")
		caPEM, err := base64.StdEncoding.DecodeString(caB64)
		require.NoError(t, err)
		roots, err := cert.NewPoolFromBytes(caPEM)
		require.NoError(t, err)
		chain, err := cert.ParseCertsPEM(secret.Data[corev1.TLSCertKey])
		require.NoError(t, err)
		_, err = chain[0].Verify(x509.VerifyOptions{DNSName: servedAs, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		assert.NoError(t, err)
		skip, _, _ := unstructured.NestedBool(apiService.Object, "spec", "insecureSkipTLSVerify")
		assert.False(t, skip)
	})

	t.Run("the server exports when its certificate ends", func(t *testing.T) {
		chain, err := cert.ParseCertsPEM(secret.Data[corev1.TLSCertKey])
		require.NoError(t, err)
		caB64, _, _ := unstructured.NestedString(apiService.Object, "spec", "caBundle")
		caPEM, err := base64.StdEncoding.DecodeString(caB64)
		require.NoError(t, err)
		// The cluster's admin, straight to the server (as a Prometheus
		// with a token would scrape it), verified with the caBundle.
		direct := rest.CopyConfig(c.Config)
		direct.Host = fmt.Sprintf("https://127.0.0.1:%d", port)
		direct.TLSClientConfig.CAFile, direct.TLSClientConfig.CAData = "", caPEM
		direct.TLSClientConfig.ServerName = servedAs
		client, err := kubernetes.NewForConfig(direct)
		require.NoError(t, err)
		page, err := client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		require.NoError(t, err)
		got := seriesValue(t, page, "mci_apiserver_serving_certificate_expiry_timestamp_seconds")
		assert.Equal(t, float64(chain[0].NotAfter.Unix()), got, "the gauge is the end of the Secret's certificate (0: not exported)")
	})

	t.Run("a restarted server keeps the certificate and the caBundle", func(t *testing.T) {
		b, err := servingcert.Ensure(ctx, kube, dyn, servingcert.Options{
			Namespace: localclusterset.MCIAPIServerNamespace, SecretName: secretName,
			APIService: localclusterset.APIServiceName, APIServiceWait: time.Second,
		})
		require.NoError(t, err)
		assert.Equal(t, secret.Data[corev1.TLSCertKey], b.CertPEM)
		again, err := kube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace).Get(ctx, secretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, secret.ResourceVersion, again.ResourceVersion, "the Secret is not rewritten")
		as, err := dyn.Resource(servingcert.APIServiceGVR).Get(ctx, localclusterset.APIServiceName, metav1.GetOptions{})
		require.NoError(t, err)
		before, _, _ := unstructured.NestedString(apiService.Object, "spec", "caBundle")
		after, _, _ := unstructured.NestedString(as.Object, "spec", "caBundle")
		assert.Equal(t, before, after)
	})
}

// apiServiceAvailable reads the APIService's Available condition, with
// the aggregator's reason and message when it is not True.
func apiServiceAvailable(apiService *unstructured.Unstructured) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(apiService.Object, "status", "conditions")
	for _, cond := range conds {
		m, _ := cond.(map[string]any)
		if m["type"] == "Available" {
			return m["status"] == "True", fmt.Sprintf("Available=%v %v: %v", m["status"], m["reason"], m["message"])
		}
	}
	return false, "no Available condition"
}

// freeLoopbackPort is a port the server binds later: outside the
// ephemeral range, as the harness chooses its servers' (FreePorts).
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ports, err := localclusterset.FreePorts(1)
	require.NoError(t, err)
	return ports[0]
}

// pointServiceAtLoopback turns the kustomization's ClusterIP Service into
// an ExternalName Service for localhost, and the APIService's port into
// the server's: what makes the aggregator reach a process on this machine
// (see test/localclusterset/apiservice.go), while TLS is still verified for
// mci-apiserver.mci-system.svc.
func pointServiceAtLoopback(t *testing.T, ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, port int) {
	t.Helper()
	services := kube.CoreV1().Services(localclusterset.MCIAPIServerNamespace)
	svc, err := services.Get(ctx, localclusterset.MCIAPIServerServiceName, metav1.GetOptions{})
	require.NoError(t, err)
	svc.Spec = corev1.ServiceSpec{
		Type:         corev1.ServiceTypeExternalName,
		ExternalName: "localhost",
		Ports:        []corev1.ServicePort{{Name: "https", Protocol: corev1.ProtocolTCP, Port: int32(port), TargetPort: intstr.FromInt32(int32(port))}},
	}
	_, err = services.Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	patch := fmt.Sprintf(`{"spec":{"service":{"port":%d}}}`, port)
	_, err = dyn.Resource(servingcert.APIServiceGVR).Patch(ctx, localclusterset.APIServiceName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	require.NoError(t, err)
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as the
// ServiceAccount namespace/name with a bound token, as a pod running as it
// would: only the RBAC the kustomization grants applies.
func serviceAccountKubeconfig(t *testing.T, ctx context.Context, kube kubernetes.Interface, c *localclusterset.Cluster, namespace, name string) string {
	t.Helper()
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: c.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: name}
	cfg.CurrentContext = c.Name
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// startMCIAPIServerAsDeployed runs mci-apiserver on port with args, its
// log in the test's output when the test fails.
func startMCIAPIServerAsDeployed(t *testing.T, port int, args ...string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "mci-apiserver.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	args = append(args, fmt.Sprintf("--secure-port=%d", port), "--bind-address=127.0.0.1", "-v=2")
	cmd := exec.Command(binary(t, "mci-apiserver"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("mci-apiserver log:\n%s", data)
		}
	})
}
