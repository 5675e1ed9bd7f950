package chart

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What the chart exposes with its default values (mci-epp turned on, as it
// needs its pool): the EPP, whose ext_proc takes no credentials, only
// inside the cluster; a gateway that serves only its Gateways' routes, in
// a namespace apart from the member credentials; and a NetworkPolicy in
// front of every component.
func TestTheChartExposesNothingByDefault(t *testing.T) {
	objs := decode(t, helm(t, "template", "mci", chartDir, "--namespace", releaseNamespace,
		"--set", "epp.enabled=true", "--set", "epp.poolName=llm-pool"), "helm template")
	find := func(kind, name string) *unstructured.Unstructured {
		t.Helper()
		for _, o := range objs {
			if o.GetKind() == kind && o.GetName() == name {
				return o
			}
		}
		require.Failf(t, "missing object", "no %s %s", kind, name)
		return nil
	}

	t.Run("the EPP Service is ClusterIP", func(t *testing.T) {
		typ, _, _ := unstructured.NestedString(find("Service", "epp").Object, "spec", "type")
		assert.Equal(t, "ClusterIP", typ)
	})

	t.Run("mci-sidecar routes only the HTTPRoutes of its Gateway", func(t *testing.T) {
		d := find("Deployment", "inference-gateway")
		inits, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "initContainers")
		require.Len(t, inits, 1)
		args, _, _ := unstructured.NestedStringSlice(inits[0].(map[string]any), "args")
		assert.Contains(t, args, "--gateway=mci-gateway/inference-gateway")
	})

	t.Run("the gateway runs apart from the member credentials", func(t *testing.T) {
		for _, o := range objs {
			if slices.Contains([]string{"inference-gateway", "mci-sidecar"}, o.GetLabels()["app.kubernetes.io/name"]) && o.GetNamespace() != "" {
				assert.NotEqual(t, releaseNamespace, o.GetNamespace(), "%s", key(o))
			}
		}
		assert.Equal(t, gatewayNamespace, find("Deployment", "inference-gateway").GetNamespace())
	})

	t.Run("every component's pods are behind a NetworkPolicy", func(t *testing.T) {
		for _, name := range []string{"mci-apiserver", "inference-gateway", "mci-epp"} {
			np := find("NetworkPolicy", name)
			selector, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
			assert.Equal(t, map[string]string{"app.kubernetes.io/name": name}, selector)
			types, _, _ := unstructured.NestedStringSlice(np.Object, "spec", "policyTypes")
			assert.Equal(t, []string{"Ingress"}, types)
		}
	})

	t.Run("mci-sidecar's ext_proc port is admitted from nowhere", func(t *testing.T) {
		rules, _, _ := unstructured.NestedSlice(find("NetworkPolicy", "inference-gateway").Object, "spec", "ingress")
		for _, r := range rules {
			ports, _, _ := unstructured.NestedSlice(r.(map[string]any), "ports")
			for _, p := range ports {
				assert.NotEqual(t, "9002", fmt.Sprint(p.(map[string]any)["port"]), "a rule admits the ext_proc port")
			}
		}
	})
}
