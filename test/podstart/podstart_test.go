package podstart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"

	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/localclusterset"
)

const (
	chartDir = "../../charts/mci"
	// releaseNamespace is where the chart is installed (helm install
	// --namespace mci-system --create-namespace).
	releaseNamespace = "mci-system"
	// chartCluster is the cluster the chart is installed in; memberCluster
	// exports pools to it in the modes with members.
	chartCluster  = "cluster-b"
	memberCluster = "cluster-a"
)

// testEnv is what make test-pods-start passes.
type testEnv struct {
	binDir, imagesDir, imageVersion string
}

func requireEnv(t *testing.T) testEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a local ClusterSet and the chart's pods: not a unit test")
	}
	// Not a skip: a run that cannot chroot would pass without starting
	// anything.
	require.Zero(t, os.Geteuid(), "the pods-start test must run as root: it chroots each container into its image's file system and runs it as the user the chart sets (id -u is %d)", os.Geteuid())
	env := testEnv{binDir: os.Getenv("MCI_BIN_DIR"), imagesDir: os.Getenv("MCI_IMAGES_DIR"), imageVersion: os.Getenv("MCI_IMAGE_VERSION")}
	require.True(t, env.imagesDir != "" && env.imageVersion != "",
		"no images to start: run make test-pods-start, which builds them (make images) and sets MCI_IMAGES_DIR and MCI_IMAGE_VERSION")
	if env.binDir == "" {
		env.binDir = filepath.Join("..", "..", "_output", "bin")
	}
	var err error
	env.binDir, err = filepath.Abs(env.binDir)
	require.NoError(t, err)
	return env
}

// mode is one way of installing the chart.
type mode struct {
	name string
	// values is a file of testdata; empty: the chart's defaults.
	values string
	// members runs memberCluster beside the chart's cluster, exporting a
	// pool that the chart's mci-apiserver must serve as an import.
	members bool
	// setup runs after the ClusterSet is up and before the chart is
	// rendered: what the cluster must hold, and more helm arguments.
	setup func(t *testing.T, ctx context.Context, f *fixture) []string
	// installed runs after the chart is installed and before its pods
	// start: what another controller would do (cert-manager's).
	installed func(t *testing.T, ctx context.Context, f *fixture, objs []*unstructured.Unstructured)
	// serving runs once every pod started and passed its probes: the data
	// path.
	serving func(t *testing.T, ctx context.Context, f *fixture)
}

var modes = []mode{{
	name:  "default values",
	setup: aboutAPI,
}, {
	name:    "self-signed certificate and Secret membership with mci-epp",
	values:  "secret-members.yaml",
	members: true,
	setup:   memberSecret,
	serving: requireImportServed,
}, {
	name:      "cert-manager serving certificate",
	values:    "cert-manager.yaml",
	members:   true,
	setup:     memberSecret,
	installed: certManager,
	serving:   requireImportServed,
}, {
	name:    "ClusterProfile membership",
	values:  "clusterprofiles.yaml",
	members: true,
	setup:   clusterProfiles,
	serving: requireImportServed,
}, {
	name:    "a request routed to a member's EPP",
	values:  "data-path.yaml",
	members: true,
	setup:   exporters,
	serving: requireRequestRouted,
}, {
	name:    "EPP shim mode",
	values:  "shim.yaml",
	members: true,
	setup:   memberSecret,
	serving: requireImportServed,
}}

// The modes run side by side (as many at once as go test's -parallel,
// GOMAXPROCS by default): each has its own ClusterSet, its own block of
// loopback addresses and its own ports, and most of a mode's time is
// spent waiting on probes' delays and servers' shutdown delays, not on a
// core.
func TestChartPodsStartAndServe(t *testing.T) {
	env := requireEnv(t)
	for i, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			runMode(t, env, m, i)
			t.Logf("installed, started and served in %s", time.Since(start).Round(100*time.Millisecond))
		})
	}
}

