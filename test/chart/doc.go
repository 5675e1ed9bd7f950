// Package chart tests the Helm chart charts/mci with the helm CLI built from
// its Go module (hack/build-helm.sh): that it renders the same objects as
// the kustomize bases of artifacts/deploy for the same settings, that helm
// lint accepts it, and that a real kube-apiserver of a local ClusterSet
// admits what it renders (a server-side dry run). make test-chart runs it.
package chart
