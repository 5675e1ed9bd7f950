package chart

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Each member named in membership.memberReader.readers gets a
// ServiceAccount of its own, bound as the shared reader is: the identity
// by which the summary stream sends it the exports scoped to it.
func TestChartCreatesAReaderPerMember(t *testing.T) {
	objs := helmTemplate(t, "membership.memberReader.readers={cluster-b,cluster-c}")
	var accounts []string
	var binding *unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetKind() == "ServiceAccount" && o.GetNamespace() == releaseNamespace:
			accounts = append(accounts, o.GetName())
		case o.GetKind() == "ClusterRoleBinding" && o.GetName() == "mci-member-summary-reader":
			binding = o
		}
	}
	assert.Subset(t, accounts, []string{"mci-member-reader", "mci-member-reader.cluster-b", "mci-member-reader.cluster-c"})
	require.NotNil(t, binding)
	subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
	var bound []string
	for _, s := range subjects {
		m, _ := s.(map[string]any)
		assert.Equal(t, releaseNamespace, m["namespace"])
		bound = append(bound, m["name"].(string))
	}
	assert.Equal(t, []string{"mci-member-reader", "mci-member-reader.cluster-b", "mci-member-reader.cluster-c"}, bound)

	_, stderr, err := runHelm(t, templateArgs("membership.memberReader.readers={Cluster_B}")...)
	require.Error(t, err, "a name that is no cluster name is refused")
	assert.Contains(t, stderr, "readers")
}

// The sidecar's region reaches its flag.
func TestChartSetsTheSidecarsRegion(t *testing.T) {
	var args []any
	for _, o := range helmTemplate(t, "sidecar.localClusterRegion=eu-west-1") {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "initContainers")
		for _, c := range containers {
			m, _ := c.(map[string]any)
			if m["name"] == "mci-sidecar" {
				args, _ = m["args"].([]any)
			}
		}
	}
	assert.Contains(t, args, "--local-cluster-region=eu-west-1")
}
