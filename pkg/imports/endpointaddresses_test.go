package imports

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// modelPod is a pod of namespace ns with labels app=app, addresses ips and
// phase phase.
func modelPod(ns, name, app string, phase corev1.PodPhase, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
		Status:     corev1.PodStatus{Phase: phase},
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

// exporterWithPods is cluster b exporting the test pool in mode, with
// pods, imported by a.
func exporterWithPods(t *testing.T, mode inference.RoutingMode, pods ...runtime.Object) ClusterSet {
	opts := []poolOption{}
	if mode == inference.RoutingModeParent {
		opts = append(opts, parentMode(gatewayRef(testNamespace, "gw")))
	}
	return clusterSet("a",
		member(t, "a", nsObjects(testNamespace)...),
		member(t, "b", objects(nsObjects(testNamespace, "other"), readyEPP(testNamespace, testPool, opts...), pods)...),
	)
}

// An import carries, per exporting cluster in EndpointMode, the addresses
// of every pod its pool selects that may still serve, ready or not, in
// full mode and in summary mode alike (importBothWays).
func TestImportCarriesThePoolsEndpointAddresses(t *testing.T) {
	cs := exporterWithPods(t, inference.RoutingModeEndpoint, []runtime.Object{
		modelPod(testNamespace, "ready", testPool, corev1.PodRunning, "10.1.0.5"),
		modelPod(testNamespace, "starting", testPool, corev1.PodPending, "10.1.0.6", "fd00::6"),
		modelPod(testNamespace, "scheduled", testPool, corev1.PodPending),
		modelPod(testNamespace, "done", testPool, corev1.PodSucceeded, "10.1.0.7"),
		modelPod(testNamespace, "failed", testPool, corev1.PodFailed, "10.1.0.8"),
		modelPod(testNamespace, "another-pool", "other", corev1.PodRunning, "10.1.0.9"),
		modelPod("other", "same-labels-elsewhere", testPool, corev1.PodRunning, "10.1.0.10"),
	}...)
	imp, ok := importBothWays(t, cs, testNamespace, testPool)
	require.True(t, ok)
	require.Len(t, imp.Status.Clusters, 1)
	c := imp.Status.Clusters[0]
	assert.Equal(t, []string{"10.1.0.5", "10.1.0.6", "fd00::6"}, c.EndpointAddresses)
	assert.Equal(t, metav1.ConditionTrue, condition(t, c.Conditions, v1alpha1.ConditionReady).Status)
}

// A pool without pods publishes none: its EPP can name nothing.
func TestImportOfAPoolWithoutPodsCarriesNoAddresses(t *testing.T) {
	imp, ok := importBothWays(t, exporterWithPods(t, inference.RoutingModeEndpoint), testNamespace, testPool)
	require.True(t, ok)
	assert.Empty(t, imp.Status.Clusters[0].EndpointAddresses)
}

// In ParentMode the gateway dials the parents, whose addresses the import
// carries already: no endpoint addresses.
func TestParentModeCarriesNoEndpointAddresses(t *testing.T) {
	imp, ok := importBothWays(t, exporterWithPods(t, inference.RoutingModeParent, modelPod(testNamespace, "ready", testPool, corev1.PodRunning, "10.1.0.5")), testNamespace, testPool)
	require.True(t, ok)
	assert.Empty(t, imp.Status.Clusters[0].EndpointAddresses)
}

// A member is untrusted: a pod address that is not an IP makes its entry
// carry none, not Ready, with a reason that says why; the same in summary
// mode, where the exporter's own server publishes that verdict.
func TestAMalformedPodAddressPublishesNone(t *testing.T) {
	cs := exporterWithPods(t, inference.RoutingModeEndpoint,
		modelPod(testNamespace, "ready", testPool, corev1.PodRunning, "10.1.0.5"),
		modelPod(testNamespace, "hostile", testPool, corev1.PodRunning, "10.1.0.0/0"),
	)
	imp, ok := importBothWays(t, cs, testNamespace, testPool)
	require.True(t, ok)
	c := imp.Status.Clusters[0]
	assert.Nil(t, c.EndpointAddresses)
	ready := condition(t, c.Conditions, v1alpha1.ConditionReady)
	assert.Equal(t, metav1.ConditionFalse, ready.Status)
	assert.Equal(t, v1alpha1.ReasonInvalidEndpointAddresses, ready.Reason)
	assert.Contains(t, ready.Message, "hostile")
}

// A summary is a member's word: a list that does not parse (a prefix
// wider than /24, a host name, too many entries) is dropped whole and the
// entry is not Ready; one that parses passes as it is.
func TestSummaryEntryChecksTheEndpointAddresses(t *testing.T) {
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady}
	for _, tt := range []struct {
		name  string
		mode  v1alpha1.RoutingMode
		addrs []string
		want  []string
		ok    bool
	}{
		{name: "addresses and prefixes pass", mode: v1alpha1.RoutingModeEndpoint, addrs: []string{"10.1.0.5", "10.2.0.0/24", "fd00::/64"}, want: []string{"10.1.0.5", "10.2.0.0/24", "fd00::/64"}, ok: true},
		{name: "everything", mode: v1alpha1.RoutingModeEndpoint, addrs: []string{"10.1.0.5", "0.0.0.0/0"}},
		{name: "a host name", mode: v1alpha1.RoutingModeEndpoint, addrs: []string{"kubernetes.default"}},
		{name: "too many", mode: v1alpha1.RoutingModeEndpoint, addrs: make([]string, 1025)},
		{name: "ParentMode carries none", mode: v1alpha1.RoutingModeParent, addrs: []string{"10.1.0.5"}, ok: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &v1alpha1.InferencePoolExportSummary{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool"},
				Status:     v1alpha1.InferencePoolExportSummaryStatus{RoutingMode: tt.mode, EndpointAddresses: tt.addrs, Conditions: []metav1.Condition{ready}},
			}
			entry, v := summaryEntry("b", s)
			assert.Equal(t, tt.want, entry.EndpointAddresses)
			assert.Equal(t, tt.ok, v.ok, v.message)
			if !tt.ok {
				assert.Equal(t, v1alpha1.ReasonInvalidEndpointAddresses, v.reason)
				assert.Contains(t, v.message, "cluster b")
			}
		})
	}
}
