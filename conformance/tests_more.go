package conformance

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
)

// An invalid export, ParentMode, cross-namespace routes, streaming lists.

var referenceGrantsGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1beta1", Resource: "referencegrants"}

const (
	reqInvalidExport = "Upstream 1374, Export Annotation: ClusterSet is the supported value; InferencePool Status: the condition is False " +
		"for every reason but having been exported to all members, so an unknown value reports Exported False"
	reqParentMode = "Proposal, Go Types: an ImportedCluster of routingMode ParentMode carries parents[] {name, namespace, service[{type, addresses, ports}]}, " +
		"the exported pool's parent Gateways (the export-mode annotation: ParentMode routes through the pool's parents)"
	reqReferenceGrant = "Gateway API HTTPRoute backendRefs: a reference to another namespace is permitted only by a ReferenceGrant there " +
		"(condition ResolvedRefs, reason RefNotPermitted otherwise), on the import's parent entry (upstream ImportController.parents[].conditions)"
	reqAllowedRoutes = "Gateway API Listener allowedRoutes.namespaces: a route attaches to a listener of a Gateway in another namespace only when the listener " +
		"allows the route's namespace (from Same by default, All, or Selector over the namespace's labels); on the import's parent entry " +
		"(upstream ImportController.parents[], the InferencePool's ParentStatus) a Gateway that refuses the route is Accepted False, reason HTTPRouteNotAccepted"
	reqWatchList = "Kubernetes API streaming lists (sendInitialEvents=true, which client-go informers use where the server supports it): " +
		"the current imports as ADDED events, then a bookmark annotated k8s.io/initial-events-end"
)

func moreTests() []Test {
	return []Test{
		{
			Name:        "an export annotation with an unknown value reports Exported False",
			Requirement: reqInvalidExport,
			Label:       Required,
			Run:         testInvalidExport,
		},
		{
			Name:        "a ParentMode export gives importers the pool's parent Gateway and its address",
			Requirement: reqParentMode,
			Label:       Optional,
			Run:         testParentMode,
		},
		{
			Name:        "a route in another namespace resolves the import only once a ReferenceGrant allows it",
			Requirement: reqReferenceGrant,
			Label:       Optional,
			Run:         testReferenceGrant,
		},
		{
			Name:        "a Gateway in another namespace accepts the route to the import only once its listener's allowedRoutes admit the route's namespace",
			Requirement: reqAllowedRoutes,
			Label:       Optional,
			Run:         testAllowedRoutes,
		},
		{
			Name:        "a streaming list sends the imports and then the initial-events-end bookmark",
			Requirement: reqWatchList,
			Label:       Optional,
			Run:         testWatchList,
		},
	}
}

func testInvalidExport(t *T) {
	cs := t.Clusters()
	a := cs[0]
	f := newFixture(t)
	for _, c := range cs {
		f.createNamespace(c)
	}
	f.createEPPService(a, "pool")
	f.createPool(a, "pool", map[string]string{exportAnnotation: "World"})
	f.eventually("an unknown export value reports Exported False", f.exported(a, "pool", "False"))
}

