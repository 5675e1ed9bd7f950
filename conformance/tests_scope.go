package conformance

// Export scoping: the proposal's open question "Should we introduce an
// annotation to filter exporting to specific clusters in the ClusterSet?"
// answered with mci's annotation, which names the members that may import
// a pool or selects them by label; and per-cluster export configuration,
// the exporter's weight, region and tags carried to its importers.

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const (
	reqScopeByName = "Proposal, Open Questions (Export scoping): an annotation on the exported InferencePool that limits which members " +
		"import it (mci.x-k8s.io/export-to, by cluster name): a named member imports it, another serves no import, and the " +
		"InferencePoolExport lists that member as not imported, with the reason"
	reqScopeBySelector = "Proposal, Open Questions (Export scoping): an annotation on the exported InferencePool that limits which members " +
		"import it (mci.x-k8s.io/export-to, by a label selector matched against each member's labels in the ClusterSet): the members " +
		"whose labels match import it, no other member serves an import, the InferencePoolExport lists those as not imported, with the " +
		"reason, and a changed selector moves the import to the members it now selects"
	// exportToAnnotation limits an export to the members it names or
	// selects; its value is a JSON object with "clusters" and "selector".
	exportToAnnotation = "mci.x-k8s.io/export-to"

	reqExportSettings = "Proposal, Open Questions (per-cluster export configuration: weights, region, SLO tags): an exporter's " +
		"mci.x-k8s.io/export-settings (weight, region, tags) reach importers on its status.clusters[] entry as exportSettings; " +
		"settings that cannot be read leave the export served, without them, and the entry says so (ExportSettingsAccepted False, " +
		"reason InvalidExportSettings)"
	// exportSettingsAnnotation states the exporter's weight, region and
	// tags: a JSON object with "weight", "region" and "tags".
	exportSettingsAnnotation = "mci.x-k8s.io/export-settings"
)

func scopeTests() []Test {
	return []Test{{
		Name:        "an export scoped to one member by name is imported there and nowhere else",
		Requirement: reqScopeByName,
		Label:       Optional,
		Run:         testScopeByName,
	}, {
		Name:        "an export scoped by a label selector is imported by the members whose labels match and by no other",
		Requirement: reqScopeBySelector,
		Label:       Optional,
		Clusters:    3,
		Run:         testScopeBySelector,
	}, {
		Name:        "an exporter's weight, region and tags reach importers, and unreadable ones leave the export served and say so",
		Requirement: reqExportSettings,
		Label:       Optional,
		Run:         testExportSettings,
	}}
}

func testExportSettings(t *T) {
	cs := t.Clusters()
	a, b := cs[0], cs[1]
	f := newFixture(t)
	f.createNamespace(a)
	f.createNamespace(b)
	f.createEPPService(a, "pool")
	f.createPool(a, "pool", map[string]string{
		exportAnnotation:         exportClusterSet,
		exportSettingsAnnotation: `{"weight": 3, "region": "eu-west-1", "tags": {"slo": "gold"}}`,
	})
	want := map[string]any{"weight": int64(3), "region": "eu-west-1", "tags": map[string]any{"slo": "gold"}}
	f.eventually(b.Name+"'s entry of "+a.Name+" carries its settings", f.clusterEntry(b, "pool", a.Name, func(entry map[string]any) (bool, string) {
		got, _, _ := unstructured.NestedMap(entry, "exportSettings")
		return reflect.DeepEqual(got, want), fmt.Sprintf("exportSettings %v, want %v", got, want)
	}))

	bad := `{"weight": 0, "region": "eu-west-1"}`
	f.annotatePool(a, "pool", exportSettingsAnnotation, &bad)
	f.eventually(b.Name+"'s entry of "+a.Name+" drops settings it cannot read and says so", f.clusterEntry(b, "pool", a.Name, func(entry map[string]any) (bool, string) {
		got, found, _ := unstructured.NestedMap(entry, "exportSettings")
		conditions, _, _ := unstructured.NestedSlice(entry, "conditions")
		for _, rc := range conditions {
			c, _ := rc.(map[string]any)
			if c["type"] == "ExportSettingsAccepted" && c["status"] == "False" && c["reason"] == "InvalidExportSettings" && !found {
				return true, ""
			}
		}
		return false, fmt.Sprintf("exportSettings %v (present: %t), conditions %v", got, found, conditions)
	}))
	f.eventually(b.Name+" still imports the pool from "+a.Name, f.importWith(b, "pool", a.Name))
}

// clusterEntry holds when c's import name has a status.clusters[] entry
// of cluster that ok accepts; it skips the test where imports have no
// status.clusters (the upstream shape only).
func (f *fixture) clusterEntry(c *Cluster, name, cluster string, ok func(entry map[string]any) (bool, string)) condition {
	return func(ctx context.Context) (bool, string) {
		imp, err := f.getImport(c, name)
		if err != nil || imp == nil {
			return false, fmt.Sprintf("%s's import %s/%s: %v (served: %t)", c.Name, f.ns, name, err, imp != nil)
		}
		clusters, found, _ := unstructured.NestedSlice(imp.Object, "status", "clusters")
		if !found {
			f.t.Skipf("the import has no status.clusters: this implementation serves the upstream shape only")
		}
		for _, rc := range clusters {
			entry, _ := rc.(map[string]any)
			if entry["name"] == cluster {
				return ok(entry)
			}
		}
		return false, fmt.Sprintf("%s's import %s/%s has no entry of %s", c.Name, f.ns, name, cluster)
	}
}

