package localclusterset

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// testLog sends progress lines to the test log, so a slow or failed start
// shows how far it got.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// requireBinaries fails, rather than skips, without the kube tools:
// a skipped harness test would hide that no e2e test can run.
func requireBinaries(t *testing.T) {
	t.Helper()
	root, err := repoRoot()
	require.NoError(t, err)
	for _, b := range kubeTools {
		_, err := os.Stat(filepath.Join(root, "_output", "bin", b))
		require.NoError(t, err, "%s is missing: run hack/build-kube-tools.sh (the first build takes several minutes)", b)
	}
}

// buildFakeMCIAPIServer builds testdata/fake-mci-apiserver, a stand-in
// that accepts the harness's flag contract and serves discovery.
func buildFakeMCIAPIServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fake-mci-apiserver")
	out, err := exec.Command("go", "build", "-o", bin, "./testdata/fake-mci-apiserver").CombinedOutput()
	require.NoError(t, err, "building the fake mci-apiserver: %s", out)
	return bin
}

// whoami is what the fake mci-apiserver saw of a request the aggregator
// proxied to it.
type whoami struct {
	Server   string   `json:"server"`
	User     string   `json:"user"`
	Groups   []string `json:"groups"`
	ClientCN string   `json:"clientCN"`
}

func getWhoami(ctx context.Context, kube kubernetes.Interface) (whoami, error) {
	var w whoami
	body, err := kube.Discovery().RESTClient().Get().AbsPath("/apis", MCIGroup, MCIVersion, "whoami").DoRaw(ctx)
	if err != nil {
		return w, err
	}
	return w, json.Unmarshal(body, &w)
}

func requireAllGone(t *testing.T, infos []ProcessInfo) {
	t.Helper()
	require.NotEmpty(t, infos)
	for _, p := range infos {
		// A detached server this test started is reaped by a goroutine of
		// the package an instant after it dies.
		assert.Eventually(t, func() bool { return syscall.Kill(p.PID, 0) == syscall.ESRCH }, 5*time.Second, 50*time.Millisecond,
			"%s (pid %d) is still running", p.Name, p.PID)
	}
}

var (
	inferencePoolsGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	gatewaysGVR       = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
)

