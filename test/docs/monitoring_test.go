package docs

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

const (
	alertsFile    = "charts/mci/files/alerts.yaml"
	dashboardFile = "charts/mci/files/dashboard.json"
)

// alertRule is a rule of the alerts file, as Prometheus reads it.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// alertRules reads the rules of the alerts file, the one source of mci's
// alerts.
func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.UnmarshalStrict([]byte(read(t, alertsFile)), &file, yaml.DisallowUnknownFields), alertsFile)
	var rules []alertRule
	for _, g := range file.Groups {
		rules = append(rules, g.Rules...)
	}
	require.NotEmpty(t, rules, "no rule in %s", alertsFile)
	return rules
}

// dashboardExprs returns the query of every target of every panel of the
// dashboard, rows' nested panels included.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	require.NoError(t, json.Unmarshal([]byte(read(t, dashboardFile)), &dash), dashboardFile)
	exprs := map[string]string{}
	var walk func([]json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			require.NoError(t, json.Unmarshal(r, &p))
			for i, target := range p.Targets {
				require.NotEmpty(t, target.Expr, "panel %q, target %d has no query", p.Title, i)
				exprs[p.Title+"/"+string(rune('A'+i))] = target.Expr
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	require.NotEmpty(t, exprs, "no query in %s", dashboardFile)
	return exprs
}

var (
	// What names no metric in PromQL: string literals, label matchers,
	// ranges and the label lists of grouping and vector matching.
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlLabels   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	// promqlKeywords are the binary operators and modifiers spelt as words.
	promqlKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
	// histogramSeries are the series a histogram exposes besides its name.
	histogramSeries = regexp.MustCompile(`_(?:bucket|sum|count)$`)
)

// promqlMetrics returns the metric names a PromQL expression selects: the
// identifiers left once strings, matchers, ranges and label lists are cut,
// that are not a function or aggregation (followed by a parenthesis) or an
// operator word.
func promqlMetrics(expr string) []string {
	s := promqlString.ReplaceAllString(expr, " ")
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRange.ReplaceAllString(s, " ")
	s = promqlLabels.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promqlIdent.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if loc[0] > 0 && (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9' || s[loc[0]-1] == '.') {
			continue // a unit or exponent of a number (5m, 1e3)
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue
		}
		if slices.Contains(promqlKeywords, strings.ToLower(name)) {
			continue
		}
		names = append(names, name)
	}
	return names
}

// registered says whether name is a metric the code registers, or a series
// of a histogram it registers.
func registered(metrics []string, name string) bool {
	if slices.Contains(metrics, name) {
		return true
	}
	base := histogramSeries.ReplaceAllString(name, "")
	return base != name && slices.Contains(metrics, base)
}

func TestPromQLMetricsFindsTheMetricsOfAnExpression(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`mci_a == 1`, []string{"mci_a"}},
		{`histogram_quantile(0.99, sum by (le) (rate(mci_b_bucket{cluster="x|y"}[5m])))`, []string{"mci_b_bucket"}},
		{`sum(mci_c) == 0 and on() sum(mci_d) > 0`, []string{"mci_c", "mci_d"}},
		{`mci_e - time() < 30*24*3600`, []string{"mci_e"}},
		{`count by (pod) (mci_f == 0) or vector(0)`, []string{"mci_f"}},
		{`max without (instance) (mci_g offset 5m)`, []string{"mci_g"}},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			assert.Equal(t, tc.want, promqlMetrics(tc.expr))
		})
	}
}

// Every alert names metrics that mci registers, and only those: an alert on
// a metric renamed or removed would never fire.
func TestEveryAlertNamesRegisteredMetrics(t *testing.T) {
	metrics := codeMetrics(t)
	for _, r := range alertRules(t) {
		t.Run(r.Alert, func(t *testing.T) {
			names := promqlMetrics(r.Expr)
			require.NotEmpty(t, names, "%s names no metric", r.Expr)
			for _, n := range names {
				assert.True(t, registered(metrics, n), "%s: %s is not a metric mci registers", r.Expr, n)
			}
			assert.NotEmpty(t, r.For, "for")
			assert.NotEmpty(t, r.Annotations["summary"], "summary")
		})
	}
}

// Every query of the Grafana dashboard names metrics that mci registers,
// and only those: a panel on a metric renamed or removed would be blank.
func TestEveryDashboardQueryNamesRegisteredMetrics(t *testing.T) {
	metrics := codeMetrics(t)
	for panel, expr := range dashboardExprs(t) {
		t.Run(panel, func(t *testing.T) {
			names := promqlMetrics(expr)
			require.NotEmpty(t, names, "%s names no metric", expr)
			for _, n := range names {
				assert.True(t, registered(metrics, n), "%s: %s is not a metric mci registers", expr, n)
			}
		})
	}
}

// The alert table of docs/operations.md is the alerts file's, row for row:
// name, expression, for and summary.
func TestTheAlertTableIsTheAlertsFile(t *testing.T) {
	page := read(t, "docs/operations.md")
	start := strings.Index(page, "\n## Alerts\n")
	require.GreaterOrEqual(t, start, 0, "docs/operations.md has no Alerts section")
	section := page[start+len("\n## Alerts\n"):]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var table []alertRule
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := splitRow(line)
		require.Len(t, cells, 4, "row %q", line)
		table = append(table, alertRule{
			Alert:       strings.Trim(cells[0], "`"),
			Expr:        strings.Trim(cells[1], "`"),
			For:         cells[2],
			Annotations: map[string]string{"summary": cells[3]},
		})
	}
	var want []alertRule
	for _, r := range alertRules(t) {
		want = append(want, alertRule{Alert: r.Alert, Expr: r.Expr, For: r.For, Annotations: map[string]string{"summary": r.Annotations["summary"]}})
	}
	assert.Equal(t, want, table, "docs/operations.md's alert table (actual) against %s (expected)", alertsFile)
}

// splitRow splits a Markdown table row into its trimmed cells; `\|` is a
// pipe within a cell.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cell strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cell.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cell.String()))
}
