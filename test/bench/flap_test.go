package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/test/quantile"
)

var sliceGVR = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

// flapNamespaces: in the first the importing clusters have the namespace
// before the export; in the second they create it after the export (the
// case where summary mode was seen not to follow a later flap).
var flapNamespaces = []struct{ ns, label string }{
	{"flap-early", "namespace before the export"},
	{"flap-late", "importing namespace created after the export"},
}

// setupFlapPools creates, in cluster-a, an exported pool with a Ready EPP
// per mode in each flap namespace, and the floor's EPP Service, and
// returns once the importers have the late namespace.
func setupFlapPools(b *testing.B, e *env) {
	b.Helper()
	ctx := context.Background()
	a := e.kube["cluster-a"]
	e.namespaceEverywhere(b, flapNamespaces[0].ns)
	late := flapNamespaces[1].ns
	_, err := a.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: late}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(b, err)
	}
	for _, f := range flapNamespaces {
		for _, mode := range []string{modeSummary, modeFull} {
			_, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(f.ns).Create(ctx, pool(f.ns, mode, true), metav1.CreateOptions{})
			require.NoError(b, err)
			require.NoError(b, createEPPService(ctx, a, f.ns, mode+"-epp", "", true))
		}
	}
	require.NoError(b, createEPPService(ctx, a, flapNamespaces[0].ns, "floor-epp", "", true))
	// The export is in effect (its Exported status written) before the
	// importers create the namespace.
	require.NoError(b, pollFor(time.Minute, func() bool {
		pools, err := e.mci["cluster-a"].InferencePoolV1().InferencePools(late).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, p := range pools.Items {
			if len(p.Status.Parents) == 0 {
				return false
			}
		}
		return len(pools.Items) == 2
	}), "the Exported status of cluster-a's pools in %s", late)
	e.namespaceEverywhere(b, late)
}

// flapSeen recognises, in an observer's watch of imports, name's cluster-a
// entry with the readiness a flap to ready set.
func flapSeen(name string) func(watch.Event, bool) bool {
	return func(ev watch.Event, ready bool) bool {
		u, ok := named(ev, name)
		if !ok || ev.Type == watch.Deleted {
			return false
		}
		listed, r := importedFrom(u, "cluster-a")
		return listed && r == ready
	}
}

// benchFlapConvergence: a readiness flap of a pool's EPP endpoint in
// cluster-a (one EndpointSlice write) until each observer's import shows
// the new readiness, summary and full mode, in both flap namespaces,
// against the single-hop floor (the EndpointSlice's own watch on
// cluster-a). Samples start with a flap to not ready.
func benchFlapConvergence(b *testing.B, e *env) {
	ctx := context.Background()
	n := len(e.names)
	a := e.kube["cluster-a"]
	setupFlapPools(b, e)
	var vs []*variant
	for _, f := range flapNamespaces {
		for _, mode := range []string{modeSummary, modeFull} {
			obs := observer(mode)
			listed := pollFor(time.Minute, func() bool {
				u, err := e.dyn[obs].Resource(importGVR).Namespace(f.ns).Get(ctx, mode, metav1.GetOptions{})
				return err == nil && flapSeen(mode)(watch.Event{Type: watch.Modified, Object: u}, true)
			})
			if listed != nil {
				logf("flap convergence, %s mode, %s: %s's import of cluster-a never Ready: %v", mode, f.label, obs, listed)
			}
			ns, name := f.ns, mode
			vs = append(vs, &variant{
				name:   fmt.Sprintf("%s mode, %s", mode, f.label),
				w:      watchFrom(b, e.dyn[obs].Resource(importGVR).Namespace(ns), metav1.ListOptions{}),
				change: func(on bool) error { return setEndpointReady(ctx, a, ns, name+"-epp", !on) },
				seen:   func(ev watch.Event, on bool) bool { return flapSeen(name)(ev, !on) },
			})
		}
	}
	floorNS := flapNamespaces[0].ns
	floor := &variant{
		name:   "floor",
		w:      watchFrom(b, e.dyn["cluster-a"].Resource(sliceGVR).Namespace(floorNS), metav1.ListOptions{FieldSelector: "metadata.name=floor-epp-1"}),
		change: func(on bool) error { return setEndpointReady(ctx, a, floorNS, "floor-epp", !on) },
		seen: func(ev watch.Event, _ bool) bool {
			_, ok := named(ev, "floor-epp-1")
			return ok && ev.Type == watch.Modified
		},
	}
	logf("readiness flap convergence at %d clusters: %d samples per variant", n, cfg.ConvergenceSamples)
	interleave(b, cfg.ConvergenceSamples, append(slices.Clone(vs), floor))
	for _, v := range vs {
		if v.name == fmt.Sprintf("%s mode, %s", modeSummary, flapNamespaces[0].label) {
			results.fact(modeSummary+"."+factFlapP99, ms(quantile.Nearest(v.lat, 99)))
		}
		reportAgainstFloor("convergence", fmt.Sprintf("%d clusters, readiness flap, %s: ", n, v.name), v, floor, nil)
	}
}

// importState is what an importer's LIST of ns says of pool name: whether
// cluster-a is listed.
func (e *env) listsClusterA(ctx context.Context, importer, ns, name string) bool {
	u, err := e.dyn[importer].Resource(importGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	listed, _ := importedFrom(u, "cluster-a")
	return listed
}

// untilAll polls every importer until want(importer) holds and returns,
// per importer, how long after t0 it first did (sampleTimeout... a minute
// at most; an importer that never does is returned as missing).
func untilAll(importers []string, t0 time.Time, want func(string) bool) (map[string]time.Duration, []string) {
	got := map[string]time.Duration{}
	deadline := t0.Add(time.Minute)
	for time.Now().Before(deadline) && len(got) < len(importers) {
		for _, c := range importers {
			if _, ok := got[c]; !ok && want(c) {
				got[c] = time.Since(t0)
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	var missing []string
	for _, c := range importers {
		if _, ok := got[c]; !ok {
			missing = append(missing, c)
		}
	}
	return got, missing
}

// byMode sorts per-importer times into the two modes' latest.
func byMode(e *env, got map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	modes := readerModes(e.names)
	for c, d := range got {
		mode := modeFull
		if modes[c] == "auto" {
			mode = modeSummary
		}
		out[mode] = max(out[mode], d)
	}
	return out
}
