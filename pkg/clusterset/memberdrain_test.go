package clusterset

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/testutil"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/test/localclusterset"
)

// The drain annotation comes with the member's labels from the object
// that names it, and only from that source.
func TestMemberDrainComesFromTheObjectThatNamesTheMember(t *testing.T) {
	secret := func(name, cluster, drain string) *corev1.Secret {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mci-system", Labels: map[string]string{MemberClusterLabel: cluster}},
			Data:       map[string][]byte{MemberKubeconfigKey: kubeconfigFor("https://" + name)},
		}
		if drain != "" {
			s.Annotations = map[string]string{v1alpha1.DrainAnnotation: drain}
		}
		return s
	}
	d := newDesiredMembers("local")
	d.update("secrets", membersFromSecrets([]*corev1.Secret{secret("a", "cluster-a", "true"), secret("b", "cluster-b", ""), secret("c", "cluster-c", "yes")}))
	got := d.metas()
	for name, want := range map[string]struct {
		draining, invalid bool
	}{"cluster-a": {draining: true}, "cluster-b": {}, "cluster-c": {invalid: true}} {
		draining, err := got[name].draining()
		assert.Equal(t, want.draining, draining, name)
		assert.Equal(t, want.invalid, err != nil, name)
	}
}

// A member drained by the object that names it: every export of its
// cluster is flagged Draining in the imports, Ready as before; the change
// is an event, a log line and a metric, once; an annotation with another
// value is said once and drains nothing.
func TestADrainedMemberIsFlaggedOncePerChange(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const ns, name = "drained", "pool"
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"local"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	local := cs.Clusters[0].Config
	createExportedPool(ctx, t, local, ns, name)

	logged := captureKlog(t)
	members := make(reportingSource, 1)
	memberEvents := make(chan struct{}, 16)
	cache := New(Options{ClusterSetName: "test", LocalName: "local", Local: local, UnreachableAfter: 5 * time.Second, RemoveAfter: time.Minute, Summaries: SummariesNever}, func(ev Event) {
		if ev.Kind == KindMember && ev.Member == "remote" {
			select {
			case memberEvents <- struct{}{}:
			default:
			}
		}
	})
	go func() { _ = cache.Run(ctx, members) }()
	report := func(drain string) {
		t.Helper()
		for len(memberEvents) > 0 {
			<-memberEvents
		}
		members <- map[string]MemberConfig{"remote": {rest: asAnotherCluster(local, "remote-cluster-id"), fingerprint: "1", drain: drain}}
	}
	draining := func() *metav1.Condition {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		if !ok || len(imp.Status.Clusters) != 1 {
			return nil
		}
		return meta.FindStatusCondition(imp.Status.Clusters[0].Conditions, v1alpha1.ConditionDraining)
	}
	metric := func(draining, invalid int) string {
		return `
# HELP mci_clusterset_member_drain_invalid [ALPHA] 1 while the drain annotation of the Secret or ClusterProfile that names the member has a value other than "true" or "false", which is ignored: the member does not drain. Else 0.
# TYPE mci_clusterset_member_drain_invalid gauge
mci_clusterset_member_drain_invalid{member="local"} 0
mci_clusterset_member_drain_invalid{member="remote"} ` + string(rune('0'+invalid)) + `
# HELP mci_clusterset_member_draining [ALPHA] 1 while the Secret or ClusterProfile that names the member carries the drain annotation "true": its exports are flagged Draining in imports and sidecars send it no new requests; else 0.
# TYPE mci_clusterset_member_draining gauge
mci_clusterset_member_draining{member="local"} 0
mci_clusterset_member_draining{member="remote"} ` + string(rune('0'+draining)) + `
`
	}

	report("")
	require.Eventually(t, func() bool {
		imp, ok := imports.Import(cache.Snapshot(), ns, name)
		return cache.Ready() == nil && ok && len(imp.Status.Clusters) == 1
	}, time.Minute, 50*time.Millisecond, "the member's export is imported")
	assert.Nil(t, draining())

	report("true")
	select {
	case <-memberEvents:
	case <-time.After(10 * time.Second):
		t.Fatal("no member event for the member's drain")
	}
	d := draining()
	require.NotNil(t, d, "the drained member's export is flagged")
	assert.Equal(t, v1alpha1.ReasonMemberDrainRequested, d.Reason)
	assert.NoError(t, testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(metric(1, 0)), "mci_clusterset_member_draining", "mci_clusterset_member_drain_invalid"))

	report("true") // the same again: no change, no event, no line
	report("yes")
	require.Eventually(t, func() bool { return draining() == nil }, 10*time.Second, 20*time.Millisecond, "a value it ignores drains nothing")
	report("yes")
	report("")
	require.Eventually(t, func() bool {
		return testutil.CustomCollectAndCompare(NewMetrics(cache), strings.NewReader(metric(0, 0)), "mci_clusterset_member_draining", "mci_clusterset_member_drain_invalid") == nil
	}, 10*time.Second, 20*time.Millisecond)
	out := logged.String()
	assert.Equal(t, 1, strings.Count(out, `"Member drains`), out)
	assert.Equal(t, 1, strings.Count(out, `"Ignoring the drain annotation`), out)
	assert.Equal(t, 0, strings.Count(out, `"Member no longer drains`), "from true to an ignored value, the ignored value is what is said:\n%s", out)
}

// createExportedPool creates namespace ns and in it pool name, exported to
// the ClusterSet, in the cluster of config.
func createExportedPool(ctx context.Context, t *testing.T, config *rest.Config, ns, name string) {
	t.Helper()
	_, err := kubernetes.NewForConfigOrDie(config).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = mciclient.NewForConfigOrDie(config).InferencePoolV1().InferencePools(ns).Create(ctx, &poolv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
		Spec: poolv1.InferencePoolSpec{
			Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			TargetPorts:       []poolv1.Port{{Number: 8000}},
			EndpointPickerRef: poolv1.EndpointPickerRef{Name: "epp", Port: &poolv1.Port{Number: 9002}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}
