package imports

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestExportSettings(t *testing.T) {
	manyTags := map[string]string{}
	for i := range maxExportTags + 1 {
		manyTags[fmt.Sprintf("t%d", i)] = "x"
	}
	many := fmt.Sprintf(`{"tags": {%s}}`, strings.Join(func() []string {
		var out []string
		for k, v := range manyTags {
			out = append(out, fmt.Sprintf("%q: %q", k, v))
		}
		return out
	}(), ", "))
	tests := []struct {
		name  string
		value string // "" leaves the annotation out
		// want are the settings served; nil: none (the defaults).
		want *inference.ExportSettings
		// wantProblem lists substrings of the ExportSettingsAccepted
		// condition's message; none means the condition is absent.
		wantProblem []string
	}{
		{name: "without the annotation no settings are served and no condition is added"},
		{name: "a weight, a region and tags are carried as stated", value: `{"weight": 3, "region": "eu-west-1", "tags": {"slo": "gold", "example.com/tier": "a"}}`,
			want: &inference.ExportSettings{Weight: 3, Region: "eu-west-1", Tags: map[string]string{"slo": "gold", "example.com/tier": "a"}}},
		{name: "a region alone is served with weight 1", value: `{"region": "eu-west-1"}`, want: &inference.ExportSettings{Weight: 1, Region: "eu-west-1"}},
		{name: "the largest weight is accepted", value: `{"weight": 1000}`, want: &inference.ExportSettings{Weight: 1000}},
		{name: "a weight of 0 is refused: draining is how an exporter takes no new work", value: `{"weight": 0}`, wantProblem: []string{"weight 0 is not between 1 and 1000"}},
		{name: "a weight above 1000 is refused", value: `{"weight": 1001}`, wantProblem: []string{"weight 1001"}},
		{name: "a weight that is not a number is refused", value: `{"weight": "3"}`, wantProblem: []string{"not a JSON object"}},
		{name: "a region that is not a DNS label is refused and quoted", value: `{"region": "EU West"}`, wantProblem: []string{`region "EU West"`}},
		{name: "a misspelt field is refused rather than ignored", value: `{"regoin": "eu"}`, wantProblem: []string{`"regoin"`}},
		{name: "text that is not JSON is refused and the message shows how to write it", value: `region=eu`, wantProblem: []string{"not a JSON object", `{"weight": 2`}},
		{name: "an object that states nothing is refused", value: `{}`, wantProblem: []string{"states no setting"}},
		{name: "two JSON values are refused", value: `{"weight": 2} {"weight": 3}`, wantProblem: []string{"more than one JSON value"}},
		{name: "a tag key that is no label key is refused", value: `{"tags": {"a b": "x"}}`, wantProblem: []string{`tag key "a b"`}},
		{name: "a tag value that is no label value is refused", value: `{"tags": {"slo": "gold class"}}`, wantProblem: []string{`"gold class"`}},
		{name: "more than 16 tags are refused", value: many, wantProblem: []string{"17 tags, at most 16"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := map[string]string{v1alpha1.ExportAnnotation: "ClusterSet"}
			if tc.value != "" {
				a[v1alpha1.ExportSettingsAnnotation] = tc.value
			}
			members := []Member{
				member(t, "cluster-a", objects(nsObjects(testNamespace), readyEPP(testNamespace, testPool, annotations(a)))...),
				member(t, "cluster-b", namespace(testNamespace)),
			}
			imp, ok := importBothWays(t, clusterSet("cluster-b", members...), testNamespace, testPool)
			require.True(t, ok, "settings, valid or not, never withdraw the export")
			require.Len(t, imp.Status.Clusters, 1)
			entry := imp.Status.Clusters[0]
			assert.Equal(t, tc.want, entry.ExportSettings)
			assert.True(t, meta.IsStatusConditionTrue(entry.Conditions, v1alpha1.ConditionReady), "the cluster stays Ready whatever its settings")

			exp, ok := Export(clusterSet("cluster-a", members...), testNamespace, testPool)
			require.True(t, ok)
			assert.True(t, meta.IsStatusConditionTrue(exp.Status.Conditions, v1alpha1.ConditionValid), "the export stays valid")
			for _, conds := range [][]metav1.Condition{entry.Conditions, exp.Status.Conditions} {
				c := meta.FindStatusCondition(conds, v1alpha1.ConditionExportSettingsAccepted)
				if len(tc.wantProblem) == 0 {
					assert.Nil(t, c)
					continue
				}
				require.NotNil(t, c, "a malformed setting is said")
				assert.Equal(t, metav1.ConditionFalse, c.Status)
				assert.Equal(t, v1alpha1.ReasonInvalidExportSettings, c.Reason)
				assert.Contains(t, c.Message, "default settings")
				for _, s := range tc.wantProblem {
					assert.Contains(t, c.Message, s)
				}
			}
		})
	}
}

// A summary is written by another server: settings it carries that this
// server would refuse are not served, and the entry says why.
func TestSummarySettingsAreCheckedAgain(t *testing.T) {
	tests := []struct {
		name        string
		settings    *inference.ExportSettings
		conditions  []metav1.Condition
		want        *inference.ExportSettings
		wantProblem string
	}{
		{name: "valid settings are carried", settings: &inference.ExportSettings{Weight: 2, Region: "eu"}, want: &inference.ExportSettings{Weight: 2, Region: "eu"}},
		{name: "a weight out of bounds is not served", settings: &inference.ExportSettings{Weight: 1 << 30}, wantProblem: "published export settings this server cannot read"},
		{name: "a region that is no DNS label is not served", settings: &inference.ExportSettings{Weight: 1, Region: "eu/west"}, wantProblem: "cannot read"},
		{name: "the exporter's verdict without a message still says so", conditions: []metav1.Condition{{Type: v1alpha1.ConditionExportSettingsAccepted, Status: metav1.ConditionFalse}}, wantProblem: "could not read its own export settings"},
		{name: "the exporter's own verdict is passed on", conditions: []metav1.Condition{{Type: v1alpha1.ConditionExportSettingsAccepted, Status: metav1.ConditionFalse, Message: "cluster a: bad"}}, wantProblem: "cluster a: bad"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := summarySettings("cluster-a", inference.InferencePoolExportSummaryStatus{ExportSettings: tc.settings}, tc.conditions)
			assert.Equal(t, tc.want, v.settings)
			if tc.wantProblem == "" {
				assert.Nil(t, v.condition(1))
				return
			}
			c := v.condition(1)
			require.NotNil(t, c)
			assert.Equal(t, v1alpha1.ReasonInvalidExportSettings, c.Reason)
			assert.Contains(t, c.Message, tc.wantProblem)
		})
	}
}

func FuzzParseExportSettings(f *testing.F) {
	for _, s := range []string{`{"weight": 3, "region": "eu", "tags": {"a": "b"}}`, `{}`, `null`, `{"weight": -1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		s, err := parseExportSettings(map[string]string{v1alpha1.ExportSettingsAnnotation: v})
		if err != nil {
			require.Nil(t, s)
			return
		}
		require.NoError(t, checkExportSettings(s), "what parses is what the check accepts")
	})
}