// fixture is one mode's ClusterSet and what runs in it.
type fixture struct {
	env     testEnv
	cs      *localclusterset.ClusterSet
	cluster *localclusterset.Cluster
	kube    kubernetes.Interface
	kubelet *kubelet
	// block is the third byte of the loopback addresses of this mode's pods
	// and Services: 127.0.<block>.x.
	block   int
	nextIP  int
	proxies []*serviceProxy
	pods    []*pod
	// dataPath is the exporting side of the data path, in the mode that
	// routes a request.
	dataPath *localclusterset.DataPath
}

func (f *fixture) allocateIP() string {
	f.nextIP++
	return fmt.Sprintf("127.0.%d.%d", f.block, f.nextIP)
}

func runMode(t *testing.T, env testEnv, m mode, index int) {
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	clusters := []string{chartCluster}
	if m.members {
		clusters = append(clusters, memberCluster)
	}
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: clusters, BinDir: env.binDir, Log: testWriter{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	c, err := cs.Cluster(chartCluster)
	require.NoError(t, err)
	u, err := url.Parse(c.Server)
	require.NoError(t, err)
	scratch := t.TempDir()
	f := &fixture{
		env: env, cs: cs, cluster: c, kube: kubernetes.NewForConfigOrDie(c.Config),
		block: 150 + index,
		kubelet: &kubelet{
			apiHost: u.Hostname(), apiPort: u.Port(), caPEM: c.Config.CAData,
			images: &imageStore{dir: env.imagesDir, scratch: scratch},
			dir:    filepath.Join(scratch, "pods"),
		},
	}
	f.kubelet.kube = f.kube
	t.Cleanup(func() {
		// As a kubelet does, every pod is stopped at once: each waits out
		// its own grace (mci-apiserver's shutdown delay), not the others'.
		var stopping sync.WaitGroup
		for _, p := range f.pods {
			stopping.Go(p.stop)
		}
		stopping.Wait()
		for _, s := range f.proxies {
			s.close()
		}
	})

	var args []string
	if m.setup != nil {
		args = m.setup(t, ctx, f)
	}
	if m.values != "" {
		args = append(args, "--values", filepath.Join("testdata", m.values))
	}
	objs := f.render(t, args...)
	f.install(t, ctx, objs)
	if m.installed != nil {
		m.installed(t, ctx, f, objs)
	}
	f.startWorkloads(t, ctx, objs)
	f.requireAPIServed(t, ctx)
	if m.serving != nil {
		m.serving(t, ctx, f)
	}
}

// render runs helm template for the release mci in releaseNamespace, with
// mci's images at the tag make images built.
func (f *fixture) render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	bin := filepath.Join(f.env.binDir, "helm")
	home := t.TempDir()
	all := append([]string{"template", "mci", chartDir, "--namespace", releaseNamespace,
		"--set", "apiserver.image.tag=" + f.env.imageVersion,
		"--set", "sidecar.image.tag=" + f.env.imageVersion,
		"--set", "epp.image.tag=" + f.env.imageVersion,
	}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "helm %s: %s (helm comes from make helm)", strings.Join(all, " "), stderr.String())
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "helm template's output")
		if obj != nil {
			objs = append(objs, &unstructured.Unstructured{Object: obj})
		}
	}
	return objs
}

// install creates what the chart renders, as helm install --namespace
// mci-system --create-namespace would, but for the kinds whose CRDs this
// cluster lacks (cert-manager's, the Prometheus Operator's); the Service
// an APIService names becomes an ExternalName Service of a loopback
// address where the test plays kube-proxy (startWorkloads).
func (f *fixture) install(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	_, err := f.cs.Apply(ctx, f.cluster.Name, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": releaseNamespace},
	}})
	require.NoError(t, err)
	var apply []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GroupVersionKind().Group {
		case "cert-manager.io", "monitoring.coreos.com":
			continue
		}
		if o.GetKind() == "Service" && f.apiServiceNames(objs, o) {
			o = f.externalNameService(t, o)
		}
		apply = append(apply, o)
	}
	applied, err := f.cs.Apply(ctx, f.cluster.Name, apply...)
	require.NoError(t, err, "installing what the chart renders")
	t.Logf("installed %d objects", len(applied))
}

