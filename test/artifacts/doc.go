// Package artifacts tests what artifacts/ ships for people to deploy: that
// the example Envoy configuration is one Envoy accepts and routes through
// mci-sidecar, and that the manifests carry it unchanged. Applying the
// manifests to a real kube-apiserver is tested in test/localclusterset, which
// runs one.
package artifacts
