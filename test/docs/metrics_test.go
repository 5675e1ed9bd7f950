package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	metricName = regexp.MustCompile(`"(mci_[a-z0-9_]+)"`)
	// trackerPrefix is an informerhealth.NewTracker prefix, which names
	// <prefix>_watch_reachable and <prefix>_watch_failures_total.
	trackerPrefix = regexp.MustCompile(`NewTracker\("(mci_[a-z0-9_]+)"\)`)
	// binaryPrefix is a prefix alone, not a metric.
	binaryPrefix = regexp.MustCompile(`^mci_(apiserver|sidecar|epp)$`)
)

// codeMetrics returns the mci metric names that the non-test Go files of
// pkg/ and cmd/ register.
func codeMetrics(t *testing.T) []string {
	t.Helper()
	names := map[string]bool{}
	for _, dir := range []string{"pkg", "cmd"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range metricName.FindAllStringSubmatch(string(b), -1) {
				if !binaryPrefix.MatchString(m[1]) {
					names[m[1]] = true
				}
			}
			for _, m := range trackerPrefix.FindAllStringSubmatch(string(b), -1) {
				names[m[1]+"_watch_reachable"] = true
				names[m[1]+"_watch_failures_total"] = true
			}
			return nil
		})
		require.NoError(t, err)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// TestEveryMetricIsDocumented holds docs/operations.md to the metrics the
// code registers, so that a new metric comes with its meaning.
func TestEveryMetricIsDocumented(t *testing.T) {
	page := read(t, "docs/operations.md")
	metrics := codeMetrics(t)
	require.NotEmpty(t, metrics, "no metric found in the code: the scan is broken")
	for _, name := range metrics {
		assert.True(t, strings.Contains(page, "`"+name+"`"), "metric %s is not documented in docs/operations.md", name)
	}
}
