package clusterset

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/localclusterset"
)

// TestAMemberListingPastItsLimitsIsFrozenBeforeTheListIsHeld reads a
// member double serving more summaries than its objects limit (or bytes
// limit) allows, as a plain list in pages and as a streaming list
// (watch-list). It is frozen at that limit as it lists: of a paged list,
// at most one page past the limit is read; of either, nothing is applied,
// so the member holds nothing of the list that passed its limit.
func TestAMemberListingPastItsLimitsIsFrozenBeforeTheListIsHeld(t *testing.T) {
	const summaries = 100000
	objects := Limits{Objects: 1000, Bytes: 64 << 20, ResponseBytes: 64 << 20, FreezeRetry: time.Hour}
	bytes := Limits{Objects: 50000, Bytes: 1 << 20, ResponseBytes: 64 << 20, FreezeRetry: time.Hour}
	for _, tc := range []struct {
		name      string
		limits    Limits
		answers   hostileAnswers
		streaming bool
		want      string
	}{
		{name: "10^5 summaries in pages", limits: objects, answers: hostileAnswers{summaries: summaries}, want: quotaObjects},
		{name: "10^5 summaries as a streaming list", limits: objects, answers: hostileAnswers{summaries: summaries}, streaming: true, want: quotaObjects},
		{name: "summaries of 10 kB past the bytes in pages", limits: bytes, answers: hostileAnswers{summaries: 5000, summarySize: 10 << 10}, want: quotaBytes},
		{name: "summaries of 10 kB past the bytes as a streaming list", limits: bytes, answers: hostileAnswers{summaries: 5000, summarySize: 10 << 10}, streaming: true, want: quotaBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			answers := tc.answers
			answers.clusterName, answers.noStreamingList = "hostile", !tc.streaming
			config, double := startMemberDouble(t, answers)
			m, err := newMember("hostile", "test", config, tc.limits.ResponseBytes, func(Event) {})
			require.NoError(t, err)
			m.quota = newQuota(tc.limits)
			m.start(ctx, thresholds{unreachableAfter: time.Minute})
			defer m.stop()
			require.Equal(t, modeSummary, m.mode)

			require.Eventually(t, func() bool {
				reason, _, _ := m.quota.state()
				return reason != ""
			}, 30*time.Second, 10*time.Millisecond, "frozen")
			reason, _, message := m.quota.state()
			assert.Equal(t, tc.want, reason)
			assert.Contains(t, message, "--member-max-")
			if !tc.streaming {
				t.Logf("%d summaries listed of %d", double.listed.Load(), answers.summaries)
				// The limit is passed within the first page of the bytes
				// case, at the third page of the objects case.
				assert.LessOrEqual(t, double.listed.Load(), int64(min(answers.summaries, tc.limits.Objects+listPageSize)), "at most one page past the limit is read")
				if tc.want == quotaBytes {
					assert.LessOrEqual(t, double.listed.Load(), int64(listPageSize), "at most one page past the limit is read")
				}
			}
			held, err := m.summaries.List(labels.Everything())
			require.NoError(t, err)
			assert.Zero(t, len(held), "a list past the limit is not applied")
		})
	}
}

// TestAMemberListingTooManyServicesInOneNamespaceIsFrozenBeforeTheListIsHeld
// reads a real kube-apiserver as a member in full mode whose pools'
// namespaces each hold Services within its objects limit, and together
// past it: once the first namespace is held, the list of the second one is
// counted with what the member holds in the first, so the member is frozen
// as it lists the second, and nothing of that list is held, as for a
// member that lists too many objects of a kind of all namespaces.
func TestAMemberListingTooManyServicesInOneNamespaceIsFrozenBeforeTheListIsHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cs, err := localclusterset.Up(ctx, localclusterset.Options{Dir: t.TempDir(), Clusters: []string{"member"}, Log: testLog{t}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cs.Stop()) })
	writer := rest.CopyConfig(cs.Clusters[0].Config)
	writer.QPS, writer.Burst = 1000, 1000
	kube := kubernetes.NewForConfigOrDie(writer)

	// Each namespace's Services fit the limit with everything else the
	// member holds; both do not.
	const services = 300
	limits := Limits{Objects: 450, Bytes: 64 << 20, ResponseBytes: 64 << 20, FreezeRetry: time.Hour}
	for _, ns := range []string{"first", "second"} {
		_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
		var g errgroup.Group
		g.SetLimit(16)
		for i := range services {
			g.Go(func() error {
				_, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%03d", i)},
					Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}},
				}, metav1.CreateOptions{})
				return err
			})
		}
		require.NoError(t, g.Wait())
	}
	createPool := func(ns string) {
		t.Helper()
		_, err := mciclient.NewForConfigOrDie(writer).InferencePoolV1().InferencePools(ns).Create(ctx, &poolv1.InferencePool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool", Annotations: map[string]string{v1alpha1.ExportAnnotation: v1alpha1.ExportScopeClusterSet}},
			Spec: poolv1.InferencePoolSpec{
				Selector:          poolv1.LabelSelector{MatchLabels: map[string]string{"app": "pool"}},
				TargetPorts:       []poolv1.Port{{Number: 8000}},
				EndpointPickerRef: poolv1.EndpointPickerRef{Name: "svc-000", Port: &poolv1.Port{Number: 80}},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	createPool("first")

	m, err := newMember("member", "test", asAnotherCluster(cs.Clusters[0].Config, "member-cluster-id"), limits.ResponseBytes, func(Event) {})
	require.NoError(t, err)
	m.quota = newQuota(limits)
	m.start(ctx, thresholds{unreachableAfter: time.Minute})
	defer m.stop()
	require.Equal(t, modeFull, m.mode)
	held := func(ns string) int {
		svcs, err := m.services.Services(ns).List(labels.Everything())
		require.NoError(t, err)
		return len(svcs)
	}
	require.Eventually(t, func() bool { return held("first") == services }, time.Minute, 20*time.Millisecond, "the first namespace's Services are held")
	reason, _, _ := m.quota.state()
	require.Empty(t, reason, "within its limits with one namespace")

	// The second namespace's Services are listed once it has a pool.
	createPool("second")
	require.Eventually(t, func() bool {
		reason, _, _ := m.quota.state()
		return reason != ""
	}, time.Minute, 10*time.Millisecond, "frozen")
	reason, _, message := m.quota.state()
	assert.Equal(t, quotaObjects, reason)
	assert.Contains(t, message, "--member-max-objects")
	// The informers are stopped: nothing more arrives after a moment.
	time.Sleep(500 * time.Millisecond)
	assert.Zero(t, held("second"), "the list that passed the limit is not applied")
	assert.Equal(t, services, held("first"), "what the member held before is kept")
}
