//go:build tools

// Package tools records the helm command as a dependency of this module so
// that `go build` resolves it from go.sum. Helm lives in its own tools module
// so that its k8s.io dependency versions never move those of mci's go.mod.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
