package chart

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helm lint --strict (warnings are failures) accepts the chart with its
// default values and with the settings the other tests render.
func TestChartPassesHelmLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{name: "default values"},
		{name: "the kustomize bases' settings", args: []string{"--values", equivalentValues}},
		{name: "cert-manager and mci-epp", args: []string{"--values", equivalentValues, "--set", "apiserver.tls.mode=certManager", "--set", "epp.enabled=true"}},
		{name: "ClusterProfile membership", args: clusterProfileArgs},
		{name: "production values: registry, scheduling, monitoring", args: []string{"--values", productionValues}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := helm(t, append([]string{"lint", "--strict", chartDir, "--namespace", releaseNamespace}, tc.args...)...)
			assert.Contains(t, string(out), "0 chart(s) failed")
		})
	}
}

// Values the chart cannot render are refused with an error that names the
// value, not rendered into objects the cluster or the binaries refuse
// later: by values.schema.json, and by the templates' own checks where a
// schema cannot say it or is skipped (--skip-schema-validation).
func TestChartRefusesValuesItCannotRender(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "a misspelt value", args: []string{"--set", "apiserver.replicaz=3"}, want: "additional properties 'replicaz' not allowed"},
		{name: "a duration without its unit", args: []string{"--set", "sidecar.drainTimeout=20"}, want: "/sidecar/drainTimeout"},
		{name: "an unknown TLS mode", args: []string{"--set", "apiserver.tls.mode=vault"}, want: "/apiserver/tls/mode"},
		{name: "an unknown TLS mode, without the schema", args: []string{"--skip-schema-validation", "--set", "apiserver.tls.mode=vault"}, want: `apiserver.tls.mode is "vault"`},
		{name: "mci-epp without its pool", args: []string{"--set", "epp.enabled=true", "--set", "epp.poolName="}, want: "epp.enabled needs epp.poolName"},
		{name: "a member Secret without its kubeconfig", args: []string{"--set", "membership.secrets[0].cluster=cluster-b"}, want: "missing property 'kubeconfig'"},
		{name: "ClusterProfiles without a provider", args: []string{"--set", "membership.clusterProfiles.namespace=fleet"}, want: "membership.clusterProfiles.namespace needs membership.clusterProfiles.providers"},
		{name: "a provider without its command", args: []string{"--set", "membership.clusterProfiles.providers[0].name=token", "--set", "membership.clusterProfiles.providers[0].execConfig.apiVersion=v1"}, want: "missing property 'command'"},
		{name: "a member Secret without its kubeconfig, without the schema", args: []string{"--skip-schema-validation", "--set", "membership.secrets[0].cluster=cluster-b"}, want: "every entry of membership.secrets needs cluster"},
		{name: "a gateway that serves no Gateway", args: []string{"--set-json", "sidecar.gateways=[]"}, want: "/sidecar/gateways"},
		{name: "a gateway without its Gateways", args: []string{"--set", "sidecar.gateways=null"}, want: "missing property 'gateways'"},
		{name: "a gateway that serves no Gateway, without the schema", args: []string{"--skip-schema-validation", "--set", "sidecar.gateways=null"}, want: "sidecar.gateways is empty: name the Gateway object(s)"},
		{name: "the gateway in the namespace of the member credentials", args: []string{"--set", "sidecar.namespace=" + releaseNamespace}, want: `sidecar.namespace is "mci-system", the release's namespace, where mci-apiserver keeps the member credentials`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, err := runHelm(t, append(templateArgs(), tc.args...)...)
			require.Error(t, err, "helm template rendered:\n%s", out)
			assert.True(t, strings.Contains(stderr, tc.want), "helm template's error %q does not say %q", stderr, tc.want)
		})
	}
}

// clusterProfileArgs turn on ClusterProfile membership with a remote hub
// and plugins from a volume.
var clusterProfileArgs = []string{
	"--set", "membership.clusterProfiles.namespace=fleet",
	"--set", "membership.clusterProfiles.hubKubeconfigSecret=hub-kubeconfig",
	"--set", "membership.clusterProfiles.providers[0].name=token",
	"--set", "membership.clusterProfiles.providers[0].execConfig.apiVersion=client.authentication.k8s.io/v1",
	"--set", "membership.clusterProfiles.providers[0].execConfig.command=/plugins/token-plugin",
	"--set", "membership.clusterProfiles.pluginsVolume.persistentVolumeClaim.claimName=plugins",
}
