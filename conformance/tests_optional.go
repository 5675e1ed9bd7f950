package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The proposal's answers to its open questions that an implementation may
// offer: why an export is not imported somewhere, and the importing
// cluster's parents of an import.

var (
	exportsGVR    = schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha1", Resource: "inferencepoolexports"}
	gatewaysGVR   = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	httpRoutesGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
)

const (
	reqWhyNotExported = "Proposal, Open Questions (Observability): surface that an InferencePool cannot be exported because its namespace " +
		"does not exist in importing clusters; the Exported condition is False with a reason and a message naming the cluster"
	reqExportResource = "Proposal, Open Questions (Ownership and Lifecycle): an InferencePoolExport resource in the exporting cluster " +
		"saying, per member, whether it imports the pool and why not (status.clusters[]{name, imported, reason, message})"
	reqParents = "Upstream apix/v1alpha1 ImportController.parents: the parents (Gateways) of the HTTPRoutes that use the import as a backendRef, " +
		"an entry per parent, removed when the controller no longer considers the import associated with it"
	// gatewayClass is the class of the suite's Gateways: one no controller
	// handles, so nothing is provisioned for them.
	gatewayClass = "mci-conformance"
)

func optionalTests() []Test {
	return []Test{
		{
			Name:        "the Exported condition says which member lacks the namespace",
			Requirement: reqWhyNotExported,
			Label:       Optional,
			Run:         testExportedSaysWhy,
		},
		{
			Name:        "InferencePoolExport lists each other member as imported or not, with the reason",
			Requirement: reqExportResource,
			Label:       Optional,
			Run:         testExportResource,
		},
		{
			Name:        "an import lists the Gateways of the HTTPRoutes that use it, and drops one whose route goes",
			Requirement: reqParents,
			Label:       Optional,
			Run:         testParents,
		},
	}
}

func testExportedSaysWhy(t *T) {
	cs := t.Clusters()
	a, last := cs[0], cs[len(cs)-1]
	f := newFixture(t)
	for _, c := range cs[:len(cs)-1] {
		f.createNamespace(c)
	}
	f.exportPool(a, "pool")
	f.eventually("Exported is False, saying "+last.Name+" lacks the namespace", func(ctx context.Context) (bool, string) {
		status, reason, seen, err := exportedState(f, a, "pool")
		if err != nil {
			return false, err.Error()
		}
		return status == "False" && reason != "" && strings.Contains(seen, last.Name), seen
	})
}

func testExportResource(t *T) {
	cs := t.Clusters()
	a, last := cs[0], cs[len(cs)-1]
	if !serves(t, a, exportsGVR) {
		t.Skipf("%s serves no %s: this implementation offers no InferencePoolExport", a.Name, exportsGVR.GroupResource())
	}
	f := newFixture(t)
	for _, c := range cs[:len(cs)-1] {
		f.createNamespace(c)
	}
	f.exportPool(a, "pool")
	f.eventually("the export lists "+last.Name+" as not imported and why", f.exportTargets(a, last.Name, false))
	for _, c := range cs[1 : len(cs)-1] {
		f.eventually("the export lists "+c.Name+" as imported", f.exportTargets(a, c.Name, true))
	}
	f.createNamespace(last)
	f.eventually("the export lists "+last.Name+" as imported once it has the namespace", f.exportTargets(a, last.Name, true))
}

