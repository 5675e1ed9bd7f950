package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The export annotation of the proposal and of upstream proposal 1374.
const (
	exportAnnotation = "inference.networking.x-k8s.io/export"
	exportClusterSet = "ClusterSet"
	// managedByLabel marks everything the suite creates, so that a person
	// can find (and delete) what an interrupted run left behind.
	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "mci-conformance"
	pollInterval   = 200 * time.Millisecond
	// The ports of the suite's pools and EPP Services; nothing listens on
	// them, no test sends traffic.
	targetPort = 8000
	eppPort    = 9002
)

// fixture is one test's namespace, the same name in every cluster that
// has it, and the objects the test creates there.
type fixture struct {
	t  *T
	ns string
}

func newFixture(t *T) *fixture {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	suffix := make([]byte, 8)
	for i := range suffix {
		suffix[i] = letters[rand.IntN(len(letters))]
	}
	return &fixture{t: t, ns: "mci-conformance-" + string(suffix)}
}

func (f *fixture) ctx() context.Context { return f.t.Context() }

// createNamespace creates the test's namespace in c and deletes it after
// the test.
func (f *fixture) createNamespace(c *Cluster) {
	f.t.Helper()
	_, err := c.Kube.CoreV1().Namespaces().Create(f.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: f.ns, Labels: map[string]string{managedByLabel: managedByValue},
	}}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating namespace %s in %s: %v", f.ns, c.Name, err)
	}
	f.t.Cleanup(func() { f.deleteNamespace(c) })
}

// companion creates, in c, a second namespace of the test's own (the
// test's namespace with suffix) and returns a fixture for it; the namespace
// is deleted after the test.
func (f *fixture) companion(c *Cluster, suffix string) *fixture {
	f.t.Helper()
	other := &fixture{t: f.t, ns: f.ns + "-" + suffix}
	other.createNamespace(c)
	return other
}

// deleteNamespace deletes the namespace in c; deleting it twice is fine.
func (f *fixture) deleteNamespace(c *Cluster) {
	err := c.Kube.CoreV1().Namespaces().Delete(context.Background(), f.ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		f.t.Errorf("deleting namespace %s in %s: %v", f.ns, c.Name, err)
	}
}

// exportPool creates, in c, an InferencePool exported to the ClusterSet and
// the EPP Service it names (ClusterIP: nothing is provisioned).
func (f *fixture) exportPool(c *Cluster, name string) {
	f.t.Helper()
	f.createEPPService(c, name)
	f.createPool(c, name, map[string]string{exportAnnotation: exportClusterSet})
}

func (f *fixture) createEPPService(c *Cluster, pool string) {
	f.t.Helper()
	_, err := c.Kube.CoreV1().Services(f.ns).Create(f.ctx(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: pool + "-epp", Namespace: f.ns, Labels: map[string]string{managedByLabel: managedByValue}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{"app": pool + "-epp"},
			Ports: []corev1.ServicePort{
				{Name: "grpc-ext-proc", Port: eppPort},
				{Name: "grpc-health", Port: 9003},
				{Name: "http-metrics", Port: 9090},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating the EPP Service %s/%s-epp in %s: %v", f.ns, pool, c.Name, err)
	}
}

// createPool creates an InferencePool with the given annotations in c.
func (f *fixture) createPool(c *Cluster, name string, annotations map[string]string) {
	f.t.Helper()
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": poolsGVR.GroupVersion().String(),
		"kind":       "InferencePool",
		"metadata": map[string]any{
			"name": name, "namespace": f.ns,
			"labels":      map[string]any{managedByLabel: managedByValue},
			"annotations": toAny(annotations),
		},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": name}},
			"targetPorts":       []any{map[string]any{"number": int64(targetPort)}},
			"endpointPickerRef": map[string]any{"name": name + "-epp", "port": map[string]any{"number": int64(eppPort)}},
		},
	}}
	if _, err := c.Dynamic.Resource(poolsGVR).Namespace(f.ns).Create(f.ctx(), pool, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("creating InferencePool %s/%s in %s: %v", f.ns, name, c.Name, err)
	}
}