// apiServiceNames says whether an APIService of objs names the Service svc.
func (f *fixture) apiServiceNames(objs []*unstructured.Unstructured, svc *unstructured.Unstructured) bool {
	for _, o := range objs {
		if o.GetKind() != "APIService" {
			continue
		}
		name, _, _ := unstructured.NestedString(o.Object, "spec", "service", "name")
		ns, _, _ := unstructured.NestedString(o.Object, "spec", "service", "namespace")
		if name == svc.GetName() && ns == svc.GetNamespace() {
			return true
		}
	}
	return false
}

// externalNameService is svc as an ExternalName Service of a loopback
// address of its own, with the same ports: the aggregator dials an
// ExternalName Service's name and the APIService's port, where a
// serviceProxy then stands for kube-proxy.
func (f *fixture) externalNameService(t *testing.T, svc *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	svc = svc.DeepCopy()
	ip := fmt.Sprintf("127.0.%d.%d", f.block, 200)
	spec := svc.Object["spec"].(map[string]any)
	selector := spec["selector"]
	ports := spec["ports"]
	svc.Object["spec"] = map[string]any{"type": "ExternalName", "externalName": ip, "ports": ports}
	// Kept for startWorkloads, which proxies to the pods it selects.
	ann := svc.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	sel, _ := selector.(map[string]any)
	var pairs []string
	for k, v := range sel {
		pairs = append(pairs, k+"="+fmt.Sprint(v))
	}
	slices.Sort(pairs)
	ann[proxiedSelectorAnnotation] = strings.Join(pairs, ",")
	svc.SetAnnotations(ann)
	return svc
}

// proxiedSelectorAnnotation keeps the selector of a Service that install
// turned into an ExternalName Service.
const proxiedSelectorAnnotation = "podstart.mci.x-k8s.io/selector"

