package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is the repository root, two levels above this package.
const repoRoot = "../.."

// plotsDir is where the plots of docs/performance.md are checked in.
var plotsDir = filepath.Join(repoRoot, "docs", "images", "performance")

// checkedIn returns the checked-in plots by file name.
func checkedIn(t *testing.T) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(plotsDir)
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".svg") {
			data, err := os.ReadFile(filepath.Join(plotsDir, e.Name()))
			require.NoError(t, err)
			out[e.Name()] = data
		}
	}
	require.NotEmpty(t, out, "no plot is checked in under %s", plotsDir)
	return out
}

func TestEveryCheckedInPlotIsWhatItsResultsDraw(t *testing.T) {
	for file, svg := range checkedIn(t) {
		t.Run(file, func(t *testing.T) {
			source, err := SourceOf(svg)
			require.NoError(t, err)
			data, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(source)))
			require.NoError(t, err, "the plot names results that are not in the repository")
			drawn, err := Render(data, source)
			require.NoError(t, err)
			require.Contains(t, drawn, file, "hack/plots no longer draws this plot: delete it or run make plots")
			assert.True(t, string(drawn[file]) == string(svg),
				"%s differs from what %s draws: run make plots (or restore the results it names)", file, source)
		})
	}
}

func TestEveryPlotItsResultsDrawIsCheckedIn(t *testing.T) {
	plots := checkedIn(t)
	sources := map[string]bool{}
	for _, svg := range plots {
		source, err := SourceOf(svg)
		require.NoError(t, err)
		sources[source] = true
	}
	assert.Len(t, sources, 2, "the plots are drawn from one make bench and one make bench-routing")
	for source := range sources {
		data, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(source)))
		require.NoError(t, err)
		drawn, err := Render(data, source)
		require.NoError(t, err)
		for file := range drawn {
			assert.Contains(t, plots, file, "%s draws %s, which is not checked in: run make plots", source, file)
		}
	}
}

func TestDrawingTheSameResultsTwiceGivesTheSameBytes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "docs", "performance-data", benchResults))
	require.NoError(t, err)
	first, err := Render(data, "results.json")
	require.NoError(t, err)
	second, err := Render(data, "results.json")
	require.NoError(t, err)
	assert.Equal(t, first, second)
}

const (
	benchResults   = "bench-2026-11-28T0442Z.json"
	routingResults = "bench-routing-2026-11-28T1341Z.json"
)

// edit returns the checked-in results of make bench with fn applied to them.
func edit(t *testing.T, fn func(rep map[string]any)) []byte {
	t.Helper()
	return editFile(t, benchResults, fn)
}

// editFile returns a checked-in results file with fn applied to it.
func editFile(t *testing.T, file string, fn func(rep map[string]any)) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docs", "performance-data", file))
	require.NoError(t, err)
	var rep map[string]any
	require.NoError(t, json.Unmarshal(data, &rep))
	fn(rep)
	out, err := json.Marshal(rep)
	require.NoError(t, err)
	return out
}

func TestAChangedFigureChangesItsPlot(t *testing.T) {
	const name = "20 clusters, summary mode, export change: p99 vs single-hop floor"
	changed := edit(t, func(rep map[string]any) {
		for _, r := range rep["results"].([]any) {
			if row := r.(map[string]any); row["name"] == name {
				row["value"] = 250.0
			}
		}
	})
	const source = "docs/performance-data/bench-2026-11-28T0442Z.json"
	drawn, err := Render(changed, source)
	require.NoError(t, err)
	assert.NotEqual(t, string(checkedIn(t)["convergence.svg"]), string(drawn["convergence.svg"]))
	assert.Equal(t, string(checkedIn(t)["memory.svg"]), string(drawn["memory.svg"]), "a figure the plot does not show left it unchanged")
}

