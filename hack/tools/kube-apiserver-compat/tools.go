//go:build tools

// Package tools records the kube-apiserver and kube-controller-manager
// commands as dependencies of this module so that `go build` resolves both
// from go.sum: the local ClusterSet runs them from the same k8s.io/kubernetes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
