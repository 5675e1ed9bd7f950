// Package routingpolicy is the vocabulary of cluster policies: how a
// policy is written (a named configuration, or an inline list such as
// "prefix-cache=3,in-flight=1,pick=two-choices"), the Config it stands
// for, its validation and its canonical form. It is the one place a
// policy's text is read: the sidecar's routing table parses the
// annotations and its flag with Parse, mci-apiserver checks what an
// exporter asks for and serves the Canonical form on the import, and
// pkg/clusterscore compiles a Config into a pipeline. It knows nothing of
// requests, clusters or Kubernetes objects.
package routingpolicy