func testParentMode(t *T) {
	a, b := t.Clusters()[0], t.Clusters()[1]
	if !serves(t, a, gatewaysGVR) {
		t.Skipf("%s serves no Gateway API v1 Gateways", a.Name)
	}
	f := newFixture(t)
	f.createNamespace(a)
	f.createNamespace(b)
	// The Gateway and the pool's parent entry, with the status a gateway
	// controller would write (its class is one no controller handles).
	// The address is from a documentation range: nothing is sent to it.
	const address = "192.0.2.44"
	f.create(a, gatewaysGVR, map[string]any{
		"apiVersion": gatewaysGVR.GroupVersion().String(), "kind": "Gateway",
		"metadata": map[string]any{"name": "gw", "namespace": f.ns, "labels": map[string]any{managedByLabel: managedByValue}},
		"spec": map[string]any{
			"gatewayClassName": gatewayClass,
			"listeners":        []any{map[string]any{"name": "http", "protocol": "HTTP", "port": int64(80)}},
		},
	})
	f.updateStatus(a, gatewaysGVR, "gw", map[string]any{
		"addresses":  []any{map[string]any{"type": "IPAddress", "value": address}},
		"conditions": []any{condition1("Programmed", "True", "Programmed")},
	})
	f.createEPPService(a, "pool")
	f.createPool(a, "pool", map[string]string{exportAnnotation: exportClusterSet, exportModeAnnotation: "ParentMode"})
	f.setPoolParent(a, "pool", map[string]any{
		"parentRef":      map[string]any{"group": gatewaysGVR.Group, "kind": "Gateway", "name": "gw", "namespace": f.ns},
		"controllerName": suiteController,
		"conditions":     []any{condition1("Accepted", "True", "Accepted")},
	})
	f.eventually("the import carries the parent Gateway", func(ctx context.Context) (bool, string) {
		imp, err := f.getImport(b, "pool")
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import: %v", err)
		}
		clusters, found, _ := unstructured.NestedSlice(imp.Object, "status", "clusters")
		if !found {
			t.Skipf("the import has no status.clusters: this implementation serves the upstream shape only")
		}
		for _, rc := range clusters {
			c, _ := rc.(map[string]any)
			if c["name"] != a.Name {
				continue
			}
			parents, _, _ := unstructured.NestedSlice(c, "parents")
			for _, rp := range parents {
				p, _ := rp.(map[string]any)
				services, _, _ := unstructured.NestedSlice(p, "service")
				for _, rs := range services {
					s, _ := rs.(map[string]any)
					addresses, _, _ := unstructured.NestedStringSlice(s, "addresses")
					if c["routingMode"] == "ParentMode" && p["name"] == "gw" && p["namespace"] == f.ns && slices.Contains(addresses, address) {
						return true, ""
					}
				}
			}
			return false, fmt.Sprintf("routingMode %v, parents %v", c["routingMode"], parents)
		}
		return false, fmt.Sprintf("status.clusters has no %s: %v", a.Name, clusters)
	})
}

func condition1(typ, status, reason string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": reason, "message": "set by mci-conformance", "lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z")}
}

// suiteController is the controller name of the status entries the suite
// writes as a gateway controller would.
const suiteController = "example.com/mci-conformance"

// updateStatus replaces the status of an object of the fixture's
// namespace, as its only controller would.
func (f *fixture) updateStatus(c *Cluster, gvr schema.GroupVersionResource, name string, status map[string]any) {
	f.t.Helper()
	f.writeStatus(c, gvr, name, func(obj *unstructured.Unstructured) { obj.Object["status"] = status })
}

// setPoolParent sets the suite's entry of the pool's status.parents, as a
// gateway controller does: the other controllers' entries (the
// implementation's Exported entry) are kept, and a conflict is retried.
func (f *fixture) setPoolParent(c *Cluster, name string, entry map[string]any) {
	f.t.Helper()
	f.writeStatus(c, poolsGVR, name, func(obj *unstructured.Unstructured) {
		parents, _, _ := unstructured.NestedSlice(obj.Object, "status", "parents")
		parents = slices.DeleteFunc(parents, func(p any) bool {
			m, _ := p.(map[string]any)
			return m["controllerName"] == suiteController
		})
		_ = unstructured.SetNestedSlice(obj.Object, append(parents, entry), "status", "parents")
	})
}

func (f *fixture) writeStatus(c *Cluster, gvr schema.GroupVersionResource, name string, change func(*unstructured.Unstructured)) {
	f.t.Helper()
	f.write(c, gvr, name, "the status of ", change, func(api dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
		_, err := api.UpdateStatus(f.ctx(), obj, metav1.UpdateOptions{})
		return err
	})
}

// writeSpec changes an object of the fixture's namespace, as its owner
// would.
func (f *fixture) writeSpec(c *Cluster, gvr schema.GroupVersionResource, name string, change func(*unstructured.Unstructured)) {
	f.t.Helper()
	f.write(c, gvr, name, "", change, func(api dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
		_, err := api.Update(f.ctx(), obj, metav1.UpdateOptions{})
		return err
	})
}

