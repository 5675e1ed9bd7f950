package conformance

// Export scoping: the proposal's open question "Should we introduce an
// annotation to filter exporting to specific clusters in the ClusterSet?"
// answered with mci's annotation, which names the members that may import
// a pool.

const (
	reqScopeByName = "Proposal, Open Questions (Export scoping): an annotation on the exported InferencePool that limits which members " +
		"import it (mci.x-k8s.io/export-to, by cluster name): a named member imports it, another serves no import, and the " +
		"InferencePoolExport lists that member as not imported, with the reason"
	// exportToAnnotation limits an export to the members it names or
	// selects; its value is a JSON object with "clusters" and "selector".
	exportToAnnotation = "mci.x-k8s.io/export-to"
)

func scopeTests() []Test {
	return []Test{{
		Name:        "an export scoped to one member by name is imported there and nowhere else",
		Requirement: reqScopeByName,
		Label:       Optional,
		Run:         testScopeByName,
	}}
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
