package chart

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The chart and the kustomize bases of artifacts/deploy render the same
// objects for the same settings: the same kinds, names and namespaces, each
// with equal content (lists that are sets compared as sets), but for the
// labels only Helm knows (helmLabels). The settings are
// testdata/kustomize-equivalent.yaml plus each case's. What only the chart
// renders (monitoring objects, member Secrets from values) is named in
// chartOnly, so that an object added to one side alone fails the test.
func TestChartRendersWhatTheKustomizeBasesRender(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sets      []string
		bases     []string
		chartOnly []string
	}{{
		name:  "self-signed serving certificate, sidecar",
		bases: []string{"mci-apiserver", "mci-sidecar"},
	}, {
		name:  "cert-manager serving certificate, sidecar",
		sets:  []string{"apiserver.tls.mode=certManager"},
		bases: []string{"mci-apiserver-cert-manager", "mci-sidecar"},
	}, {
		name:  "self-signed serving certificate, sidecar, mci-epp",
		sets:  []string{"epp.enabled=true"},
		bases: []string{"mci-apiserver", "mci-sidecar", "mci-epp"},
	}, {
		name:  "mci-apiserver alone",
		sets:  []string{"sidecar.enabled=false"},
		bases: []string{"mci-apiserver"},
	}, {
		name:  "mci-epp alone",
		sets:  []string{"apiserver.enabled=false", "sidecar.enabled=false", "createNamespace=false", "epp.enabled=true"},
		bases: []string{"mci-epp"},
	}, {
		name: "every component, with monitoring and a member Secret: the chart's own objects",
		sets: []string{"epp.enabled=true", "metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
			"metrics.grafanaDashboard.enabled=true", "metrics.scraper.serviceAccount.namespace=monitoring", "metrics.scraper.serviceAccount.name=prometheus",
			"membership.secrets[0].cluster=cluster-b", "membership.secrets[0].kubeconfig=kind: Config"},
		bases: []string{"mci-apiserver", "mci-sidecar", "mci-epp"},
		chartOnly: []string{
			"monitoring.coreos.com/ServiceMonitor mci-system/mci-apiserver",
			"monitoring.coreos.com/ServiceMonitor mci-gateway/inference-gateway",
			"monitoring.coreos.com/ServiceMonitor example/mci-epp",
			"monitoring.coreos.com/PrometheusRule mci-system/mci",
			"/ConfigMap mci-system/mci-grafana-dashboard",
			"rbac.authorization.k8s.io/ClusterRole /mci-metrics-reader",
			"rbac.authorization.k8s.io/ClusterRoleBinding /mci-metrics-reader",
			"/Secret mci-system/member-cluster-b",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			chart := byKey(t, withoutHelmLabels(t, helmTemplate(t, tc.sets...)), "the chart")
			bases := byKey(t, kustomize(t, tc.bases...), "the kustomize bases")
			var chartOnly []string
			for k := range chart {
				if _, ok := bases[k]; !ok {
					chartOnly = append(chartOnly, k)
				}
			}
			assert.ElementsMatch(t, tc.chartOnly, chartOnly, "the objects only the chart renders")
			for k, want := range bases {
				if !assert.Contains(t, chart, k, "the chart renders what the kustomize bases render") {
					continue
				}
				assert.Equal(t, want, chart[k], "%s (kustomize expected, the chart actual)", k)
			}
		})
	}
}

// helmLabels are the recommended labels only a Helm release can say: the
// release, its chart, the version it installs and Helm as its manager. The
// kustomize bases carry the others (name, component, part-of).
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// withoutHelmLabels removes helmLabels from the objects' labels and from
// their pod templates', after checking that each carries all of them.
func withoutHelmLabels(t *testing.T, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		for _, path := range [][]string{{"metadata", "labels"}, {"spec", "template", "metadata", "labels"}} {
			labels, found, err := unstructured.NestedStringMap(o.Object, path...)
			require.NoError(t, err)
			if !found && len(path) > 2 {
				continue
			}
			for _, l := range helmLabels {
				require.Contains(t, labels, l, "%s %s", key(o), strings.Join(path, "."))
				delete(labels, l)
			}
			require.NoError(t, unstructured.SetNestedStringMap(o.Object, labels, path...))
		}
	}
	return objs
}