// startWorkloads starts the pods of every Deployment the chart renders,
// each pod on its own loopback address and in its own goroutine as on its
// own node, plays kube-proxy for the Services install rewrote, and runs
// every probe. It fails with the log of any container that does not pass.
func (f *fixture) startWorkloads(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	type workload struct {
		deploy *appsv1.Deployment
		pods   []*pod
	}
	var workloads []workload
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" || o.GetKind() == "StatefulSet" || o.GetKind() == "Job" {
			require.Failf(t, "unexpected workload", "the chart renders a %s (%s): this test starts Deployments only", o.GetKind(), o.GetName())
		}
		if o.GetKind() != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d))
		w := workload{deploy: &d}
		replicas := int(ptrOr(d.Spec.Replicas, 1))
		for r := range replicas {
			tmpl := d.Spec.Template
			w.pods = append(w.pods, f.kubelet.newPod(podName(d.Name, r), d.Namespace, f.allocateIP(), tmpl.Labels, tmpl.Annotations, tmpl.Spec))
		}
		workloads = append(workloads, w)
		f.pods = append(f.pods, w.pods...)
	}
	require.NotEmpty(t, workloads, "the chart renders no Deployment")

	// kube-proxy: each rewritten Service's ports to its pods' targetPorts.
	for _, o := range objs {
		if o.GetKind() != "Service" || !f.apiServiceNames(objs, o) {
			continue
		}
		var svc corev1.Service
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &svc))
		for _, port := range svc.Spec.Ports {
			var backends []string
			for _, w := range workloads {
				if w.deploy.Namespace != svc.Namespace || !selects(svc.Spec.Selector, w.deploy.Spec.Template.Labels) {
					continue
				}
				for _, p := range w.pods {
					target, err := targetPort(port, p.spec)
					require.NoError(t, err, "Service %s/%s port %s", svc.Namespace, svc.Name, port.Name)
					backends = append(backends, net.JoinHostPort(p.ip, strconv.Itoa(target)))
				}
			}
			require.NotEmpty(t, backends, "Service %s/%s selects no pod the chart renders", svc.Namespace, svc.Name)
			addr := net.JoinHostPort(fmt.Sprintf("127.0.%d.%d", f.block, 200), strconv.Itoa(int(port.Port)))
			proxy, err := startServiceProxy(addr, backends)
			require.NoError(t, err)
			f.proxies = append(f.proxies, proxy)
			t.Logf("Service %s/%s: %s -> %s", svc.Namespace, svc.Name, addr, strings.Join(backends, ", "))
		}
	}

	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, w := range workloads {
		for _, p := range w.pods {
			wg.Go(func() {
				start := time.Now()
				err := f.kubelet.start(ctx, p)
				startupDone := map[string]bool{}
				for _, c := range p.containers {
					if c.spec.RestartPolicy != nil && c.spec.StartupProbe != nil {
						startupDone[c.spec.Name] = true
					}
				}
				var perr []error
				if err == nil {
					perr = probeContainers(ctx, p, startupDone)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				errs = append(errs, perr...)
				if len(perr) == 0 {
					var names []string
					for _, c := range p.containers {
						names = append(names, c.spec.Name)
					}
					msg := fmt.Sprintf("pod %s/%s on %s: %s started, every probe passed, in %s", p.namespace, p.name, p.ip, strings.Join(names, ", "), time.Since(start).Round(100*time.Millisecond))
					if len(p.notStarted) > 0 {
						msg += "; not started (image not available here): " + strings.Join(p.notStarted, ", ")
					}
					t.Log(msg)
				}
			})
		}
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}

// selects says whether a Service's selector selects a pod of labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// targetPort resolves a Service port's targetPort in a pod: a number, or
// the name of a container port.
func targetPort(port corev1.ServicePort, spec corev1.PodSpec) (int, error) {
	tp := port.TargetPort
	if tp.Type == intstr.Int {
		if tp.IntVal == 0 {
			return int(port.Port), nil
		}
		return int(tp.IntVal), nil
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, p := range c.Ports {
			if p.Name == tp.StrVal {
				return int(p.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("targetPort %q names no container port", tp.StrVal)
}

func ptrOr(v *int32, def int32) int32 {
	if v == nil {
		return def
	}
	return *v
}

// requireAPIServed checks that the aggregator of the chart's cluster
// serves InferencePoolImports through the APIService the chart renders,
// answered by the started mci-apiservers.
func (f *fixture) requireAPIServed(t *testing.T, ctx context.Context) {
	t.Helper()
	client := mciclient.NewForConfigOrDie(f.cluster.Config)
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.InferenceV1alpha1().InferencePoolImports(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		return true, nil
	})
	require.NoError(t, err, "listing InferencePoolImports through the aggregator; last: %s", last)
}

// aboutAPI gives the chart's cluster the About API's ClusterProperty
// cluster.clusterset.k8s.io, which the chart's defaults (no clusterName)
// rely on.
func aboutAPI(t *testing.T, ctx context.Context, f *fixture) []string {
	t.Helper()
	_, err := f.cs.ApplyFiles(ctx, f.cluster.Name, filepath.Join("testdata", "about-api-crd.yaml"))
	require.NoError(t, err)
	var last error
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = f.cs.Apply(ctx, f.cluster.Name, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
			"metadata": map[string]any{"name": "cluster.clusterset.k8s.io"},
			"spec":     map[string]any{"value": f.cluster.Name},
		}})
		return last == nil, nil
	})
	require.NoError(t, err, "the ClusterProperty cluster.clusterset.k8s.io; last: %v", last)
	return nil
}

// testWriter logs the ClusterSet's progress lines through the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
