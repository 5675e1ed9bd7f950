package artifacts

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// Every manifest of a component directory is installed by its
// kustomization (`kubectl apply -k`): a file added beside the others but
// not listed would silently not be installed.
func TestKustomizationsListEveryManifestOfTheirComponent(t *testing.T) {
	for _, component := range []string{"mci-apiserver", "mci-sidecar", "mci-epp"} {
		t.Run(component, func(t *testing.T) {
			dir := filepath.Join("..", "..", "artifacts", "deploy", component)
			data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
			require.NoError(t, err)
			var k struct {
				Resources []string `json:"resources"`
			}
			require.NoError(t, yaml.Unmarshal(data, &k))
			files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
			require.NoError(t, err)
			var manifests []string
			for _, f := range files {
				if filepath.Base(f) != "kustomization.yaml" {
					manifests = append(manifests, filepath.Base(f))
				}
			}
			assert.ElementsMatch(t, manifests, k.Resources)
		})
	}
}
