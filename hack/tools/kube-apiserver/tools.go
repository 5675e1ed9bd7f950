//go:build tools

// Package tools records the kube-apiserver command as a dependency of this
// module so that `go build` resolves it from go.sum.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
