package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
)

// The import as an API: who may write it, what shape clients decode,
// how a client finds and follows it.

const (
	reqManaged = "Proposal, InferencePoolImport: a cluster-local, controller-managed resource, not user-authored; " +
		"Notes for reviewers: status-only and controller-driven (a user's write is refused, or undone by the controller)"
	reqReadOnly = "Proposal, Notes for reviewers: status-only, controller-driven; an implementation that serves imports read-only " +
		"refuses writes with 405 MethodNotAllowed (Kubernetes API conventions for a verb a resource does not support)"
	reqShape = "Upstream apix/v1alpha1 InferencePoolImport: spec required; status.controllers required, a map keyed by name of at most 8 " +
		"ImportController{name: ControllerName DOMAIN/PATH, exportingClusters[].name unique, parents[]: ParentStatus, conditions: at most 8 metav1.Condition keyed by type}"
	reqShortName      = "Upstream apix/v1alpha1 InferencePoolImport: +kubebuilder:resource:shortName=infpimp"
	reqSeedShortName  = "Proposal, Go Types: +kubebuilder:resource:scope=Namespaced,shortName=ipimp"
	reqConditions     = "Upstream 1374, InferencePoolImport key ideas: surface at least one condition, e.g. Accepted, to say the import is ready to be used (ImportController.conditions, known type Accepted)"
	reqWatchResume    = "Kubernetes API conventions (list and watch): a watch started from a list's resourceVersion delivers every change after it, which informers rely on"
	importsAPIPath    = "/apis/inference.networking.x-k8s.io/v1alpha1"
	notAMemberCluster = "mci-conformance-not-a-member"
)

func apiTests() []Test {
	return []Test{
		{
			Name:        "a user's writes to an import do not stick",
			Requirement: reqManaged,
			Label:       Required,
			Run:         testWritesDoNotStick,
		},
		{
			Name:        "writes to an import are refused with 405 MethodNotAllowed",
			Requirement: reqReadOnly,
			Label:       Optional,
			Run:         testWritesAre405,
		},
		{
			Name:        "served imports decode into the upstream type and validate against its schema, from GET, LIST and WATCH",
			Requirement: reqShape,
			Label:       Required,
			Run:         testUpstreamShape,
		},
		{
			Name:        "an import carries at least one condition of its controller",
			Requirement: reqConditions,
			Label:       Required,
			Run: func(t *T) {
				a, b := t.Clusters()[0], t.Clusters()[1]
				f := newFixture(t)
				f.createNamespace(a)
				f.createNamespace(b)
				f.exportPool(a, "pool")
				f.eventually("the import's controller entry has a condition", func(ctx context.Context) (bool, string) {
					imp, err := f.getImport(b, "pool")
					if err != nil || imp == nil {
						return false, fmt.Sprintf("import: %v %v", imp, err)
					}
					for _, c := range decodeUpstream(imp).Status.Controllers {
						if len(c.Conditions) > 0 {
							return true, ""
						}
					}
					raw, _ := imp.MarshalJSON()
					return false, string(raw)
				})
			},
		},
		{
			Name:        "discovery lists InferencePoolImport with the upstream short name infpimp",
			Requirement: reqShortName,
			Label:       Required,
			Run:         func(t *T) { testShortName(t, "infpimp") },
		},
		{
			Name:        "discovery lists InferencePoolImport with the proposal's short name ipimp",
			Requirement: reqSeedShortName,
			Label:       Optional,
			Run:         func(t *T) { testShortName(t, "ipimp") },
		},
		{
			Name:        "a watch resumed from a list's resourceVersion delivers the import that appeared and went since",
			Requirement: reqWatchResume,
			Label:       Required,
			Run:         testWatchResume,
		},
	}
}

// importedPool sets up a pool of cluster 0 imported by cluster 1 and
// returns the fixture.
func importedPool(t *T) (*fixture, *Cluster, *Cluster) {
	a, b := t.Clusters()[0], t.Clusters()[1]
	f := newFixture(t)
	f.createNamespace(a)
	f.createNamespace(b)
	f.exportPool(a, "pool")
	f.eventually("the pool is imported", f.importWith(b, "pool", a.Name))
	return f, a, b
}

// A write is a verb on an import, with what undoes it when accepted.
type write struct {
	verb string
	do   func(f *fixture, b *Cluster) error
}

