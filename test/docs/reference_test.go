package docs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/hack/docgen"
)

const regenerate = "run hack/update-docs.sh and commit the result"

// clearPodNamespace makes the flag defaults read from POD_NAMESPACE those
// of the reference, generated without it.
func clearPodNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	require.NoError(t, os.Unsetenv("POD_NAMESPACE"))
}

// flagSections splits the flag reference into each binary's part.
func flagSections(t *testing.T) map[string]string {
	t.Helper()
	sections := map[string]string{}
	for _, part := range strings.Split(read(t, docgen.Dir+"/flags.md"), "\n## ")[1:] {
		name, body, _ := strings.Cut(part, "\n")
		sections[strings.TrimSpace(name)] = body
	}
	return sections
}

func TestEveryFlagOfEveryBinaryIsDocumented(t *testing.T) {
	clearPodNamespace(t)
	sections := flagSections(t)
	for _, bin := range docgen.Binaries() {
		t.Run(bin.Name, func(t *testing.T) {
			section, ok := sections[bin.Name]
			require.True(t, ok, "docs/reference/flags.md has no section for %s: %s", bin.Name, regenerate)
			for _, f := range bin.Flags {
				assert.True(t, strings.Contains(section, "`--"+f.Name+"`"), "%s --%s is not in docs/reference/flags.md: %s", bin.Name, f.Name, regenerate)
			}
		})
	}
}

func TestGeneratedReferencesAreCurrent(t *testing.T) {
	clearPodNamespace(t)
	pages, err := docgen.Pages()
	require.NoError(t, err)
	for path, want := range pages {
		t.Run(path, func(t *testing.T) {
			if got := read(t, path); got != string(want) {
				t.Errorf("%s is stale (%s); first difference:\n%s", path, regenerate, firstDifference(string(want), got))
			}
		})
	}
}

// helpFlag is a flag as cobra's --help lists it: "  -v, --v Level  ..." or
// "      --kubeconfig string  ...".
var helpFlag = regexp.MustCompile(`^\s+(?:-[a-zA-Z0-9], )?--([a-z0-9][a-z0-9-]*)`)

// TestBuiltBinariesHaveNoUndocumentedFlag asks the built binaries (make
// build, MCI_BIN_DIR) for their flags, so that a flag registered outside
// cmd/*/app (by a main, say) is caught too.
func TestBuiltBinariesHaveNoUndocumentedFlag(t *testing.T) {
	binDir := os.Getenv("MCI_BIN_DIR")
	if binDir == "" {
		t.Skip("MCI_BIN_DIR is not set (make test-docs sets it after make build)")
	}
	sections := flagSections(t)
	for name, section := range sections {
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(filepath.Join(binDir, name), "--help").CombinedOutput()
			require.NoError(t, err, "%s --help: %s", name, out)
			var flags int
			for _, line := range strings.Split(string(out), "\n") {
				m := helpFlag.FindStringSubmatch(line)
				if m == nil || m[1] == "help" {
					continue
				}
				flags++
				assert.True(t, strings.Contains(section, "`--"+m[1]+"`"), "%s --%s (from --help) is not in docs/reference/flags.md: %s", name, m[1], regenerate)
			}
			assert.NotZero(t, flags, "%s --help listed no flags", name)
		})
	}
}

// firstDifference shows the first line where the generated page and the
// committed one differ.
func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d\n  generated: %s\n  committed: %s", i+1, wl, gl)
		}
	}
	return "none"
}