func TestUpRunsMemberClustersThatAcceptWhatTestsWrite(t *testing.T) {
	requireBinaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	start := time.Now()
	cs, err := Up(ctx, Options{Dir: t.TempDir(), Clusters: []string{"cluster-a", "cluster-b"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Logf("Up took %s", time.Since(start).Round(100*time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			assert.NoError(t, cs.Stop())
		}
	})
	require.Equal(t, []string{"cluster-a", "cluster-b"}, cs.Names())

	for _, c := range cs.Clusters {
		kube, err := kubernetes.NewForConfig(c.Config)
		require.NoError(t, err)
		dyn, err := dynamic.NewForConfig(c.Config)
		require.NoError(t, err)

		t.Run(c.Name+" answers with its kubeconfig", func(t *testing.T) {
			cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
			require.NoError(t, err)
			assert.Equal(t, c.Server, cfg.Host)
			fromFile, err := kubernetes.NewForConfig(cfg)
			require.NoError(t, err)
			v, err := fromFile.Discovery().ServerVersion()
			require.NoError(t, err)
			assert.Equal(t, builtKubeVersion(t), v.GitVersion)
		})

		t.Run(c.Name+" serves InferencePool and Gateway Established", func(t *testing.T) {
			for _, name := range []string{"inferencepools.inference.networking.k8s.io", "inferencemodels.inference.networking.x-k8s.io",
				"inferenceobjectives.inference.networking.x-k8s.io", "inferencemodelrewrites.inference.networking.x-k8s.io",
				"inferenceobjectives.llm-d.ai", "inferencemodelrewrites.llm-d.ai",
				"gateways.gateway.networking.k8s.io", "httproutes.gateway.networking.k8s.io"} {
				crd, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
				require.NoError(t, err)
				established, msg := condition(crd, "Established")
				assert.True(t, established, "%s: %s", name, msg)
			}
			_, err := dyn.Resource(inferencePoolsGVR).Namespace("default").List(ctx, metav1.ListOptions{})
			assert.NoError(t, err)
			_, err = dyn.Resource(gatewaysGVR).Namespace("default").List(ctx, metav1.ListOptions{})
			assert.NoError(t, err)
		})

		t.Run(c.Name+" accepts a loopback pod IP written as status", func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "model-server", Namespace: "default"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
			}
			pod, err := kube.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
			require.NoError(t, err)
			pod.Status = corev1.PodStatus{
				Phase:      corev1.PodRunning,
				PodIP:      "127.0.1.1",
				PodIPs:     []corev1.PodIP{{IP: "127.0.1.1"}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			}
			_, err = kube.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
			require.NoError(t, err)
			got, err := kube.CoreV1().Pods("default").Get(ctx, "model-server", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, "127.0.1.1", got.Status.PodIP)
		})

		t.Run(c.Name+" accepts a loopback LoadBalancer ingress written as status", func(t *testing.T) {
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "epp", Namespace: "default"},
				Spec: corev1.ServiceSpec{
					Type:  corev1.ServiceTypeLoadBalancer,
					Ports: []corev1.ServicePort{{Name: "grpc-ext-proc", Port: 9002}},
				},
			}
			svc, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.True(t, strings.HasPrefix(svc.Spec.ClusterIP, "10.96."), "cluster IP %s", svc.Spec.ClusterIP)
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "127.0.0.2"}}
			_, err = kube.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{})
			require.NoError(t, err)
			got, err := kube.CoreV1().Services("default").Get(ctx, "epp", metav1.GetOptions{})
			require.NoError(t, err)
			require.Len(t, got.Status.LoadBalancer.Ingress, 1)
			assert.Equal(t, "127.0.0.2", got.Status.LoadBalancer.Ingress[0].IP)
		})

		t.Run(c.Name+" runs the controllers of a kube-controller-manager", func(t *testing.T) {
			const ns = "controllers"
			_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.Eventually(t, func() bool {
				_, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
				return err == nil
			}, time.Minute, 100*time.Millisecond, "the serviceaccount controller creates the default ServiceAccount")
			assert.Eventually(t, func() bool {
				cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
				return err == nil && cm.Data["ca.crt"] == string(cs.pki.servingCA.certPEM)
			}, time.Minute, 100*time.Millisecond, "the root CA publisher publishes the serving CA")

			owner, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
			require.NoError(t, err)
			_, err = kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name:            "dependent",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}},
			}}, metav1.CreateOptions{})
			require.NoError(t, err)
			require.NoError(t, kube.CoreV1().ConfigMaps(ns).Delete(ctx, owner.Name, metav1.DeleteOptions{}))
			assert.Eventually(t, func() bool {
				_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "dependent", metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			}, time.Minute, 100*time.Millisecond, "the garbage collector deletes the dependent of a deleted owner")

			require.NoError(t, kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}))
			assert.Eventually(t, func() bool {
				_, err := kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			}, time.Minute, 100*time.Millisecond, "the namespace controller empties and removes a deleted namespace")
		})

		t.Run(c.Name+" forbids a minted user what RBAC does not grant", func(t *testing.T) {
			cfg, err := cs.UserConfig(c.Name, "alice", "team-a")
			require.NoError(t, err)
			alice, err := kubernetes.NewForConfig(cfg)
			require.NoError(t, err)
			_, err = alice.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
			assert.True(t, apierrors.IsForbidden(err), "want 403, got %v", err)
			assert.ErrorContains(t, err, `User "alice"`)
		})

		t.Run(c.Name+" lets the member identity read exactly what imports need", func(t *testing.T) {
			cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(cs.MembersDir(), c.Name+".kubeconfig"))
			require.NoError(t, err)
			member, err := dynamic.NewForConfig(cfg)
			require.NoError(t, err)
			_, err = member.Resource(inferencePoolsGVR).List(ctx, metav1.ListOptions{})
			assert.NoError(t, err)
			_, err = member.Resource(gatewaysGVR).List(ctx, metav1.ListOptions{})
			assert.NoError(t, err)
			_, err = member.Resource(corev1.SchemeGroupVersion.WithResource("secrets")).List(ctx, metav1.ListOptions{})
			assert.True(t, apierrors.IsForbidden(err), "want 403, got %v", err)
		})
	}

	t.Run("Apply writes objects and then their status, as controllers would", func(t *testing.T) {
		manifest := filepath.Join(t.TempDir(), "objects.yaml")
		require.NoError(t, os.WriteFile(manifest, []byte(applyManifest), 0o644))
		for range 2 { // applying again changes nothing and does not fail
			applied, err := cs.ApplyFiles(ctx, "cluster-a", manifest)
			require.NoError(t, err)
			assert.Equal(t, []string{
				"namespaces/apply-test",
				"services/apply-test/epp (with status)",
				"endpointslices.discovery.k8s.io/apply-test/epp-1",
				"gateways.gateway.networking.k8s.io/apply-test/inf-gw (with status)",
			}, applied)
		}
		a, err := cs.Cluster("cluster-a")
		require.NoError(t, err)
		kube, err := kubernetes.NewForConfig(a.Config)
		require.NoError(t, err)
		svc, err := kube.CoreV1().Services("apply-test").Get(ctx, "epp", metav1.GetOptions{})
		require.NoError(t, err)
		require.Len(t, svc.Status.LoadBalancer.Ingress, 1)
		assert.Equal(t, "127.0.0.2", svc.Status.LoadBalancer.Ingress[0].IP)
		dyn, err := dynamic.NewForConfig(a.Config)
		require.NoError(t, err)
		gw, err := dyn.Resource(gatewaysGVR).Namespace("apply-test").Get(ctx, "inf-gw", metav1.GetOptions{})
		require.NoError(t, err)
		programmed, msg := condition(gw, "Programmed")
		assert.True(t, programmed, msg)
	})

	t.Run("a stopped kube-apiserver comes back on its port with its data", func(t *testing.T) {
		b, err := cs.Cluster("cluster-b")
		require.NoError(t, err)
		kube, err := kubernetes.NewForConfig(b.Config)
		require.NoError(t, err)
		require.NoError(t, cs.StopAPIServer("cluster-b"))
		_, err = kube.Discovery().ServerVersion()
		require.Error(t, err, "cluster-b still answers after StopAPIServer")

		a, err := cs.Cluster("cluster-a")
		require.NoError(t, err)
		kubeA, err := kubernetes.NewForConfig(a.Config)
		require.NoError(t, err)
		_, err = kubeA.Discovery().ServerVersion()
		require.NoError(t, err, "cluster-a must not notice cluster-b going down")

		require.NoError(t, cs.StartAPIServer(ctx, "cluster-b"))
		got, err := kube.CoreV1().Pods("default").Get(ctx, "model-server", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "127.0.1.1", got.Status.PodIP)
	})

	infos := cs.Processes()
	require.Len(t, infos, 5, "etcd, two kube-apiservers, two kube-controller-managers")
	for _, p := range infos {
		require.True(t, p.Alive, "%s", p.Name)
	}
	stopped = true
	require.NoError(t, cs.Stop())
	requireAllGone(t, infos)
}

