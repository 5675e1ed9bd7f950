package clusterset

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/imports"
)

func clusterSummaryNamed(name string, namespaces ...string) *v1alpha1.InferenceClusterSummary {
	return &v1alpha1.InferenceClusterSummary{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     v1alpha1.InferenceClusterSummaryStatus{Namespaces: namespaces},
	}
}

func TestTheClusterSummaryHeldFollowsEveryWriteToTheCache(t *testing.T) {
	c := newClusterSummaryIndexer()
	assert.Equal(t, heldClusterSummary{}, c.summary(), "nothing listed yet")

	require.NoError(t, c.Add(clusterSummaryNamed("east", "a", "b")))
	assert.Equal(t, heldClusterSummary{count: 1, name: "east", namespaces: imports.SummaryNamespaces{"a", "b"}}, c.summary())

	require.NoError(t, c.Update(clusterSummaryNamed("east", "b")))
	assert.Equal(t, heldClusterSummary{count: 1, name: "east", namespaces: imports.SummaryNamespaces{"b"}}, c.summary(), "an update is read at once")

	require.NoError(t, c.Add(clusterSummaryNamed("west", "c")))
	assert.Equal(t, heldClusterSummary{count: 2}, c.summary(), "two summaries name no one cluster")

	require.NoError(t, c.Delete(clusterSummaryNamed("east")))
	assert.Equal(t, heldClusterSummary{count: 1, name: "west", namespaces: imports.SummaryNamespaces{"c"}}, c.summary(), "what remains is read")

	require.NoError(t, c.Replace([]interface{}{clusterSummaryNamed("north", "d")}, "7"))
	assert.Equal(t, heldClusterSummary{count: 1, name: "north", namespaces: imports.SummaryNamespaces{"d"}}, c.summary(), "a relist is read whole")

	require.NoError(t, c.Delete(clusterSummaryNamed("north")))
	assert.Equal(t, heldClusterSummary{}, c.summary())
}

func TestAMemberIsReadAsAnotherOnlyWhenItsOneClusterSummaryNamesAnother(t *testing.T) {
	m := &member{name: "east"}
	tests := []struct {
		name           string
		held           heldClusterSummary
		another        bool
		wantNamespaces imports.SummaryNamespaces
	}{
		{"none listed yet", heldClusterSummary{}, false, nil},
		{"its own", heldClusterSummary{count: 1, name: "east", namespaces: imports.SummaryNamespaces{"a"}}, false, imports.SummaryNamespaces{"a"}},
		{"another cluster's", heldClusterSummary{count: 1, name: "west", namespaces: imports.SummaryNamespaces{"a"}}, true, nil},
		{"several", heldClusterSummary{count: 2}, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.another, m.speaksForAnother(tc.held))
			assert.Equal(t, tc.wantNamespaces, m.summaryNamespaces(tc.held))
		})
	}
}
