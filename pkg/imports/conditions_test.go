package imports

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

func TestTruncateMessage(t *testing.T) {
	const limit = 256
	tests := []struct {
		name string
		msg  string
		// wantSame: the message is served as it is.
		wantSame bool
		// wantHead and wantTail must survive at the ends.
		wantHead, wantTail string
	}{
		{name: "a short message is kept", msg: "cluster-a is ready", wantSame: true},
		{name: "a message of exactly the limit is kept", msg: strings.Repeat("x", limit), wantSame: true},
		{
			name:     "a message one byte over the limit loses its middle",
			msg:      "begin" + strings.Repeat("x", limit-7) + "end",
			wantHead: "begin", wantTail: "end",
		},
		{
			name:     "a quoted value of 256 KiB is cut out and the advice after it kept",
			msg:      `annotation "export" has value "` + strings.Repeat("v", 256<<10) + `"; allowed: "ClusterSet"`,
			wantHead: `annotation "export"`, wantTail: `allowed: "ClusterSet"`,
		},
		{
			name: "cuts never split a multi-byte character",
			msg:  strings.Repeat("é", 200) + strings.Repeat("日本", 100),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := truncateMessage(tc.msg, limit)
			assert.LessOrEqual(t, len(got), limit)
			assert.True(t, utf8.ValidString(got), "%q is not valid UTF-8", got)
			if tc.wantSame {
				assert.Equal(t, tc.msg, got)
				return
			}
			assert.Contains(t, got, "bytes left out")
			assert.True(t, strings.HasPrefix(got, tc.wantHead), "%q keeps the start %q", got, tc.wantHead)
			assert.True(t, strings.HasSuffix(got, tc.wantTail), "%q keeps the end %q", got, tc.wantTail)
			assert.Equal(t, got, truncateMessage(tc.msg, limit), "every replica serves the same message")
		})
	}

	t.Run("a limit shorter than the marker keeps a prefix", func(t *testing.T) {
		got := truncateMessage(strings.Repeat("é", 20), 5)
		assert.Equal(t, "éé", got)
	})

	t.Run("the served limit is the API's", func(t *testing.T) {
		got := truncateMessage(strings.Repeat("x", 1<<20), MaxConditionMessageBytes)
		assert.LessOrEqual(t, len(got), MaxConditionMessageBytes)
		assert.Greater(t, len(got), MaxConditionMessageBytes-64, "no more is cut than needed")
	})
}

// Whatever a member holds, mci serves conditions the API accepts: a
// message quoting a 256 KiB annotation value is shortened to the 32 KiB
// metav1.Condition allows, and still says what is wrong and what is
// allowed.
func TestConditionsQuotingHugeAnnotationValuesStayValid(t *testing.T) {
	huge := strings.Repeat("x", 256000)
	tests := []struct {
		name        string
		annotations map[string]string
		wantMessage []string
	}{
		{
			name:        "a huge export value",
			annotations: map[string]string{v1alpha1.ExportAnnotation: huge},
			wantMessage: []string{v1alpha1.ExportAnnotation, "xxx... (256000 bytes)", `the only allowed value is "ClusterSet"`},
		},
		{
			name:        "a huge export-mode value",
			annotations: map[string]string{v1alpha1.ExportAnnotation: "ClusterSet", v1alpha1.ExportModeAnnotation: huge},
			wantMessage: []string{v1alpha1.ExportModeAnnotation, `"ParentMode"`},
		},
		{
			name:        "a huge unrelated annotation beside a bad export value",
			annotations: map[string]string{v1alpha1.ExportAnnotation: "World", "example.com/notes": huge},
			wantMessage: []string{`"World"`, `the only allowed value is "ClusterSet"`},
		},
		{
			name:        "a huge export-mode value without export",
			annotations: map[string]string{v1alpha1.ExportModeAnnotation: huge},
			wantMessage: []string{v1alpha1.ExportModeAnnotation, "is missing", "remove " + v1alpha1.ExportModeAnnotation, `"ParentMode"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := clusterSet("cluster-a",
				member(t, "cluster-a", namespace(testNamespace), pool(testNamespace, testPool, annotations(tc.annotations))),
				member(t, "cluster-b", namespace(testNamespace)),
			)
			exp, ok := Export(cs, testNamespace, testPool)
			require.True(t, ok)
			valid := condition(t, exp.Status.Conditions, v1alpha1.ConditionValid)
			assert.Equal(t, metav1.ConditionFalse, valid.Status)
			assert.Equal(t, v1alpha1.ReasonInvalidExport, valid.Reason)
			assert.LessOrEqual(t, len(valid.Message), MaxConditionMessageBytes)
			for _, want := range tc.wantMessage {
				assert.Contains(t, valid.Message, want)
			}
			requireValidConditions(t, exp.Status.Conditions)
		})
	}
}

// Messages that list every exporting cluster grow with the ClusterSet: an
// import of a pool that 200 clusters export, none ready through 32 parent
// Gateways with names of maximum length, still has valid conditions.
func TestImportConditionsOfAHugeClusterSetStayValid(t *testing.T) {
	ns := strings.Repeat("n", 63)
	name := strings.Repeat("p", 253)
	var parents []poolOption
	for i := range 32 {
		parents = append(parents, parentMode(gatewayRef(ns, strings.Repeat(string(rune('a'+i%26)), 253))))
	}
	members := []Member{member(t, "local", namespace(ns))}
	for i := range 200 {
		m := member(t, "cluster-"+strings.Repeat("c", 200)+"-"+string(rune('a'+i%26))+strings.Repeat("0", i/26), namespace(ns), pool(ns, name, parents...))
		members = append(members, unreachable(m, t0, strings.Repeat("dial tcp: connection refused; ", 20)))
	}
	imp, ok := importBothWays(t, clusterSet("local", members...), ns, name)
	require.True(t, ok)
	requireValidConditions(t, imp.Status.Conditions)
	for _, c := range imp.Status.Clusters {
		requireValidConditions(t, c.Conditions)
	}
	assert.Contains(t, condition(t, imp.Status.Conditions, v1alpha1.ConditionReady).Message, "bytes left out")
}

// requireValidConditions checks conditions as the API would validate them,
// with the lastTransitionTime the server fills in.
func requireValidConditions(t *testing.T, conds []metav1.Condition) {
	t.Helper()
	stamped := make([]metav1.Condition, len(conds))
	for i, c := range conds {
		c.LastTransitionTime = metav1.NewTime(t0)
		stamped[i] = c
	}
	require.Empty(t, metav1validation.ValidateConditions(stamped, field.NewPath("status", "conditions")))
}
