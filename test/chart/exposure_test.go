package chart

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
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

// The ranges no other cluster's EPP may name as a destination reach
// mci-sidecar's flags, both families of a dual-stack cluster in one flag;
// by default none is rendered (the sidecar then says they are unset).
func TestDeniedDestinationsBecomeTheSidecarsFlags(t *testing.T) {
	sidecarArgs := func(t *testing.T, sets ...string) []string {
		t.Helper()
		args := []string{"template", "mci", chartDir, "--namespace", releaseNamespace}
		for _, s := range sets {
			args = append(args, "--set-json", s)
		}
		for _, o := range decode(t, helm(t, args...), "helm template") {
			if o.GetKind() == "Deployment" && o.GetName() == "inference-gateway" {
				inits, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "initContainers")
				require.Len(t, inits, 1)
				args, _, _ := unstructured.NestedStringSlice(inits[0].(map[string]any), "args")
				return args
			}
		}
		require.Fail(t, "no Deployment inference-gateway")
		return nil
	}
	flags := []string{"--service-cluster-ip-range", "--cluster-cidr", "--denied-destination-cidrs"}

	t.Run("each list is its flag", func(t *testing.T) {
		args := sidecarArgs(t, `sidecar.deniedDestinations={"serviceClusterIPRanges":["10.96.0.0/12","fd00:10:96::/112"],"clusterCIDRs":["10.244.0.0/16"],"extraCIDRs":["192.168.0.0/24","2001:db8::/64"]}`)
		assert.Contains(t, args, "--service-cluster-ip-range=10.96.0.0/12,fd00:10:96::/112")
		assert.Contains(t, args, "--cluster-cidr=10.244.0.0/16")
		assert.Contains(t, args, "--denied-destination-cidrs=192.168.0.0/24,2001:db8::/64")
		for _, a := range args {
			flag, value, _ := strings.Cut(a, "=")
			if slices.Contains(flags, flag) {
				for _, cidr := range strings.Split(value, ",") {
					_, err := netip.ParsePrefix(cidr)
					assert.NoError(t, err, "mci-sidecar would refuse %s", a)
				}
			}
		}
	})

	t.Run("an empty list renders no flag", func(t *testing.T) {
		args := sidecarArgs(t, `sidecar.deniedDestinations.clusterCIDRs=["10.244.0.0/16"]`)
		assert.Contains(t, args, "--cluster-cidr=10.244.0.0/16")
		for _, a := range args {
			assert.NotRegexp(t, `^--(service-cluster-ip-range|denied-destination-cidrs)=`, a)
		}
	})

	t.Run("none by default", func(t *testing.T) {
		for _, a := range sidecarArgs(t) {
			flag, _, _ := strings.Cut(a, "=")
			assert.NotContains(t, flags, flag)
		}
	})
}

// The schema accepts exactly the ranges mci-sidecar parses (Go's
// netip.ParsePrefix): a range it would refuse at start is refused at
// install, naming the value, and no range it accepts is refused.
func TestTheSchemaAcceptsTheRangesTheSidecarParses(t *testing.T) {
	for _, cidr := range []string{
		"10.96.0.0/12", "0.0.0.0/0", "255.255.255.255/32", "10.0.0.1/24",
		"fd00:10:96::/112", "::/0", "::1/128", "2001:db8::/32", "1:2:3:4:5:6:7:8/64",
		"a:b:c:d:e:f:1::/64", "::ffff:10.0.0.0/104", "1::1.2.3.4/96", "FD00::/8",
		"10.0.0.1/33", "010.0.0.0/8", "10.0.0/8", "10.0.0.0", "10.0.0.0/08", "10.0.0.256/8",
		"fd00::/129", "fd00::/0128", "1:2:3:4:5:6:7:8:9/64", "1::2::3/64", "gg::/8",
		"fe80::1%eth0/64", " 10.0.0.0/8", "10.0.0.0/8,10.1.0.0/16", "", "nodes",
	} {
		t.Run(fmt.Sprintf("%q", cidr), func(t *testing.T) {
			_, parseErr := netip.ParsePrefix(cidr)
			out, stderr, err := runHelm(t, "template", "mci", chartDir, "--namespace", releaseNamespace,
				"--set-json", fmt.Sprintf(`sidecar.deniedDestinations.extraCIDRs=[%q]`, cidr))
			if parseErr == nil {
				require.NoError(t, err, "the schema refuses a range mci-sidecar accepts:\n%s", stderr)
				assert.Contains(t, string(out), "--denied-destination-cidrs="+cidr)
				return
			}
			require.Error(t, err, "the schema accepts a range mci-sidecar refuses (%v)", parseErr)
			assert.Contains(t, stderr, "/sidecar/deniedDestinations/extraCIDRs/0")
		})
	}
}

// The sidecar sends no credential to EPPs' /metrics by default; with an
// audience set, the token it sends is a projected ServiceAccount token of
// that audience alone (no kube-apiserver takes it) with a short life, the
// only token file its flag names, and its recipients reach their flag.
func TestTheSidecarsEPPMetricsTokenIsProjectedWithItsOwnAudience(t *testing.T) {
	const tokenFlag = "--epp-metrics-token-file=/var/run/secrets/mci/epp-metrics/token"
	sidecarOf := func(objs []*unstructured.Unstructured) (args []string, pod map[string]any) {
		t.Helper()
		for _, o := range objs {
			if o.GetKind() != "Deployment" || o.GetName() != "inference-gateway" {
				continue
			}
			pod, _, _ = unstructured.NestedMap(o.Object, "spec", "template", "spec")
			inits, _, _ := unstructured.NestedSlice(pod, "initContainers")
			for _, c := range inits {
				if m := c.(map[string]any); m["name"] == "mci-sidecar" {
					args, _, _ = unstructured.NestedStringSlice(m, "args")
				}
			}
		}
		require.NotNil(t, pod, "no inference-gateway Deployment")
		return args, pod
	}
	projected := func(pod map[string]any) []any {
		volumes, _, _ := unstructured.NestedSlice(pod, "volumes")
		for _, v := range volumes {
			if m := v.(map[string]any); m["name"] == "epp-metrics-token" {
				sources, _, _ := unstructured.NestedSlice(m, "projected", "sources")
				return sources
			}
		}
		return nil
	}

	t.Run("no token by default", func(t *testing.T) {
		args, pod := sidecarOf(helmTemplate(t))
		assert.NotContains(t, strings.Join(args, " "), "--epp-metrics-token")
		assert.Nil(t, projected(pod), "a token volume is mounted by default")
	})

	t.Run("a projected token of its own audience and a short life", func(t *testing.T) {
		args, pod := sidecarOf(helmTemplate(t, "sidecar.eppMetricsToken.audience=mci-epp-metrics",
			"sidecar.eppMetricsToken.recipients={cluster-a}"))
		assert.Contains(t, args, tokenFlag)
		assert.Contains(t, args, "--epp-metrics-token-recipients=cluster-a")
		sources := projected(pod)
		require.Len(t, sources, 1, "the token volume holds the token alone")
		token, _, _ := unstructured.NestedMap(sources[0].(map[string]any), "serviceAccountToken")
		assert.Equal(t, "mci-epp-metrics", token["audience"])
		assert.EqualValues(t, 600, token["expirationSeconds"])
		assert.Equal(t, "token", token["path"])
	})
}