// exportTargets holds when the export of pool in c lists cluster as
// imported (or not, with a reason and a message).
func (f *fixture) exportTargets(c *Cluster, cluster string, imported bool) condition {
	return func(ctx context.Context) (bool, string) {
		obj, err := c.Dynamic.Resource(exportsGVR).Namespace(f.ns).Get(ctx, "pool", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		clusters, _, _ := unstructured.NestedSlice(obj.Object, "status", "clusters")
		var seen []string
		for _, rc := range clusters {
			m, _ := rc.(map[string]any)
			name, _ := m["name"].(string)
			got, _ := m["imported"].(bool)
			reason, _ := m["reason"].(string)
			message, _ := m["message"].(string)
			seen = append(seen, fmt.Sprintf("%s imported=%v %s (%s)", name, got, reason, message))
			if name == cluster && got == imported && (imported || (reason != "" && message != "")) {
				return true, ""
			}
		}
		return false, "status.clusters: [" + strings.Join(seen, "; ") + "]"
	}
}

// serves says whether c's discovery lists the resource.
func serves(t *T, c *Cluster, gvr schema.GroupVersionResource) bool {
	resources, err := c.Kube.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatalf("%s: discovery of %s: %v", c.Name, gvr.GroupVersion(), err)
	}
	return slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource })
}

func testParents(t *T) {
	f, _, b := importedPool(t)
	if !serves(t, b, httpRoutesGVR) || !serves(t, b, gatewaysGVR) {
		t.Skipf("%s serves no Gateway API v1 Gateways and HTTPRoutes", b.Name)
	}
	for _, gw := range []string{"first", "second"} {
		f.create(b, gatewaysGVR, map[string]any{
			"apiVersion": gatewaysGVR.GroupVersion().String(), "kind": "Gateway",
			"metadata": map[string]any{"name": gw, "namespace": f.ns, "labels": map[string]any{managedByLabel: managedByValue}},
			"spec": map[string]any{
				"gatewayClassName": gatewayClass,
				"listeners":        []any{map[string]any{"name": "http", "protocol": "HTTP", "port": int64(80)}},
			},
		})
		f.create(b, httpRoutesGVR, map[string]any{
			"apiVersion": httpRoutesGVR.GroupVersion().String(), "kind": "HTTPRoute",
			"metadata": map[string]any{"name": gw, "namespace": f.ns, "labels": map[string]any{managedByLabel: managedByValue}},
			"spec": map[string]any{
				"parentRefs": []any{map[string]any{"name": gw}},
				"rules": []any{map[string]any{"backendRefs": []any{map[string]any{
					"group": importsGVR.Group, "kind": "InferencePoolImport", "name": "pool",
				}}}},
			},
		})
	}
	f.eventually("the import lists both Gateways", f.importParents(b, "pool", "first", "second"))
	if err := b.Dynamic.Resource(httpRoutesGVR).Namespace(f.ns).Delete(f.ctx(), "second", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting HTTPRoute second: %v", err)
	}
	f.eventually("the Gateway whose route went is dropped", f.importParents(b, "pool", "first"))
}

func (f *fixture) create(c *Cluster, gvr schema.GroupVersionResource, obj map[string]any) {
	f.t.Helper()
	u := &unstructured.Unstructured{Object: obj}
	if _, err := c.Dynamic.Resource(gvr).Namespace(f.ns).Create(f.ctx(), u, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("creating %s %s/%s in %s: %v", gvr.Resource, f.ns, u.GetName(), c.Name, err)
	}
}

// importParents holds when the import's controllers list exactly the
// Gateways named, of the fixture's namespace, as parents.
func (f *fixture) importParents(c *Cluster, name string, gateways ...string) condition {
	return func(ctx context.Context) (bool, string) {
		imp, err := f.getImport(c, name)
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import: %v", err)
		}
		var got []string
		for _, ctrl := range decodeUpstream(imp).Status.Controllers {
			for _, p := range ctrl.Parents {
				ns := p.ParentRef.Namespace
				if ns == "" {
					ns = f.ns
				}
				kind := p.ParentRef.Kind
				if kind == "" {
					kind = "Gateway"
				}
				if kind == "Gateway" && ns == f.ns && !slices.Contains(got, p.ParentRef.Name) {
					got = append(got, p.ParentRef.Name)
				}
			}
		}
		slices.Sort(got)
		return slices.Equal(got, gateways), fmt.Sprintf("parents %v, want %v", got, gateways)
	}
}
