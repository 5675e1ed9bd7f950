package chart

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

const (
	chartDir  = "../../charts/mci"
	deployDir = "../../artifacts/deploy"
	// releaseNamespace is the namespace the kustomize bases install
	// mci-apiserver into.
	releaseNamespace = "mci-system"
	// gatewayNamespace is the Inference Gateway's, apart from it.
	gatewayNamespace = "mci-gateway"
	// equivalentValues are the chart values of the kustomize bases' settings.
	equivalentValues = "testdata/kustomize-equivalent.yaml"
)

// binDir is where hack/build-helm.sh and hack/build-kube-tools.sh put
// their binaries: $MCI_BIN_DIR, else _output/bin of this repository.
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("MCI_BIN_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "_output", "bin")
	}
	dir, err := filepath.Abs(dir)
	require.NoError(t, err)
	return dir
}

// runHelm runs the helm built from hack/tools/helm with args and returns
// its standard output and standard error. Helm's configuration, cache and
// data directories are the test's own, so that nothing of the user's
// (repositories, plugins) is read or written.
func runHelm(t *testing.T, args ...string) (stdout []byte, stderr string, err error) {
	t.Helper()
	bin := filepath.Join(binDir(t), "helm")
	_, err = os.Stat(bin)
	require.NoError(t, err, "helm is missing: run hack/build-helm.sh (or make test-chart)")
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	stdout, err = cmd.Output()
	return stdout, errBuf.String(), err
}

// helm runs helm as runHelm does, failing the test when it fails.
func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	out, stderr, err := runHelm(t, args...)
	require.NoError(t, err, "helm %s:\n%s%s", strings.Join(args, " "), out, stderr)
	return out
}

// helmTemplate renders the chart into releaseNamespace with the kustomize
// bases' settings and then sets (helm --set syntax).
func helmTemplate(t *testing.T, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	return decode(t, helm(t, templateArgs(sets...)...), "helm template")
}

// templateArgs are the arguments of helm template for helmTemplate.
func templateArgs(sets ...string) []string {
	args := []string{"template", "mci", chartDir, "--namespace", releaseNamespace, "--values", equivalentValues}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

// kustomize builds the kustomizations of artifacts/deploy named by dirs, as
// `kubectl apply -k` does, and returns their objects together; an object
// two of them render (the shared Namespace) must be the same in both and is
// returned once.
func kustomize(t *testing.T, dirs ...string) []*unstructured.Unstructured {
	t.Helper()
	seen := map[string]*unstructured.Unstructured{}
	var objs []*unstructured.Unstructured
	for _, d := range dirs {
		var stderr bytes.Buffer
		cmd := exec.Command("kubectl", "kustomize", filepath.Join(deployDir, d))
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "kubectl kustomize %s: %s", d, stderr.String())
		for _, o := range decode(t, out, d) {
			if prev, ok := seen[key(o)]; ok {
				require.Equal(t, prev.Object, o.Object, "%s renders %s unlike another base", d, key(o))
				continue
			}
			seen[key(o)] = o
			objs = append(objs, o)
		}
	}
	return objs
}

// decode decodes a multi-document YAML stream read from source.
func decode(t *testing.T, data []byte, source string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, source)
		if obj != nil {
			objs = append(objs, &unstructured.Unstructured{Object: obj})
		}
	}
	return objs
}

// key names an object by group, kind, namespace and name.
func key(o *unstructured.Unstructured) string {
	gvk := o.GroupVersionKind()
	return fmt.Sprintf("%s/%s %s/%s", gvk.Group, gvk.Kind, o.GetNamespace(), o.GetName())
}

// byKey indexes objects by key, failing on a duplicate.
func byKey(t *testing.T, objs []*unstructured.Unstructured, source string) map[string]map[string]any {
	t.Helper()
	m := map[string]map[string]any{}
	for _, o := range objs {
		k := key(o)
		require.NotContains(t, m, k, "%s renders %s twice", source, k)
		m[k] = normalize(o.Object).(map[string]any)
	}
	return m
}

// setListKeys are the fields whose lists are sets keyed by a field of
// their items (their strategic merge keys): the order of their items means
// nothing to Kubernetes, and kustomize's patches put the items they add
// first.
var setListKeys = map[string]string{
	"env":          "name",
	"volumes":      "name",
	"volumeMounts": "mountPath",
}

// normalize returns v with the lists of setListKeys sorted by their key,
// at any depth, so that two objects compare equal when Kubernetes would
// read them the same.
func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, item := range v {
			item = normalize(item)
			if list, ok := item.([]any); ok {
				if field, ok := setListKeys[k]; ok {
					list = slices.Clone(list)
					slices.SortStableFunc(list, func(a, b any) int {
						return cmp.Compare(fmt.Sprint(a.(map[string]any)[field]), fmt.Sprint(b.(map[string]any)[field]))
					})
					item = list
				}
			}
			out[k] = item
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, item := range v {
			out[i] = normalize(item)
		}
		return out
	default:
		return v
	}
}