func TestUpRegistersMCIAPIServerWithEveryAggregator(t *testing.T) {
	requireBinaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	fake := buildFakeMCIAPIServer(t)

	start := time.Now()
	cs, err := Up(ctx, Options{Dir: t.TempDir(), Clusters: []string{"cluster-a", "cluster-b"}, MCIAPIServerBinary: fake, Log: testLog{t}})
	require.NoError(t, err)
	t.Logf("Up took %s", time.Since(start).Round(100*time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			assert.NoError(t, cs.Stop())
		}
	})

	for _, c := range cs.Clusters {
		t.Run(c.Name+" proxies the API to its mci-apiserver as the caller, through the front proxy", func(t *testing.T) {
			assert.NotZero(t, c.MCIAPIServerPort)
			kube, err := kubernetes.NewForConfig(c.Config)
			require.NoError(t, err)
			w, err := getWhoami(ctx, kube)
			require.NoError(t, err)
			assert.Equal(t, "fake-mci-apiserver", w.Server)
			assert.Equal(t, "mci-local-admin", w.User)
			assert.Contains(t, w.Groups, "system:masters")
			assert.Equal(t, frontProxyClientName, w.ClientCN)

			res, err := kube.Discovery().ServerResourcesForGroupVersion(MCIGroup + "/" + MCIVersion)
			require.NoError(t, err)
			require.Len(t, res.APIResources, 1)
			assert.Equal(t, "inferencepoolimports", res.APIResources[0].Name)
		})
		t.Run(c.Name+" authorizes a user before proxying", func(t *testing.T) {
			cfg, err := cs.UserConfig(c.Name, "alice")
			require.NoError(t, err)
			alice, err := kubernetes.NewForConfig(cfg)
			require.NoError(t, err)
			_, err = getWhoami(ctx, alice)
			assert.True(t, apierrors.IsForbidden(err), "want 403, got %v", err)
		})
	}

	t.Run("a stopped mci-apiserver is unreachable until started again", func(t *testing.T) {
		a, err := cs.Cluster("cluster-a")
		require.NoError(t, err)
		kube, err := kubernetes.NewForConfig(a.Config)
		require.NoError(t, err)
		require.NoError(t, cs.StopMCIAPIServer("cluster-a"))
		_, err = getWhoami(ctx, kube)
		assert.True(t, apierrors.IsServiceUnavailable(err), "want 503, got %v", err)
		require.NoError(t, cs.StartMCIAPIServer(ctx, "cluster-a"))
		_, err = getWhoami(ctx, kube)
		assert.NoError(t, err)
	})

	t.Run("an mci-apiserver run by the test itself can take over the APIService", func(t *testing.T) {
		require.NoError(t, cs.StopMCIAPIServer("cluster-b"))
		certFile, keyFile := cs.MCIServingCertFiles()
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		require.NoError(t, err)
		l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
		require.NoError(t, err)
		mux := http.NewServeMux()
		mux.HandleFunc("/apis/"+MCIGroup+"/"+MCIVersion, func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"` + MCIGroup + "/" + MCIVersion + `","resources":[]}`))
		})
		mux.HandleFunc("/apis/"+MCIGroup+"/"+MCIVersion+"/whoami", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"server":"in-process","user":"` + r.Header.Get("X-Remote-User") + `"}`))
		})
		server := &http.Server{Handler: mux}
		go func() { _ = server.Serve(l) }()
		t.Cleanup(func() { _ = server.Close() })

		require.NoError(t, cs.RegisterMCIAPIServer(ctx, "cluster-b", l.Addr().(*net.TCPAddr).Port))
		b, err := cs.Cluster("cluster-b")
		require.NoError(t, err)
		kube, err := kubernetes.NewForConfig(b.Config)
		require.NoError(t, err)
		w, err := getWhoami(ctx, kube)
		require.NoError(t, err)
		assert.Equal(t, whoami{Server: "in-process", User: "mci-local-admin"}, w)
	})

	infos := cs.Processes()
	require.Len(t, infos, 7, "etcd, two kube-apiservers, two kube-controller-managers, two mci-apiservers")
	stopped = true
	require.NoError(t, cs.Stop())
	requireAllGone(t, infos)
}

