package discovery

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestReadyPods(t *testing.T) {
	pod := func(name, ip string, ready corev1.ConditionStatus, mutate ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
		}
		if ready != "" {
			p.Status.Conditions = []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
				{Type: corev1.PodReady, Status: ready},
			}
		}
		for _, m := range mutate {
			m(p)
		}
		return p
	}
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }

	tests := []struct {
		name string
		pods []*corev1.Pod
		want []string
	}{
		{name: "a pod with an IP and Ready=True is ready", pods: []*corev1.Pod{pod("a", "127.0.1.1", corev1.ConditionTrue)}, want: []string{"a"}},
		{name: "Ready=False is not ready", pods: []*corev1.Pod{pod("a", "127.0.1.1", corev1.ConditionFalse)}, want: nil},
		{name: "Ready=Unknown is not ready", pods: []*corev1.Pod{pod("a", "127.0.1.1", corev1.ConditionUnknown)}, want: nil},
		{name: "no Ready condition is not ready", pods: []*corev1.Pod{pod("a", "127.0.1.1", "")}, want: nil},
		{name: "no pod IP is not ready", pods: []*corev1.Pod{pod("a", "", corev1.ConditionTrue)}, want: nil},
		{name: "a pod being deleted is not ready", pods: []*corev1.Pod{pod("a", "127.0.1.1", corev1.ConditionTrue, deleting)}, want: nil},
		{name: "only the ready pods of several", pods: []*corev1.Pod{pod("a", "127.0.1.1", corev1.ConditionTrue), pod("b", "127.0.1.2", corev1.ConditionFalse), pod("c", "127.0.1.3", corev1.ConditionTrue)}, want: []string{"a", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, inst := range sortedInstances(ReadyPods(tt.pods)) {
				got = append(got, inst.ID)
				assert.Equal(t, "ns", inst.Namespace)
				assert.NotEmpty(t, inst.Address)
			}
			assert.Equal(t, tt.want, got)
		})
	}
}
