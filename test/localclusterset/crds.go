package localclusterset

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
)

// gatewayAPIModule ships the Gateway API CRDs inside the Go module that the
// project already requires, so the version installed locally is the one the
// code is built against.
const gatewayAPIModule = "sigs.k8s.io/gateway-api"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// defaultCRDPaths are the member-cluster CRDs: the test fixtures in
// test/localclusterset/crds (InferencePool, InferenceModel, and
// InferenceObjective and InferenceModelRewrite in both their groups,
// generated from mci's own copies of those types: see crds/README.md) and
// the Gateway API standard channel.
// `go mod download -json` fetches the module when a fresh machine does not
// have it yet (`go list -m` would print an empty directory) and says where
// it is.
func defaultCRDPaths(repoRoot string) ([]string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", gatewayAPIModule)
	cmd.Dir = repoRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("downloading the %s module for its CRDs (go mod download): %w: %s%s", gatewayAPIModule, err, strings.TrimSpace(stderr.String()), strings.TrimSpace(string(out)))
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, fmt.Errorf("reading go mod download's answer for %s: %w", gatewayAPIModule, err)
	}
	if mod.Error != "" || mod.Dir == "" {
		return nil, fmt.Errorf("module %s is not available: %s", gatewayAPIModule, mod.Error)
	}
	return []string{
		filepath.Join(repoRoot, "test", "localclusterset", "crds"),
		filepath.Join(mod.Dir, "config", "crd", "standard"),
	}, nil
}

// readCRDs reads every CustomResourceDefinition in the YAML files at paths
// (files, or directories of *.yaml). Other kinds are skipped: the Gateway
// API bundle also has a ValidatingAdmissionPolicy that guards upgrades of
// real clusters and is of no use here.
func readCRDs(paths []string) ([]*unstructured.Unstructured, error) {
	objs, err := readObjects(paths)
	if err != nil {
		return nil, err
	}
	var crds []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		}
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinitions found in %v", paths)
	}
	return crds, nil
}

// isKustomization says whether a file is kustomize's index of a directory.
func isKustomization(name string) bool {
	switch name {
	case "kustomization.yaml", "kustomization.yml", "Kustomization":
		return true
	}
	return false
}

// readObjects decodes every object in the YAML (or JSON) files at paths:
// files, or directories whose *.yaml, *.yml and *.json files (but their
// kustomization) are read in name order.
func readObjects(paths []string) ([]*unstructured.Unstructured, error) {
	var files []string
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("reading manifests: %w", err)
		}
		if !info.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("reading manifests: %w", err)
		}
		for _, e := range entries { // sorted by name
			// A component's kustomization.yaml is kubectl apply -k's index of
			// the directory, not an object of the API.
			if isKustomization(e.Name()) {
				continue
			}
			switch filepath.Ext(e.Name()) {
			case ".yaml", ".yml", ".json":
				if !e.IsDir() {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
		}
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading manifests: %w", err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(bytes.NewReader(data)), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("decoding %s: %w", f, err)
			}
			if len(u.Object) == 0 { // an empty document between two "---"
				continue
			}
			if u.GetKind() == "" || u.GetAPIVersion() == "" {
				return nil, fmt.Errorf("decoding %s: an object without apiVersion and kind", f)
			}
			objs = append(objs, u)
		}
	}
	return objs, nil
}

// apiApprovalAnnotation must be on a CRD of a *.k8s.io or *.kubernetes.io
// group, or kube-apiserver refuses it.
const apiApprovalAnnotation = "api-approved.kubernetes.io"

// markUnapproved gives a CRD of a protected group that lacks the approval
// annotation an explicit "unapproved" one, which kube-apiserver accepts
// (flagging the CRD KubernetesAPIApprovalPolicyConformant=False), and says
// which CRDs it changed: the file is what needs fixing, since a real
// cluster would refuse it too.
func markUnapproved(crds []*unstructured.Unstructured) []string {
	var changed []string
	for _, crd := range crds {
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		protected := group == "k8s.io" || group == "kubernetes.io" ||
			strings.HasSuffix(group, ".k8s.io") || strings.HasSuffix(group, ".kubernetes.io")
		annotations := crd.GetAnnotations()
		if !protected || annotations[apiApprovalAnnotation] != "" {
			continue
		}
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[apiApprovalAnnotation] = "unapproved, local ClusterSet: the CRD file lacks this annotation"
		crd.SetAnnotations(annotations)
		changed = append(changed, crd.GetName())
	}
	return changed
}

// installCRDs creates (or updates) crds in a cluster and waits until each is
// Established, i.e. served.
func installCRDs(ctx context.Context, client dynamic.Interface, crds []*unstructured.Unstructured) error {
	api := client.Resource(crdGVR)
	for _, crd := range crds {
		_, err := api.Create(ctx, crd.DeepCopy(), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = updateCRD(ctx, api, crd)
		}
		if err != nil {
			return fmt.Errorf("creating CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		if err := waitEstablished(ctx, api, crd.GetName()); err != nil {
			return err
		}
	}
	return nil
}

// updateCRD replaces an existing CRD, retrying when it races with the CRD
// controllers writing its status.
func updateCRD(ctx context.Context, api dynamic.NamespaceableResourceInterface, crd *unstructured.Unstructured) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := api.Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		update := crd.DeepCopy()
		update.SetResourceVersion(current.GetResourceVersion())
		_, err = api.Update(ctx, update, metav1.UpdateOptions{})
		return err
	})
}

func waitEstablished(ctx context.Context, api dynamic.NamespaceableResourceInterface, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		crd, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		established, msg := condition(crd, "Established")
		last = msg
		return established, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s is not Established (%s): %w", name, last, err)
	}
	return nil
}

// condition reports whether an object's status condition of type t is True,
// and its message.
func condition(obj *unstructured.Unstructured, t string) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != t {
			continue
		}
		msg, _ := m["message"].(string)
		if reason, _ := m["reason"].(string); reason != "" {
			msg = reason + ": " + msg
		}
		return m["status"] == "True", msg
	}
	return false, "no " + t + " condition yet"
}