func testScopeByName(t *T) {
	cs := t.Clusters()
	if len(cs) < 3 {
		t.Skipf("needs 3 clusters (an exporter, a member in the scope and one outside it), got %d", len(cs))
	}
	a, in, out := cs[0], cs[1], cs[len(cs)-1]
	f := newFixture(t)
	for _, c := range cs {
		f.createNamespace(c)
	}
	f.createEPPService(a, "pool")
	f.createPool(a, "pool", map[string]string{
		exportAnnotation:   exportClusterSet,
		exportToAnnotation: `{"clusters": ["` + in.Name + `"]}`,
	})
	f.eventually(in.Name+" imports the pool from "+a.Name, f.importWith(in, "pool", a.Name))
	f.consistently(out.Name+" serves no import of the pool", f.absenceWindow(), f.noImport(out, "pool"))
	if serves(t, a, exportsGVR) {
		f.eventually("the export lists "+out.Name+" as not imported and why", f.exportTargets(a, out.Name, false))
		f.eventually("the export lists "+in.Name+" as imported", f.exportTargets(a, in.Name, true))
	}

	// Widening the scope to the outside member imports it there too.
	value := `{"clusters": ["` + in.Name + `", "` + out.Name + `"]}`
	f.annotatePool(a, "pool", exportToAnnotation, &value)
	f.eventually(out.Name+" imports the pool once the scope names it", f.importWith(out, "pool", a.Name))
}

// testScopeBySelector scopes an export by a label selector. Which labels a
// member has is the ClusterSet's (a ClusterProfile's labels, a member
// Secret's, a fleet inventory's), and the suite reads no implementation's
// objects, so the runner states them with --member-labels and the test
// picks a selector from them: one label that some members other than the
// exporter have and others lack, so that both sides of the scope are
// seen. Without --member-labels, or without such a label, it is skipped,
// saying why.
//
// A member's labels are not changed by the test: how is the ClusterSet's,
// and a hook for it (as for members leaving) would test the runner's
// command more than the scope. The selector is changed instead, to its
// negation, which moves the import from the members it selected to the
// others: the same rule, evaluated again on a change.
func testScopeBySelector(t *T) {
	cs := t.Clusters()
	a, others := cs[0], cs[1:]
	given := t.suite.cfg.MemberLabels
	if len(given) == 0 {
		t.Skipf("no --member-labels: the runner has not said which labels the members have in this ClusterSet")
	}
	var missing []string
	for _, c := range cs {
		if _, ok := given[c.Name]; !ok {
			missing = append(missing, c.Name)
		}
	}
	if len(missing) > 0 {
		t.Skipf("--member-labels names no labels for %s: name every member under test (<member>: for one without labels), or a member left out might match the selector", strings.Join(missing, ", "))
	}
	key, value, ok := splittingLabel(given, others)
	if !ok {
		t.Skipf("no label of --member-labels is had by some of %s and not by the others: the test needs a member in the selector's scope and one outside it", strings.Join(names(others...), ", "))
	}
	selected := func(c *Cluster) bool { return given[c.Name][key] == value }

	f := newFixture(t)
	for _, c := range cs {
		f.createNamespace(c)
	}
	f.createEPPService(a, "pool")
	scope := func(selector string) string { return `{"selector": "` + selector + `"}` }
	f.createPool(a, "pool", map[string]string{
		exportAnnotation:   exportClusterSet,
		exportToAnnotation: scope(key + "=" + value),
	})
	exportsListed := serves(t, a, exportsGVR)
	check := func(selector string, in func(*Cluster) bool) {
		for _, c := range others {
			if in(c) {
				f.eventually(c.Name+" imports the pool, its labels matching "+selector, f.importWith(c, "pool", a.Name))
			} else {
				f.eventually(c.Name+" serves no import of the pool, its labels not matching "+selector, f.noImport(c, "pool"))
			}
		}
		for _, c := range others {
			if !in(c) {
				f.consistently(c.Name+" serves no import of the pool under "+selector, f.absenceWindow(), f.noImport(c, "pool"))
			}
		}
		if exportsListed {
			for _, c := range others {
				what := "the export lists " + c.Name + " as imported under " + selector
				if !in(c) {
					what = "the export lists " + c.Name + " as not imported under " + selector + ", and why"
				}
				f.eventually(what, f.exportTargets(a, c.Name, in(c)))
			}
		}
	}
	check(key+"="+value, selected)

	// The negated selector moves the import to the members it left out.
	negated := scope(key + "!=" + value)
	f.annotatePool(a, "pool", exportToAnnotation, &negated)
	check(key+"!="+value, func(c *Cluster) bool { return !selected(c) })
}

// splittingLabel finds a label key=value that some of cs have and others
// do not, the first in the order of cs and of keys.
func splittingLabel(given map[string]map[string]string, cs []*Cluster) (key, value string, ok bool) {
	for _, c := range cs {
		keys := make([]string, 0, len(given[c.Name]))
		for k := range given[c.Name] {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := given[c.Name][k]
			if slices.ContainsFunc(cs, func(o *Cluster) bool { return given[o.Name][k] != v }) {
				return k, v, true
			}
		}
	}
	return "", "", false
}