var writes = []write{
	{"create", func(f *fixture, b *Cluster) error {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": importsGVR.GroupVersion().String(), "kind": "InferencePoolImport",
			"metadata": map[string]any{"name": "not-exported", "namespace": f.ns, "labels": map[string]any{managedByLabel: managedByValue}},
			"spec":     map[string]any{},
		}}
		_, err := b.Dynamic.Resource(importsGVR).Namespace(f.ns).Create(f.ctx(), obj, metav1.CreateOptions{})
		return err
	}},
	{"update of status", func(f *fixture, b *Cluster) error {
		imp, err := f.getImport(b, "pool")
		if err != nil || imp == nil {
			return fmt.Errorf("reading the import to update it: %v", err)
		}
		_ = unstructured.SetNestedSlice(imp.Object, []any{map[string]any{
			"name":              "example.com/mci-conformance",
			"exportingClusters": []any{map[string]any{"name": notAMemberCluster}},
		}}, "status", "controllers")
		_, err = b.Dynamic.Resource(importsGVR).Namespace(f.ns).UpdateStatus(f.ctx(), imp, metav1.UpdateOptions{})
		return err
	}},
	{"delete", func(f *fixture, b *Cluster) error {
		return b.Dynamic.Resource(importsGVR).Namespace(f.ns).Delete(f.ctx(), "pool", metav1.DeleteOptions{})
	}},
}

func testWritesDoNotStick(t *T) {
	f, a, b := importedPool(t)
	for _, w := range writes {
		err := w.do(f, b)
		var status apierrors.APIStatus
		switch {
		case err != nil && errors.As(err, &status):
			t.Logf("%s refused: %d %s", w.verb, status.Status().Code, status.Status().Reason)
		case err != nil:
			t.Fatalf("%s: %v", w.verb, err)
		default:
			t.Logf("%s accepted: waiting for the controller to undo it", w.verb)
		}
		// Refused or not, within the poll timeout the imports are what the
		// exports say: the real one as exported, the made-up one absent.
		f.eventually(w.verb+": the import is what the export says", f.importWith(b, "pool", a.Name))
		f.eventually(w.verb+": an import no member exports does not exist", f.noImport(b, "not-exported"))
	}
}

func testWritesAre405(t *T) {
	f, _, b := importedPool(t)
	for _, w := range writes {
		err := w.do(f, b)
		if err == nil {
			t.Skipf("%s of an import was accepted: this implementation reconciles writes rather than refusing them (the Required test checks they do not stick)", w.verb)
		}
		var status apierrors.APIStatus
		if !errors.As(err, &status) || status.Status().Code != http.StatusMethodNotAllowed {
			t.Errorf("%s: want 405 MethodNotAllowed, got %v", w.verb, err)
		}
	}
}

func testUpstreamShape(t *T) {
	cs := t.Clusters()
	a, b := cs[0], cs[1]
	f := newFixture(t)
	f.createNamespace(a)
	f.createNamespace(b)
	// Follow b's namespace from before anything is exported, so that the
	// ADDED and MODIFIED events of the imports are decoded too.
	w, err := b.Dynamic.Resource(importsGVR).Namespace(f.ns).Watch(f.ctx(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watching imports in %s: %v", b.Name, err)
	}
	defer w.Stop()
	// Two imports in b (one exported by a, one by a and b) and one in a.
	f.exportPool(a, "first")
	f.exportPool(a, "second")
	f.exportPool(b, "second")
	f.eventually("b imports first", f.importWith(b, "first", a.Name))
	f.eventually("b imports second from a", f.importWith(b, "second", a.Name))
	f.eventually("a imports second from b", f.importWith(a, "second", b.Name))

	var problems []string
	check := func(source string, raw []byte) {
		for _, p := range checkUpstreamShape(raw) {
			problems = append(problems, source+": "+p)
		}
	}
	for _, c := range []*Cluster{a, b} {
		rc := c.Kube.Discovery().RESTClient()
		body, err := rc.Get().AbsPath(importsAPIPath, "namespaces", f.ns, "inferencepoolimports").DoRaw(f.ctx())
		if err != nil {
			t.Fatalf("LIST in %s: %v", c.Name, err)
		}
		var list struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Items      []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatalf("LIST in %s does not decode: %v", c.Name, err)
		}
		if list.Kind != "InferencePoolImportList" || list.APIVersion != importsGVR.GroupVersion().String() {
			problems = append(problems, fmt.Sprintf("LIST in %s: apiVersion %q kind %q, want %s InferencePoolImportList", c.Name, list.APIVersion, list.Kind, importsGVR.GroupVersion()))
		}
		for _, item := range list.Items {
			var meta metav1.PartialObjectMetadata
			if err := json.Unmarshal(item, &meta); err != nil {
				problems = append(problems, fmt.Sprintf("LIST in %s: an item does not decode: %v", c.Name, err))
				continue
			}
			// A list's items may omit apiVersion and kind: give them the list's.
			var obj map[string]any
			_ = json.Unmarshal(item, &obj)
			obj["apiVersion"], obj["kind"] = importsGVR.GroupVersion().String(), "InferencePoolImport"
			fixed, _ := json.Marshal(obj)
			check("LIST in "+c.Name, fixed)
			raw, err := rc.Get().AbsPath(importsAPIPath, "namespaces", f.ns, "inferencepoolimports", meta.Name).DoRaw(f.ctx())
			if err != nil {
				t.Fatalf("GET %s in %s: %v", meta.Name, c.Name, err)
			}
			check("GET in "+c.Name, raw)
		}
	}
	// The watch's events so far.
	events := 0
	deadline := time.After(time.Second)
drain:
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				break drain
			}
			if ev.Type == watch.Error {
				problems = append(problems, fmt.Sprintf("WATCH in %s: error event %v", b.Name, ev.Object))
				continue
			}
			obj, isUnstructured := ev.Object.(*unstructured.Unstructured)
			if !isUnstructured || (ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted) {
				continue
			}
			events++
			raw, _ := obj.MarshalJSON()
			check(fmt.Sprintf("WATCH %s in %s", ev.Type, b.Name), raw)
		case <-deadline:
			break drain
		}
	}
	if events == 0 {
		problems = append(problems, "WATCH in "+b.Name+": no event for the two imports that appeared")
	}
	if len(problems) > 0 {
		t.Errorf("%s", strings.Join(problems, "\n"))
	}
}