func TestResultsThatCannotBeDrawnAreRefusedWithTheReason(t *testing.T) {
	tests := []struct {
		name    string
		data    []byte
		wantErr string
	}{
		{
			name:    "not JSON",
			data:    []byte("{"),
			wantErr: "reading the results",
		},
		{
			name: "a row the plots need is missing",
			data: edit(t, func(rep map[string]any) {
				var kept []any
				for _, r := range rep["results"].([]any) {
					if !strings.HasPrefix(r.(map[string]any)["name"].(string), "p99 latency, gateway -> sidecar") {
						kept = append(kept, r)
					}
				}
				rep["results"] = kept
			}),
			wantErr: `no result "p99 latency, gateway -> sidecar -> EPP -> simulator"`,
		},
		{
			name: "a row is in another unit",
			data: edit(t, func(rep map[string]any) {
				for _, r := range rep["results"].([]any) {
					if row := r.(map[string]any); strings.HasPrefix(row["name"].(string), "3 clusters, full mode, export change: p99") {
						row["unit"] = "s"
					}
				}
			}),
			wantErr: "is in s, the plot expects ms",
		},
		{
			name:    "neither kind of results",
			data:    []byte(`{"started": "2026-11-28T04:42:11Z"}`),
			wantErr: "hold neither bench results nor routing workloads",
		},
		{
			name: "a routing lacks its hit ratio on a workload with shared prefixes",
			data: editFile(t, routingResults, func(rep map[string]any) {
				w := rep["workloads"].(map[string]any)["far-remote"].(map[string]any)
				delete(w["policies"].(map[string]any)["HubReference"].(map[string]any), "prefix_hit_ratio")
			}),
			wantErr: `workload "far-remote" has no hit ratio of HubReference`,
		},
		{
			name: "a baseline is missing",
			data: edit(t, func(rep map[string]any) {
				for _, r := range rep["results"].([]any) {
					if row := r.(map[string]any); row["name"] == "p50 latency, gateway -> sidecar -> EPP -> simulator" {
						delete(row, "baselineValue")
					}
				}
			}),
			wantErr: "has no baseline value",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(tt.data, "results.json")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestAnSVGNotDrawnHereNamesNoResults(t *testing.T) {
	_, err := SourceOf([]byte(`<?xml version="1.0"?><svg></svg>`))
	assert.ErrorContains(t, err, "names no results file")
}

func TestTheResultsOfARunAreKeptAndThePlotsNameTheCopy(t *testing.T) {
	tests := []struct {
		target, file, plot string
	}{
		{target: "bench", file: benchResults, plot: "convergence.svg"},
		{target: "bench-routing", file: routingResults, plot: "routing-hit-ratio.svg"},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			dir := t.TempDir()
			results := filepath.Join(dir, "_output", tt.target, "results.json")
			require.NoError(t, os.MkdirAll(filepath.Dir(results), 0o755))
			require.NoError(t, os.WriteFile(results, editFile(t, tt.file, func(map[string]any) {}), 0o644))
			keep, out := filepath.Join(dir, "kept"), filepath.Join(dir, "plots")

			require.NoError(t, run(results, keep, out))

			kept := filepath.ToSlash(filepath.Join(keep, tt.file))
			assert.FileExists(t, kept, "the copy is named by its make target and the run's start")
			svg, err := os.ReadFile(filepath.Join(out, tt.plot))
			require.NoError(t, err)
			source, err := SourceOf(svg)
			require.NoError(t, err)
			assert.Equal(t, kept, source)
		})
	}
}

func TestAFailedRunIsNotDrawn(t *testing.T) {
	dir := t.TempDir()
	results := filepath.Join(dir, "results.json")
	require.NoError(t, os.WriteFile(results, edit(t, func(rep map[string]any) { rep["failed"] = true }), 0o644))

	err := run(results, filepath.Join(dir, "kept"), filepath.Join(dir, "plots"))

	assert.ErrorContains(t, err, "missed a target or failed")
	assert.NoDirExists(t, filepath.Join(dir, "plots"))
}
