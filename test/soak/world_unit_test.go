package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// TestAPoolWithdrawnDuringTheListIsNotLost replays a poll that snapshots
// the world while cluster-c is paused, then lists cluster-b's imports
// after a withdrawal in cluster-c went through: the LIST rightly leaves
// cluster-c out of the withdrawn pool, which is no loss; a pool kept
// throughout and left out is.
func TestAPoolWithdrawnDuringTheListIsNotLost(t *testing.T) {
	w := newWorld([]string{"cluster-b", "cluster-c"})
	w.setExported("cluster-c", "soak/p-1", true)
	w.setExported("cluster-c", "soak/p-2", true)
	w.mu.Lock()
	for key := range w.changed {
		w.changed[key] = w.changed[key].Add(-10 * time.Second) // exported well before the fault
	}
	w.mu.Unlock()
	w.pause("cluster-c", 1)
	before := w.snapshot()
	assert.ElementsMatch(t, []string{"soak/p-1", "soak/p-2"}, before.kept["cluster-b"]["cluster-c"])

	w.setExported("cluster-c", "soak/p-2", false)
	listed := []*v1alpha1.InferencePoolImport{imported("soak", "p-1", "cluster-c")}

	assert.Equal(t, []string{"cluster-b's import soak/p-2 without cluster-c"}, before.lost("cluster-b", listed), "the snapshot alone counts the withdrawn pool")
	assert.Empty(t, before.keptThroughout(w.snapshot()).lost("cluster-b", listed))
	assert.Equal(t, []string{"cluster-b's import soak/p-1 without cluster-c"}, before.keptThroughout(w.snapshot()).lost("cluster-b", nil), "a pool kept throughout and not listed is lost")
}

func imported(ns, name string, clusters ...string) *v1alpha1.InferencePoolImport {
	imp := &v1alpha1.InferencePoolImport{}
	imp.Namespace, imp.Name = ns, name
	for _, c := range clusters {
		imp.Status.Clusters = append(imp.Status.Clusters, v1alpha1.ImportedCluster{Name: c})
	}
	return imp
}

// TestAFaultWaitsForTheFaultBeforeItOnItsResources: a rolling upgrade of
// cluster-a waits while a restart of its replica 1 has not healed; a
// partition elsewhere does not.
func TestAFaultWaitsForTheFaultBeforeItOnItsResources(t *testing.T) {
	in := &injector{}
	release := in.holdResources(fault{Kind: restart, Watcher: "cluster-a", Target: "1"})
	upgraded := make(chan struct{})
	go func() {
		in.holdResources(fault{Kind: upgrade, Target: "cluster-a"})()
		close(upgraded)
	}()
	in.holdResources(fault{Kind: partition, Watcher: "cluster-b", Target: "cluster-c"})()
	select {
	case <-upgraded:
		t.Fatal("the upgrade started while the restart of one of its replicas held")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	select {
	case <-upgraded:
	case <-time.After(5 * time.Second):
		t.Fatal("the upgrade did not start once the restart healed")
	}
}
