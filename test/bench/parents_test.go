package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/test/quantile"
)

var (
	gatewayGVR   = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	httpRouteGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
)

// importParentTarget is the target for an import's parents
// following an HTTPRoute change.
const importParentTarget = 100 * time.Millisecond

// importParentNames are the names of an import's parents in a watch event,
// as a client of the upstream shape reads them (status.controllers[].parents).
func importParentNames(u *unstructured.Unstructured) []string {
	controllers, _, _ := unstructured.NestedSlice(u.Object, "status", "controllers")
	var names []string
	for _, c := range controllers {
		m, _ := c.(map[string]any)
		parents, _, _ := unstructured.NestedSlice(m, "parents")
		for _, p := range parents {
			pm, _ := p.(map[string]any)
			name, _, _ := unstructured.NestedString(pm, "parentRef", "name")
			names = append(names, name)
		}
	}
	return names
}

// benchImportParents: an HTTPRoute in cluster-b moves from one local Gateway
// to another, until a watch of cluster-b's imports (through the aggregator)
// delivers the import with the new parent; against the single-hop floor,
// the route's own watch on cluster-b. Same method as benchConvergence:
// interleaved variants, a fresh watch from the current resourceVersion,
// latency from the write to the first event that shows it.
func benchImportParents(b *testing.B, e *env) {
	ctx := context.Background()
	n := len(e.names)
	const ns = "parents-mci"
	e.namespaceEverywhere(b, ns)
	_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(ns).Create(ctx, pool(ns, "routed", true), metav1.CreateOptions{})
	require.NoError(b, err)
	dynB := e.dyn["cluster-b"]
	for _, gw := range []string{"gw-on", "gw-off"} {
		_, err := dynB.Resource(gatewayGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
			"metadata": map[string]any{"name": gw, "namespace": ns},
			"spec": map[string]any{"gatewayClassName": "bench", "listeners": []any{
				map[string]any{"name": "http", "protocol": "HTTP", "port": int64(80)},
			}},
		}}, metav1.CreateOptions{})
		require.NoError(b, err)
	}
	// The floor's route uses no import that exists, so that only the
	// measured route makes the import's parents.
	route := func(name, gw string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec": map[string]any{
				"parentRefs": []any{map[string]any{"name": gw}},
				"rules": []any{map[string]any{"backendRefs": []any{map[string]any{
					"group": "inference.networking.x-k8s.io", "kind": "InferencePoolImport", "name": name,
				}}}},
			},
		}}
	}
	routes := dynB.Resource(httpRouteGVR).Namespace(ns)
	for _, name := range []string{"routed", "floor"} {
		_, err := routes.Create(ctx, route(name, "gw-off"), metav1.CreateOptions{})
		require.NoError(b, err)
	}
	imports := dynB.Resource(importGVR).Namespace(ns)
	require.NoError(b, pollFor(time.Minute, func() bool {
		u, err := imports.Get(ctx, "routed", metav1.GetOptions{})
		return err == nil && fmt.Sprint(importParentNames(u)) == "[gw-off]"
	}), "cluster-b's import never listed its route's Gateway as a parent")
	logf("import parents at %d clusters: %d samples per variant", n, cfg.ConvergenceSamples)

	gateway := func(on bool) string {
		if on {
			return "gw-on"
		}
		return "gw-off"
	}
	move := func(name string) func(bool) error {
		return func(on bool) error {
			patch := fmt.Sprintf(`{"spec":{"parentRefs":[{"name":%q}]}}`, gateway(on))
			_, err := routes.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}
	}
	vs := []*variant{
		{
			name:   "mci",
			w:      watchFrom(b, imports, metav1.ListOptions{}),
			change: move("routed"),
			seen: func(ev watch.Event, on bool) bool {
				u, ok := named(ev, "routed")
				return ok && ev.Type == watch.Modified && fmt.Sprint(importParentNames(u)) == "["+gateway(on)+"]"
			},
		},
		{
			name:   "floor",
			w:      watchFrom(b, routes, metav1.ListOptions{FieldSelector: "metadata.name=floor"}),
			change: move("floor"),
			seen: func(ev watch.Event, _ bool) bool {
				_, ok := named(ev, "floor")
				return ok && ev.Type == watch.Modified
			},
		},
	}
	interleave(b, cfg.ConvergenceSamples, vs)
	mci, floor := vs[0].lat, vs[1].lat
	const sec = "import parents"
	name := func(what string) string { return fmt.Sprintf("%d clusters: %s", n, what) }
	samples := fmt.Sprintf("%d samples each; an HTTPRoute in cluster-b moves to another Gateway, until a watch of cluster-b's imports shows the new parent", len(mci))
	results.compare(sec, name("p50 vs single-hop floor"), "ms", ms(median(mci)), "floor", ms(median(floor)), "", false, samples)
	results.compare(sec, name("p99 vs single-hop floor"), "ms", ms(quantile.Nearest(mci, 99)), "floor", ms(quantile.Nearest(floor, 99)),
		"< 100 ms", quantile.Nearest(mci, 99) < importParentTarget, samples)
}
