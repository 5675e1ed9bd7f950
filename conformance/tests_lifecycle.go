package conformance

// The lifecycle of an import: it exists exactly while another member
// exports the pool into a namespace the cluster has.

// Requirements quoted by the tests. "Seed" is the multi-cluster inference
// proposal this project implements; "upstream" is the Gateway API Inference
// Extension's proposal 1374 and its apix/v1alpha1 types.
const (
	reqCRUD = "Proposal, Workflow 2: the MCI controller CRUDs an InferencePoolImport of the exported pool's namespace/name in each member cluster " +
		"(upstream 1374, Export Controller: for each ClusterSet member cluster, CRUD InferencePoolImport, mirrored namespace/name)"
	reqNotExporter = "Proposal, Exporting Cluster example: exporting creates an InferencePoolImport in all clusters except the exporting cluster"
	reqNamespace   = "Proposal, Workflow 2: an import is created in a member cluster only if it contains the namespace of the exported InferencePool (namespace sameness)"
	reqWithdraw    = "Proposal, Export Annotations: inference.networking.x-k8s.io/export indicates the desire to export; " +
		"Ownership and Lifecycle: withdrawing the export garbage-collects the import"
	reqMerge = "Proposal, Workflow 2 and InferencePoolImport Naming: one import per namespace/name, with an entry for each cluster that exports a pool of that namespace/name " +
		"(upstream ImportController.exportingClusters: the clusters that exported the pools backing the import)"
)

func lifecycleTests() []Test {
	return []Test{
		{
			Name:        "an import exists in another member exactly while a pool is exported",
			Requirement: reqCRUD,
			Label:       Required,
			Run: func(t *T) {
				a, b := t.Clusters()[0], t.Clusters()[1]
				f := newFixture(t)
				f.createNamespace(a)
				f.createNamespace(b)
				f.createEPPService(a, "pool")
				f.createPool(a, "pool", nil)
				f.consistently("a pool without the export annotation is not imported", f.absenceWindow(), f.noImport(b, "pool"))
				clusterSet := exportClusterSet
				f.annotatePool(a, "pool", exportAnnotation, &clusterSet)
				f.eventually("the exported pool is imported by the other member", f.importWith(b, "pool", a.Name))
			},
		},
		{
			Name:        "the exporting cluster serves no import of its own pool",
			Requirement: reqNotExporter,
			Label:       Required,
			Run: func(t *T) {
				// importedPool waits for the other member's import first, so
				// that the exporter's absence is not that of a slow start.
				f, a, _ := importedPool(t)
				f.consistently("the exporter imports nothing of its own", f.absenceWindow(), f.noImport(a, "pool"))
			},
		},
		{
			Name:        "a member without the pool's namespace serves no import until the namespace is created",
			Requirement: reqNamespace,
			Label:       Required,
			Clusters:    3,
			Run: func(t *T) {
				a, b, c := t.Clusters()[0], t.Clusters()[1], t.Clusters()[2]
				f := newFixture(t)
				f.createNamespace(a)
				f.createNamespace(b)
				f.exportPool(a, "pool")
				f.eventually("the member with the namespace imports the pool", f.importWith(b, "pool", a.Name))
				f.consistently("the member without the namespace serves no import", f.absenceWindow(), f.noImport(c, "pool"))
				f.createNamespace(c)
				f.eventually("once the namespace exists, the import appears", f.importWith(c, "pool", a.Name))
			},
		},
		{
			Name:        "removing the export annotation withdraws the import",
			Requirement: reqWithdraw,
			Label:       Required,
			Run: func(t *T) {
				f, a, b := importedPool(t)
				f.annotatePool(a, "pool", exportAnnotation, nil)
				f.eventually("the import is gone with the annotation", f.noImport(b, "pool"))
			},
		},
		{
			Name:        "deleting the exported pool withdraws the import",
			Requirement: reqWithdraw,
			Label:       Required,
			Run: func(t *T) {
				f, a, b := importedPool(t)
				f.deletePool(a, "pool")
				f.eventually("the import is gone with the pool", f.noImport(b, "pool"))
			},
		},
		{
			Name:        "deleting the exporter's namespace withdraws the import",
			Requirement: reqWithdraw,
			Label:       Required,
			Run: func(t *T) {
				f, a, b := importedPool(t)
				f.deleteNamespace(a)
				f.eventually("the import is gone with the exporter's namespace", f.noImport(b, "pool"))
			},
		},
		{
			Name:        "an import lists every exporting cluster and drops one that withdraws",
			Requirement: reqMerge,
			Label:       Required,
			Clusters:    3,
			Run: func(t *T) {
				a, b, c := t.Clusters()[0], t.Clusters()[1], t.Clusters()[2]
				f := newFixture(t)
				for _, cl := range []*Cluster{a, b, c} {
					f.createNamespace(cl)
				}
				f.exportPool(a, "pool")
				f.exportPool(c, "pool")
				f.eventually("a member that does not export imports both exporters", f.importWith(b, "pool", a.Name, c.Name))
				f.eventually("an exporter imports the other exporter only", f.importWith(a, "pool", c.Name))
				f.eventually("an exporter imports the other exporter only", f.importWith(c, "pool", a.Name))
				f.deletePool(c, "pool")
				f.eventually("the withdrawn exporter is dropped", f.importWith(b, "pool", a.Name))
				f.eventually("the withdrawn exporter imports the remaining one", f.importWith(c, "pool", a.Name))
				f.eventually("the remaining exporter imports nothing", f.noImport(a, "pool"))
			},
		},
	}
}