func toAny(m map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// annotatePool sets (value non-nil) or removes (nil) an annotation of a pool.
func (f *fixture) annotatePool(c *Cluster, name, key string, value *string) {
	f.t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}})
	if _, err := c.Dynamic.Resource(poolsGVR).Namespace(f.ns).Patch(f.ctx(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		f.t.Fatalf("annotating InferencePool %s/%s in %s: %v", f.ns, name, c.Name, err)
	}
}

func (f *fixture) deletePool(c *Cluster, name string) {
	f.t.Helper()
	if err := c.Dynamic.Resource(poolsGVR).Namespace(f.ns).Delete(f.ctx(), name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatalf("deleting InferencePool %s/%s in %s: %v", f.ns, name, c.Name, err)
	}
}

// getImport reads the import ns/name of c: nil when there is none.
func (f *fixture) getImport(c *Cluster, name string) (*unstructured.Unstructured, error) {
	obj, err := c.Dynamic.Resource(importsGVR).Namespace(f.ns).Get(f.ctx(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, name := range controllerNames(obj) {
		f.t.suite.sawController(name)
	}
	return obj, nil
}

// condition is one poll: done, or what was seen instead.
type condition func(ctx context.Context) (done bool, seen string)

// eventually polls cond until it holds, for at most the poll timeout, and
// fails the test with what was last seen.
func (f *fixture) eventually(what string, cond condition) {
	f.t.Helper()
	var seen string
	err := wait.PollUntilContextTimeout(f.ctx(), pollInterval, f.t.PollTimeout(), true, func(ctx context.Context) (bool, error) {
		var done bool
		done, seen = cond(ctx)
		return done, nil
	})
	if err != nil {
		f.t.Fatalf("%s: not within %s; last seen: %s", what, f.t.PollTimeout(), seen)
	}
}

// consistently checks that cond holds for the whole window (which no
// test can prove forever: the window says how long was watched).
func (f *fixture) consistently(what string, window time.Duration, cond condition) {
	f.t.Helper()
	deadline := time.Now().Add(window)
	for {
		done, seen := cond(f.ctx())
		if !done {
			f.t.Fatalf("%s: broken after %s of %s: %s", what, window-time.Until(deadline).Round(time.Millisecond), window, seen)
		}
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-f.ctx().Done():
			f.t.Fatalf("%s: %v", what, f.ctx().Err())
		case <-time.After(pollInterval):
		}
	}
}

// absenceWindow is how long a test watches for an import that must not
// appear: a quarter of the poll timeout, at least 2 s, at most 5 s.
func (f *fixture) absenceWindow() time.Duration {
	return min(max(f.t.PollTimeout()/4, 2*time.Second), 5*time.Second)
}

// importWith holds when c serves the import name exported by exactly the
// clusters named, in the upstream shape (status.controllers[].exportingClusters).
func (f *fixture) importWith(c *Cluster, name string, exporters ...string) condition {
	want := slices.Clone(exporters)
	slices.Sort(want)
	return func(ctx context.Context) (bool, string) {
		imp, err := f.getImport(c, name)
		switch {
		case err != nil:
			return false, err.Error()
		case imp == nil:
			return false, fmt.Sprintf("%s serves no InferencePoolImport %s/%s", c.Name, f.ns, name)
		}
		got := exportingClusters(imp)
		return slices.Equal(got, want), fmt.Sprintf("%s serves %s/%s exported by [%s], want [%s]", c.Name, f.ns, name, strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

// noImport holds when c serves no import name.
func (f *fixture) noImport(c *Cluster, name string) condition {
	return func(ctx context.Context) (bool, string) {
		imp, err := f.getImport(c, name)
		switch {
		case err != nil:
			return false, err.Error()
		case imp != nil:
			return false, fmt.Sprintf("%s serves InferencePoolImport %s/%s exported by [%s]", c.Name, f.ns, name, strings.Join(exportingClusters(imp), ", "))
		}
		return true, ""
	}
}

// names are the cluster names of cs.
func names(cs ...*Cluster) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
