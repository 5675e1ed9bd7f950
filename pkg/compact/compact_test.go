package compact

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
)

// anImport is an import of pool i as a server of a large ClusterSet holds
// thousands of: one exporting cluster, ready.
func anImport(i int) *inference.InferencePoolImport {
	when := metav1.Unix(1763790000+int64(i), 0)
	conds := []metav1.Condition{
		{Type: "Accepted", Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: when, Reason: "Accepted", Message: "imported from 1 exporting cluster(s): cluster-03"},
		{Type: "Ready", Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: when, Reason: "Ready", Message: "ready in 1 of 1 exporting cluster(s): cluster-03"},
	}
	return &inference.InferencePoolImport{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         fmt.Sprintf("team-%03d", i%100),
			Name:              fmt.Sprintf("llama-3-8b-instruct-%05d", i),
			UID:               "2f0c8a8e-6a3b-5d0e-9a53-0a2c8e1b7f41",
			ResourceVersion:   "v2;cluster-a=2n9c1,~epoch=mwzfi5b4,~membership=mwzfi71l",
			Generation:        1,
			CreationTimestamp: when,
			Labels:            map[string]string{"app.kubernetes.io/name": "llama-3-8b", "team": "inference"},
		},
		Status: inference.InferencePoolImportStatus{
			Clusters: []inference.ImportedCluster{{
				Name: "cluster-03", RoutingMode: inference.RoutingModeEndpoint, TargetPortNumber: 8000,
				EndpointPicker: inference.EndpointPickerImport{
					Name:    fmt.Sprintf("epp-%05d", i),
					Service: []inference.ServiceImport{{Type: corev1.ServiceTypeLoadBalancer, Addresses: []string{fmt.Sprintf("10.3.%d.%d", i/250, i%250)}, Ports: []inference.Port{{Number: 9002}}}},
				},
				Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: when, Reason: "Ready",
					Message: fmt.Sprintf("Service team-%03d/epp-%05d in cluster cluster-03 has 2 ready endpoint(s)", i%100, i)}},
			}},
			Controllers:        []inference.ImportController{{Name: "mci.x-k8s.io/apiserver", ExportingClusters: []inference.ExportingCluster{{Name: "cluster-03"}}, Conditions: conds}},
			Conditions:         conds,
			ObservedGeneration: 1,
		},
	}
}

func TestEncodingRoundTrips(t *testing.T) {
	c := New()
	for i := range 50 {
		want := anImport(i)
		if i%7 == 0 {
			want.Labels = nil
			want.Status.Clusters[0].EndpointPicker.Health = &inference.HealthEndpoint{}
		}
		data, err := c.Encode(want)
		require.NoError(t, err)
		got := &inference.InferencePoolImport{}
		require.NoError(t, c.Decode(data, got))
		assert.True(t, equality.Semantic.DeepEqual(want, got), "import %d comes back as it went", i)
	}
}

func TestEqualValuesHaveEqualEncodings(t *testing.T) {
	c := New()
	a, err := c.Encode(anImport(3))
	require.NoError(t, err)
	b, err := c.Encode(anImport(3))
	require.NoError(t, err)
	assert.Equal(t, a, b)
	other, err := c.Encode(anImport(4))
	require.NoError(t, err)
	assert.NotEqual(t, a, other)
}

func TestGarbageIsAnErrorNotAPanic(t *testing.T) {
	c := New()
	assert.ErrorContains(t, c.Decode("\x01\x02\x03", &inference.InferencePoolImport{}), "nothing was encoded")
	_, err := c.Encode(anImport(1))
	require.NoError(t, err)
	for _, data := range []string{"", "\xff", "not deflate at all"} {
		assert.Error(t, c.Decode(data, &inference.InferencePoolImport{}), "%q", data)
	}
}

func TestConcurrentUse(t *testing.T) {
	c := New()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				want := anImport(g*100 + i)
				data, err := c.Encode(want)
				if !assert.NoError(t, err) {
					return
				}
				got := &inference.InferencePoolImport{}
				if assert.NoError(t, c.Decode(data, got)) {
					assert.True(t, equality.Semantic.DeepEqual(want, got))
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkImport reports what one import costs held compact (bytes/object)
// and what encoding and decoding it take.
func BenchmarkImport(b *testing.B) {
	const n = 1000
	c := New()
	encoded := make([]string, n)
	var total int
	for i := range n {
		var err error
		encoded[i], err = c.Encode(anImport(i))
		require.NoError(b, err)
		total += len(encoded[i])
	}
	b.Run("encode", func(b *testing.B) {
		imp := anImport(77)
		b.ReportAllocs()
		for b.Loop() {
			_, _ = c.Encode(imp)
		}
		b.ReportMetric(float64(total)/n, "bytes/object")
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_ = c.Decode(encoded[i%n], &inference.InferencePoolImport{})
			i++
		}
	})
}

func TestDigestsAreOfTheValueOnly(t *testing.T) {
	first, second := New(), New()
	_, err := second.Encode(anImport(9)) // another dictionary
	require.NoError(t, err)
	a, err := first.Digest(anImport(3))
	require.NoError(t, err)
	b, err := second.Digest(anImport(3))
	require.NoError(t, err)
	assert.Equal(t, a, b, "equal values, in codecs of other dictionaries")
	other, err := first.Digest(anImport(4))
	require.NoError(t, err)
	assert.NotEqual(t, a, other)
	_, err = first.Digest(func() {})
	assert.Error(t, err, "a value that does not encode")
}