// write reads an object, changes it and writes it with update, retrying a
// conflict.
func (f *fixture) write(c *Cluster, gvr schema.GroupVersionResource, name, what string, change func(*unstructured.Unstructured),
	update func(dynamic.ResourceInterface, *unstructured.Unstructured) error) {
	f.t.Helper()
	api := c.Dynamic.Resource(gvr).Namespace(f.ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := api.Get(f.ctx(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(obj)
		return update(api, obj)
	})
	if err != nil {
		f.t.Fatalf("writing %s%s %s/%s in %s: %v", what, gvr.Resource, f.ns, name, c.Name, err)
	}
}

func testReferenceGrant(t *T) {
	f, _, b := importedPool(t)
	if !serves(t, b, httpRoutesGVR) || !serves(t, b, referenceGrantsGVR) {
		t.Skipf("%s serves no Gateway API HTTPRoutes and ReferenceGrants", b.Name)
	}
	// The route and its Gateway live in a namespace of their own.
	other := f.companion(b, "routes")
	routes := other.ns
	other.create(b, gatewaysGVR, map[string]any{
		"apiVersion": gatewaysGVR.GroupVersion().String(), "kind": "Gateway",
		"metadata": map[string]any{"name": "gw", "namespace": routes},
		"spec": map[string]any{
			"gatewayClassName": gatewayClass,
			"listeners":        []any{map[string]any{"name": "http", "protocol": "HTTP", "port": int64(80)}},
		},
	})
	other.create(b, httpRoutesGVR, map[string]any{
		"apiVersion": httpRoutesGVR.GroupVersion().String(), "kind": "HTTPRoute",
		"metadata": map[string]any{"name": "route", "namespace": routes},
		"spec": map[string]any{
			"parentRefs": []any{map[string]any{"name": "gw"}},
			"rules": []any{map[string]any{"backendRefs": []any{map[string]any{
				"group": importsGVR.Group, "kind": "InferencePoolImport", "name": "pool", "namespace": f.ns,
			}}}},
		},
	})
	f.eventually("without a ReferenceGrant the parent's ResolvedRefs is False", f.parentCondition(b, routes, "ResolvedRefs", "False", ""))
	f.create(b, referenceGrantsGVR, map[string]any{
		"apiVersion": referenceGrantsGVR.GroupVersion().String(), "kind": "ReferenceGrant",
		"metadata": map[string]any{"name": "routes-to-imports", "namespace": f.ns},
		"spec": map[string]any{
			"from": []any{map[string]any{"group": httpRoutesGVR.Group, "kind": "HTTPRoute", "namespace": routes}},
			"to":   []any{map[string]any{"group": importsGVR.Group, "kind": "InferencePoolImport"}},
		},
	})
	f.eventually("with the ReferenceGrant the parent's ResolvedRefs is True", f.parentCondition(b, routes, "ResolvedRefs", "True", ""))
}

func testAllowedRoutes(t *T) {
	f, _, b := importedPool(t)
	if !serves(t, b, httpRoutesGVR) || !serves(t, b, gatewaysGVR) {
		t.Skipf("%s serves no Gateway API v1 Gateways and HTTPRoutes", b.Name)
	}
	// The Gateway lives in a namespace of its own; the route beside the
	// import, so that no ReferenceGrant is involved.
	gateways := f.companion(b, "gateways")
	listener := func(namespaces map[string]any) map[string]any {
		return map[string]any{"name": "http", "protocol": "HTTP", "port": int64(80), "allowedRoutes": map[string]any{"namespaces": namespaces}}
	}
	gateways.create(b, gatewaysGVR, map[string]any{
		"apiVersion": gatewaysGVR.GroupVersion().String(), "kind": "Gateway",
		"metadata": map[string]any{"name": "gw", "namespace": gateways.ns},
		"spec": map[string]any{
			"gatewayClassName": gatewayClass,
			"listeners":        []any{listener(map[string]any{"from": "Same"})},
		},
	})
	f.create(b, httpRoutesGVR, map[string]any{
		"apiVersion": httpRoutesGVR.GroupVersion().String(), "kind": "HTTPRoute",
		"metadata": map[string]any{"name": "route", "namespace": f.ns},
		"spec": map[string]any{
			"parentRefs": []any{map[string]any{"name": "gw", "namespace": gateways.ns}},
			"rules": []any{map[string]any{"backendRefs": []any{map[string]any{
				"group": importsGVR.Group, "kind": "InferencePoolImport", "name": "pool",
			}}}},
		},
	})
	f.eventually("a listener that allows only its own namespace leaves the parent Accepted False, HTTPRouteNotAccepted",
		f.parentCondition(b, gateways.ns, "Accepted", "False", "HTTPRouteNotAccepted"))
	// Every namespace carries its name as a label (kubernetes.io/metadata.name),
	// the usual way to admit one namespace by selector.
	admitted := listener(map[string]any{"from": "Selector", "selector": map[string]any{"matchLabels": map[string]any{corev1.LabelMetadataName: f.ns}}})
	gateways.writeSpec(b, gatewaysGVR, "gw", func(obj *unstructured.Unstructured) {
		_ = unstructured.SetNestedSlice(obj.Object, []any{admitted}, "spec", "listeners")
	})
	f.eventually("a listener whose selector admits the route's namespace makes the parent Accepted True",
		f.parentCondition(b, gateways.ns, "Accepted", "True", ""))
}

// parentCondition holds when the import's parent Gateway gw of namespace
// ns has a condition of type typ with the given status (and reason, when
// one is given).
func (f *fixture) parentCondition(c *Cluster, ns, typ, want, reason string) condition {
	return func(ctx context.Context) (bool, string) {
		imp, err := f.getImport(c, "pool")
		if err != nil || imp == nil {
			return false, fmt.Sprintf("import: %v", err)
		}
		var seen []string
		for _, ctrl := range decodeUpstream(imp).Status.Controllers {
			for _, p := range ctrl.Parents {
				for _, cond := range p.Conditions {
					seen = append(seen, fmt.Sprintf("%s/%s %s=%s %s", p.ParentRef.Namespace, p.ParentRef.Name, cond.Type, cond.Status, cond.Reason))
					if p.ParentRef.Name == "gw" && p.ParentRef.Namespace == ns && cond.Type == typ && string(cond.Status) == want &&
						(reason == "" || cond.Reason == reason) {
						return true, ""
					}
				}
			}
		}
		return false, "parents: [" + strings.Join(seen, "; ") + "]"
	}
}

func testWatchList(t *T) {
	f, _, b := importedPool(t)
	ctx, cancel := context.WithTimeout(f.ctx(), t.PollTimeout())
	defer cancel()
	send := true
	w, err := b.Dynamic.Resource(importsGVR).Namespace(f.ns).Watch(ctx, metav1.ListOptions{
		SendInitialEvents: &send, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
	})
	if err != nil {
		t.Fatalf("a streaming list of imports in %s: %v", b.Name, err)
	}
	defer w.Stop()
	var added []string
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended before the initial-events-end bookmark; added: %v", added)
			}
			obj, isUnstructured := ev.Object.(*unstructured.Unstructured)
			switch {
			case ev.Type == watch.Error:
				t.Fatalf("the streaming list failed: %v", apierrors.FromObject(ev.Object))
			case ev.Type == watch.Added && isUnstructured:
				added = append(added, obj.GetName())
			case ev.Type == watch.Bookmark && isUnstructured && obj.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true":
				if !slices.Equal(added, []string{"pool"}) {
					t.Errorf("the initial events added %v, want [pool]", added)
				}
				return
			}
		case <-ctx.Done():
			t.Fatalf("no initial-events-end bookmark within %s; added: %v", t.PollTimeout(), added)
		}
	}
}