func TestDetachedUpIsReusedAndDownStopsIt(t *testing.T) {
	requireBinaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	fake := buildFakeMCIAPIServer(t)
	opts := Options{Dir: dir, Clusters: []string{"solo"}, MCIAPIServerBinary: fake, Detached: true, Log: testLog{t}}

	cs, err := Up(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = Down(dir) })
	infos := cs.Processes()
	require.FileExists(t, filepath.Join(dir, stateFile))

	again, err := Up(ctx, opts)
	require.NoError(t, err)
	assert.Equal(t, infos, again.Processes(), "a healthy detached ClusterSet is reused, not restarted")

	loaded, err := Load(dir)
	require.NoError(t, err)
	require.NoError(t, loaded.Healthy(ctx))
	_, err = loaded.UserConfig("solo", "bob")
	require.NoError(t, err)

	_, err = Up(ctx, Options{Dir: dir, Clusters: []string{"solo"}, Log: testLog{t}})
	assert.ErrorContains(t, err, "detached ClusterSet runs", "an attached Up must not start over a detached one")

	// `make run` after a rebuild of mci-apiserver runs the new binary.
	later := time.Now().Add(time.Minute)
	require.NoError(t, os.Chtimes(fake, later, later))
	rebuilt, err := Up(ctx, opts)
	require.NoError(t, err)
	after := rebuilt.Processes()
	require.Len(t, after, 4, "etcd, kube-apiserver, kube-controller-manager, mci-apiserver")
	for i, p := range after {
		if strings.HasSuffix(p.Name, "mci-apiserver") {
			assert.NotEqual(t, infos[i].PID, p.PID, "%s was not restarted", p.Name)
		} else {
			assert.Equal(t, infos[i].PID, p.PID, "%s was restarted", p.Name)
		}
	}

	require.NoError(t, Down(dir))
	assert.NoFileExists(t, filepath.Join(dir, stateFile))
	requireAllGone(t, append(infos, after...))
	require.NoError(t, Down(dir), "Down with nothing running")
}

// applyManifest is what a test of imports writes: a Service with the
// address a LoadBalancer controller would set, an EndpointSlice with a
// documentation-range address (loopback is refused there), a Gateway
// programmed by a controller that does not run.
const applyManifest = `
apiVersion: v1
kind: Service
metadata:
  name: epp
  namespace: apply-test
spec:
  type: LoadBalancer
  ports:
  - name: ext-proc
    port: 9002
status:
  loadBalancer:
    ingress:
    - ip: 127.0.0.2
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: epp-1
  namespace: apply-test
  labels:
    kubernetes.io/service-name: epp
addressType: IPv4
endpoints:
- addresses: ["192.0.2.10"]
  conditions:
    ready: true
---
apiVersion: v1
kind: Namespace
metadata:
  name: apply-test
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: inf-gw
  namespace: apply-test
spec:
  gatewayClassName: example
  listeners:
  - name: http
    protocol: HTTP
    port: 80
status:
  addresses:
  - type: IPAddress
    value: 127.0.0.3
  conditions:
  - type: Programmed
    status: "True"
    reason: Programmed
    message: Programmed by a controller that does not run
    lastTransitionTime: "2026-01-01T00:00:00Z"
`

