package chart

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// productionValues set what a platform team sets: a private registry,
// node pools, pod metadata, extra flags and environment, monitoring.
const productionValues = "testdata/production.yaml"

// standardLabels are the labels every object of the chart carries.
var standardLabels = []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
	"app.kubernetes.io/component", "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// renderProduction renders the chart with the production values.
func renderProduction(t *testing.T, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "mci", chartDir, "--namespace", releaseNamespace, "--values", productionValues}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return decode(t, helm(t, args...), "helm template")
}

// appVersion is the chart's appVersion, the default tag of mci's images.
func appVersion(t *testing.T) string {
	t.Helper()
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	data := helm(t, "show", "chart", chartDir)
	require.NoError(t, yaml.Unmarshal(data, &chart))
	require.NotEmpty(t, chart.AppVersion)
	return chart.AppVersion
}

func deployments(t *testing.T, objs []*unstructured.Unstructured) map[string]*appsv1.Deployment {
	t.Helper()
	out := map[string]*appsv1.Deployment{}
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			d := &appsv1.Deployment{}
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d))
			out[d.Name] = d
		}
	}
	require.Len(t, out, 3, "mci-apiserver, inference-gateway and mci-epp")
	return out
}

func TestEveryObjectCarriesTheStandardLabels(t *testing.T) {
	for _, o := range renderProduction(t) {
		for _, l := range standardLabels {
			assert.NotEmpty(t, o.GetLabels()[l], "%s has no label %s", key(o), l)
		}
	}
}

func TestProductionValuesReachEveryPod(t *testing.T) {
	version := appVersion(t)
	ds := deployments(t, renderProduction(t))

	t.Run("mci's images come from global.imageRegistry with the chart's appVersion, Envoy's from its own", func(t *testing.T) {
		for name, d := range ds {
			spec := d.Spec.Template.Spec
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if c.Name == "envoy" {
					assert.True(t, strings.HasPrefix(c.Image, "envoyproxy/envoy:"), "%s: %s", name, c.Image)
					continue
				}
				assert.Equal(t, "registry.example/mci/"+c.Name+":"+version, c.Image, name)
			}
		}
	})

	t.Run("every pod has the global pull Secret and its component's", func(t *testing.T) {
		for name, d := range ds {
			assert.Contains(t, d.Spec.Template.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: "regcred"}, name)
		}
		assert.Contains(t, ds["mci-apiserver"].Spec.Template.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: "apiserver-regcred"})
	})

	t.Run("scheduling values are the pod spec's", func(t *testing.T) {
		api, gw, epp := ds["mci-apiserver"].Spec.Template.Spec, ds["inference-gateway"].Spec.Template.Spec, ds["mci-epp"].Spec.Template.Spec
		assert.Equal(t, map[string]string{"node-role.example/control": "true"}, api.NodeSelector)
		assert.Equal(t, "dedicated", api.Tolerations[0].Key)
		assert.Equal(t, "system-cluster-critical", api.PriorityClassName, "the default priority stays")
		require.NotNil(t, api.Affinity)
		assert.NotNil(t, api.Affinity.PodAntiAffinity, "the default anti-affinity stays")
		assert.Equal(t, "high-priority", gw.PriorityClassName)
		require.NotNil(t, gw.Affinity)
		assert.NotNil(t, gw.Affinity.NodeAffinity)
		assert.Equal(t, "nvidia.com/gpu", epp.Tolerations[0].Key)
	})

	t.Run("pod labels and annotations are added, the selector is unchanged", func(t *testing.T) {
		d := ds["mci-apiserver"]
		assert.Equal(t, "platform", d.Spec.Template.Labels["team"])
		assert.Equal(t, "platform", d.Spec.Template.Annotations["example.com/owner"])
		assert.Equal(t, map[string]string{"app.kubernetes.io/name": "mci-apiserver"}, d.Spec.Selector.MatchLabels)
	})

	t.Run("extra environment and flags are appended to each container", func(t *testing.T) {
		env := func(c corev1.Container, name string) string {
			for _, e := range c.Env {
				if e.Name == name {
					if e.ValueFrom != nil {
						return "valueFrom"
					}
					return e.Value
				}
			}
			return ""
		}
		api := ds["mci-apiserver"].Spec.Template.Spec.Containers[0]
		assert.Equal(t, "2", env(api, "GOMAXPROCS"))
		assert.Equal(t, "--member-remove-after=10m", api.Args[len(api.Args)-1])
		assert.Equal(t, "valueFrom", env(api, "POD_NAMESPACE"), "the chart's own env stays")
		gw := ds["inference-gateway"].Spec.Template.Spec
		assert.Equal(t, "400MiB", env(gw.InitContainers[0], "GOMEMLIMIT"))
		assert.Equal(t, []string{"--concurrency", "2"}, gw.Containers[0].Args[len(gw.Containers[0].Args)-2:])
		assert.Equal(t, "65532", env(gw.Containers[0], "ENVOY_UID"))
		assert.Equal(t, "2", env(ds["mci-epp"].Spec.Template.Spec.Containers[0], "GOMAXPROCS"))
	})
}