func testShortName(t *T, short string) {
	for _, c := range t.Clusters() {
		resources, err := c.Kube.Discovery().ServerResourcesForGroupVersion(importsGVR.GroupVersion().String())
		if err != nil {
			t.Fatalf("discovery of %s in %s: %v", importsGVR.GroupVersion(), c.Name, err)
		}
		var found bool
		for _, r := range resources.APIResources {
			if r.Name != importsGVR.Resource {
				continue
			}
			found = true
			if r.Kind != "InferencePoolImport" || !r.Namespaced {
				t.Errorf("%s: %s is kind %q, namespaced %v; want a namespaced InferencePoolImport", c.Name, r.Name, r.Kind, r.Namespaced)
			}
			if !slices.Contains(r.ShortNames, short) {
				t.Errorf("%s: %s has short names %v, want %s among them", c.Name, r.Name, r.ShortNames, short)
			}
		}
		if !found {
			t.Errorf("%s: discovery of %s has no %s", c.Name, importsGVR.GroupVersion(), importsGVR.Resource)
		}
	}
}

func testWatchResume(t *T) {
	a, b := t.Clusters()[0], t.Clusters()[1]
	f := newFixture(t)
	f.createNamespace(a)
	f.createNamespace(b)
	api := b.Dynamic.Resource(importsGVR).Namespace(f.ns)
	list, err := api.List(f.ctx(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing imports in %s: %v", b.Name, err)
	}
	// The changes happen before the watch starts: it must replay them.
	f.exportPool(a, "pool")
	f.eventually("the pool is imported", f.importWith(b, "pool", a.Name))
	f.deletePool(a, "pool")
	f.eventually("the import is withdrawn", f.noImport(b, "pool"))

	ctx, cancel := context.WithTimeout(f.ctx(), t.PollTimeout())
	defer cancel()
	w, err := api.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		t.Fatalf("a watch from a resourceVersion a few seconds old is refused as expired: %v", err)
	}
	if err != nil {
		t.Fatalf("watching imports in %s from resourceVersion %s: %v", b.Name, list.GetResourceVersion(), err)
	}
	defer w.Stop()
	var seen []string
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended before the import was added and deleted; events: %v", seen)
			}
			if ev.Type == watch.Error {
				t.Fatalf("the watch failed: %v (events before: %v)", apierrors.FromObject(ev.Object), seen)
			}
			obj, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || obj.GetName() != "pool" {
				continue
			}
			seen = append(seen, string(ev.Type))
			// A server may fold an addition and a deletion it replays
			// into the deletion (the client's cache ends the same): the
			// end state is what must arrive.
			if ev.Type == watch.Deleted {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the resumed watch did not deliver the import's addition and deletion within %s; events: %v", t.PollTimeout(), seen)
		}
	}
}
