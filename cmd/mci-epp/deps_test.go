package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMCIEPPDoesNotLinkTheClusterScoring keeps the Endpoint Picker apart
// from the sidecar's cluster policies: it shares only the prompt hashing
// and the prefix index (pkg/promptprefix), so a change to how clusters
// are scored neither rebuilds nor reaches the EPP.
func TestMCIEPPDoesNotLinkTheClusterScoring(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	var deps []string // mci's own packages, so that a failure names few
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/mci-dev/mci/") {
			deps = append(deps, pkg)
		}
	}
	assert.Contains(t, deps, "github.com/mci-dev/mci/pkg/promptprefix", "the list is mci-epp's own dependencies")
	assert.NotContains(t, deps, "github.com/mci-dev/mci/pkg/clusterscore")
}