// The member identity of the local ClusterSet has exactly the permissions
// the deployment manifests give members, so that e2e tests catch a server
// that needs more than a real installation grants.
func TestMemberReaderRulesMatchTheDeploymentManifest(t *testing.T) {
	root, err := repoRoot()
	require.NoError(t, err)
	objs, err := readObjects([]string{filepath.Join(root, "artifacts", "deploy", "mci-apiserver", "25-member-reader.yaml")})
	require.NoError(t, err)
	want := map[string][]rbacv1.PolicyRule{memberReaderUser: memberReaderRules, memberSummaryReader: memberSummaryReaderRules}
	found := map[string]bool{}
	for _, o := range objs {
		rules, ok := want[o.GetName()]
		if o.GetKind() != "ClusterRole" || !ok {
			continue
		}
		var role rbacv1.ClusterRole
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role))
		assert.Equal(t, rules, role.Rules, "ClusterRole %s", o.GetName())
		found[o.GetName()] = true
	}
	for name := range want {
		require.True(t, found[name], "no ClusterRole %s in the manifest", name)
	}
}

// The rules the deployment gives mci-apiserver in its own cluster for import
// parents are exactly LocalRouteReaderRules: read HTTPRoutes and
// ReferenceGrants, nothing more.
func TestLocalRouteReaderRulesMatchTheDeploymentManifest(t *testing.T) {
	root, err := repoRoot()
	require.NoError(t, err)
	objs, err := readObjects([]string{filepath.Join(root, "artifacts", "deploy", "mci-apiserver", "20-rbac.yaml")})
	require.NoError(t, err)
	var found bool
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" || o.GetName() != "mci-apiserver:local-route-reader" {
			continue
		}
		var role rbacv1.ClusterRole
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role))
		assert.Equal(t, LocalRouteReaderRules, role.Rules)
		found = true
	}
	require.True(t, found, "no ClusterRole mci-apiserver:local-route-reader in the manifest")
}

// The rules the deployment gives mci-apiserver for the Exported status are
// exactly ExportedStatusWriterRules (a ClusterRole) and
// ExportedStatusElectionRules (a Role in its namespace).
func TestExportedStatusRulesMatchTheDeploymentManifest(t *testing.T) {
	root, err := repoRoot()
	require.NoError(t, err)
	objs, err := readObjects([]string{filepath.Join(root, "artifacts", "deploy", "mci-apiserver", "20-rbac.yaml")})
	require.NoError(t, err)
	want := map[string][]rbacv1.PolicyRule{
		"ClusterRole/mci-apiserver:exported-status-writer": ExportedStatusWriterRules,
		"Role/mci-apiserver:exported-status-election":      ExportedStatusElectionRules,
	}
	found := map[string]bool{}
	for _, o := range objs {
		key := o.GetKind() + "/" + o.GetName()
		rules, ok := want[key]
		if !ok {
			continue
		}
		var role rbacv1.ClusterRole // a Role has the same rules field
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(map[string]any{"rules": o.Object["rules"]}, &role))
		assert.Equal(t, rules, role.Rules, key)
		found[key] = true
	}
	for key := range want {
		assert.True(t, found[key], "no %s in the manifest", key)
	}
}

// builtKubeVersion is the version of the kube-apiserver in BinDir, as
// hack/build-kube-tools.sh recorded it in the stamp beside the binary:
// make test runs the newest pinned version, make test-compat the oldest
// the chart claims, from another bin dir.
func builtKubeVersion(t *testing.T) string {
	t.Helper()
	dir, err := BinDir()
	require.NoError(t, err)
	stamps, err := filepath.Glob(filepath.Join(dir, ".kube-apiserver-v*"))
	require.NoError(t, err)
	require.Len(t, stamps, 1, "one kube-apiserver version stamp in %s (hack/build-kube-tools.sh writes it)", dir)
	return strings.TrimPrefix(filepath.Base(stamps[0]), ".kube-apiserver-")
}
