package conformance

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const goodImport = `{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"InferencePoolImport","metadata":{"name":"p","namespace":"n"},"spec":{},` +
	`"status":{"clusters":[{"name":"a"}],"controllers":[{"name":"example.com/import-controller","exportingClusters":[{"name":"a"}],` +
	`"conditions":[{"type":"Accepted","status":"True","reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}],` +
	`"parents":[{"parentRef":{"group":"gateway.networking.k8s.io","kind":"Gateway","name":"gw"},"controllerName":"example.com/gw",` +
	`"conditions":[{"type":"Accepted","status":"True","reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}]}]}}`

func TestTheShapeCheckerAcceptsAnUpstreamImportWithMoreFields(t *testing.T) {
	assert.Empty(t, checkUpstreamShape([]byte(goodImport)))
}

// Each case breaks one rule of the upstream schema, and the checker says so.
func TestTheShapeCheckerRefusesWhatTheUpstreamSchemaRefuses(t *testing.T) {
	for _, tc := range []struct{ name, old, new string }{
		{"the wrong kind", `"kind":"InferencePoolImport"`, `"kind":"InferencePool"`},
		{"no spec", `"spec":{},`, ``},
		{"no controllers", `"controllers":[{`, `"controllers":[],"x":[{`},
		{"a controller name without a path", `"name":"example.com/import-controller"`, `"name":"example.com"`},
		{"a controller name twice", `"controllers":[{"name":"example.com/import-controller",`, `"controllers":[{"name":"example.com/import-controller"},{"name":"example.com/import-controller",`},
		{"an exporting cluster twice", `"exportingClusters":[{"name":"a"}]`, `"exportingClusters":[{"name":"a"},{"name":"a"}]`},
		{"an exporting cluster without a name", `"exportingClusters":[{"name":"a"}]`, `"exportingClusters":[{"name":""}]`},
		{"a condition without a reason", `"reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}],"parents"`, `"reason":"","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}],"parents"`},
		{"a condition status that is not True, False or Unknown", `"status":"True","reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}],"parents"`, `"status":"Maybe","reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}],"parents"`},
		{"a condition without a transition time", `"message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}],"parents"`, `"message":""}],"parents"`},
		{"a parent without a name", `"name":"gw"`, `"name":""`},
		{"a parent kind that is not a Kind", `"kind":"Gateway"`, `"kind":"Gate way"`},
		{"a field of the wrong type", `"exportingClusters":[{"name":"a"}]`, `"exportingClusters":"a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(goodImport, tc.old, tc.new, 1)
			require.NotEqual(t, goodImport, doc, "the case changes nothing")
			assert.NotEmpty(t, checkUpstreamShape([]byte(doc)))
		})
	}
}

func TestNineConditionsAreTooMany(t *testing.T) {
	cond := `{"type":"T%d","status":"True","reason":"R","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}`
	var conds []string
	for i := range 9 {
		conds = append(conds, strings.Replace(cond, "%d", string(rune('a'+i)), 1))
	}
	doc := strings.Replace(goodImport, `"conditions":[{"type":"Accepted","status":"True","reason":"Accepted","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}],"parents"`,
		`"conditions":[`+strings.Join(conds, ",")+`],"parents"`, 1)
	require.NotEqual(t, goodImport, doc)
	assert.NotEmpty(t, checkUpstreamShape([]byte(doc)))
}
