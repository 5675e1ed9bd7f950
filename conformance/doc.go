// Package conformance is a portable conformance suite for InferencePoolImport
// (group inference.networking.x-k8s.io/v1alpha1) and the export annotation of
// InferencePool (inference.networking.k8s.io/v1): the multi-cluster inference
// proposal and the upstream Gateway API Inference Extension API.
//
// The suite knows nothing of any implementation. It talks only to the clusters
// named by --contexts (contexts of a kubeconfig, two at least, three for the
// tests that need a bystander), through the Kubernetes API as any client does,
// with dynamic clients and the upstream object shapes. It creates objects only
// in namespaces it creates (a random suffix), and deletes them afterwards.
//
// Every test names the requirement it checks and carries a label: Required
// (the upstream contract), Optional (the proposal's richer surface) or
// Extended (a data-path test). The suite runs under `go test ./conformance
// -args --contexts=a,b,c` and as the mci-conformance command; both write
// report.yaml and report.html into --report-dir. docs/conformance.md says how
// to run it and what each label means.
package conformance