// Every Deployment that runs more than one replica has a
// PodDisruptionBudget that selects its pods (the data path's included),
// and none that runs one has a PodDisruptionBudget, which would keep its
// pod from ever being evicted.
func TestEveryDeploymentOfMoreThanOneReplicaHasADisruptionBudget(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets []string
		want int
	}{
		{name: "every component above one replica", want: 3},
		{name: "every component at one replica", sets: []string{"apiserver.replicas=1", "sidecar.replicas=1", "epp.replicas=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderProduction(t, tc.sets...)
			ds := deployments(t, objs)
			var pdbs []*policyv1.PodDisruptionBudget
			for _, o := range objs {
				if o.GetKind() == "PodDisruptionBudget" {
					p := &policyv1.PodDisruptionBudget{}
					require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, p))
					pdbs = append(pdbs, p)
				}
			}
			assert.Len(t, pdbs, tc.want)
			for name, d := range ds {
				var covering int
				for _, p := range pdbs {
					sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
					require.NoError(t, err)
					if p.Namespace == d.Namespace && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
						covering++
					}
				}
				if *d.Spec.Replicas > 1 {
					assert.Equal(t, 1, covering, "%s (%d replicas) has one PodDisruptionBudget", name, *d.Spec.Replicas)
				} else {
					assert.Zero(t, covering, "%s (one replica) has no PodDisruptionBudget", name)
				}
			}
		})
	}
}

// The data path's replicas spread over nodes by default, without refusing
// to schedule on a cluster of one node.
func TestTheDataPathSpreadsOverNodesByDefault(t *testing.T) {
	objs := decode(t, helm(t, "template", "mci", chartDir, "--namespace", releaseNamespace, "--set", "epp.enabled=true", "--set", "epp.poolName=llm-pool"), "helm template")
	ds := deployments(t, objs)
	for _, name := range []string{"inference-gateway", "mci-epp"} {
		var byHost *corev1.TopologySpreadConstraint
		for i, c := range ds[name].Spec.Template.Spec.TopologySpreadConstraints {
			if c.TopologyKey == corev1.LabelHostname {
				byHost = &ds[name].Spec.Template.Spec.TopologySpreadConstraints[i]
			}
		}
		require.NotNil(t, byHost, "%s spreads over nodes", name)
		assert.Equal(t, corev1.ScheduleAnyway, byHost.WhenUnsatisfiable, name)
		sel, err := metav1.LabelSelectorAsSelector(byHost.LabelSelector)
		require.NoError(t, err)
		assert.True(t, sel.Matches(labels.Set(ds[name].Spec.Template.Labels)), "%s's constraint selects its own pods", name)
	}
}
