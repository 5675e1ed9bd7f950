package imports

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// transitionTimes collects the lastTransitionTime of every condition of an
// import, keyed by where it sits.
func transitionTimes(imp *inference.InferencePoolImport) map[string]time.Time {
	out := map[string]time.Time{}
	for _, c := range imp.Status.Conditions {
		out["status/"+c.Type] = c.LastTransitionTime.Time
	}
	for _, cl := range imp.Status.Clusters {
		for _, c := range cl.Conditions {
			out["clusters/"+cl.Name+"/"+c.Type] = c.LastTransitionTime.Time
		}
		for _, p := range cl.Parents {
			for _, c := range p.Conditions {
				out["clusters/"+cl.Name+"/parents/"+p.Namespace+"/"+p.Name+"/"+c.Type] = c.LastTransitionTime.Time
			}
		}
	}
	for _, ctrl := range imp.Status.Controllers {
		for _, c := range ctrl.Conditions {
			out["controllers/"+ctrl.Name+"/"+c.Type] = c.LastTransitionTime.Time
		}
	}
	return out
}

func TestCarryTransitionTimes(t *testing.T) {
	t1, t2 := metav1.NewTime(t0.Add(time.Hour)), metav1.NewTime(t0.Add(2*time.Hour))
	gatewayTime := t0
	ctrl := "controllers/" + v1alpha1.ControllerName

	// compute serves the import in cluster-z of a pool exported by
	// cluster-a (EndpointMode, its EPP ready or not) and, optionally,
	// cluster-p (ParentMode through a programmed Gateway).
	compute := func(t *testing.T, aReady bool, withParentCluster bool) *inference.InferencePoolImport {
		a := []runtime.Object{pool(testNamespace, testPool), service(testNamespace, testEPP)}
		if aReady {
			a = append(a, slice(testNamespace, testEPP, isReady))
		} else {
			a = append(a, slice(testNamespace, testEPP, isNotReady))
		}
		members := []Member{member(t, "cluster-a", a...), member(t, "cluster-z", namespace(testNamespace))}
		if withParentCluster {
			members = append(members, member(t, "cluster-p",
				pool(testNamespace, testPool, parentMode(poolv1.ParentReference{Name: "gw"})),
				gateway(testNamespace, "gw", []int32{80}, addresses("203.0.113.1"), programmed(metav1.ConditionTrue)),
			))
		}
		imp, ok := Import(clusterSet("cluster-z", members...), testNamespace, testPool)
		require.True(t, ok)
		return imp
	}

	tests := []struct {
		name string
		prev func(t *testing.T) *inference.InferencePoolImport
		next func(t *testing.T) *inference.InferencePoolImport
		want map[string]time.Time
	}{
		{
			name: "without a previous import every computed condition starts now",
			prev: func(t *testing.T) *inference.InferencePoolImport { return nil },
			next: func(t *testing.T) *inference.InferencePoolImport { return compute(t, true, false) },
			want: map[string]time.Time{
				"status/Accepted": t2.Time, "status/Ready": t2.Time,
				"clusters/cluster-a/Ready": t2.Time,
				ctrl + "/Accepted":         t2.Time, ctrl + "/Ready": t2.Time,
			},
		},
		{
			name: "unchanged statuses keep their previous times",
			prev: func(t *testing.T) *inference.InferencePoolImport {
				imp := compute(t, true, false)
				CarryTransitionTimes(nil, imp, t1)
				return imp
			},
			next: func(t *testing.T) *inference.InferencePoolImport { return compute(t, true, false) },
			want: map[string]time.Time{
				"status/Accepted": t1.Time, "status/Ready": t1.Time,
				"clusters/cluster-a/Ready": t1.Time,
				ctrl + "/Accepted":         t1.Time, ctrl + "/Ready": t1.Time,
			},
		},
		{
			name: "changed statuses move to now while unchanged ones stay",
			prev: func(t *testing.T) *inference.InferencePoolImport {
				imp := compute(t, true, false)
				CarryTransitionTimes(nil, imp, t1)
				return imp
			},
			next: func(t *testing.T) *inference.InferencePoolImport { return compute(t, false, false) },
			want: map[string]time.Time{
				"status/Accepted": t1.Time, "status/Ready": t2.Time,
				"clusters/cluster-a/Ready": t2.Time,
				ctrl + "/Accepted":         t1.Time, ctrl + "/Ready": t2.Time,
			},
		},
		{
			name: "a new cluster's conditions start now and a Gateway's own times are kept",
			prev: func(t *testing.T) *inference.InferencePoolImport {
				imp := compute(t, true, false)
				CarryTransitionTimes(nil, imp, t1)
				return imp
			},
			next: func(t *testing.T) *inference.InferencePoolImport { return compute(t, true, true) },
			want: map[string]time.Time{
				"status/Accepted": t1.Time, "status/Ready": t1.Time,
				"clusters/cluster-a/Ready":                         t1.Time,
				"clusters/cluster-p/Ready":                         t2.Time,
				"clusters/cluster-p/parents/example/gw/Accepted":   gatewayTime,
				"clusters/cluster-p/parents/example/gw/Programmed": gatewayTime,
				ctrl + "/Accepted":                                 t1.Time, ctrl + "/Ready": t1.Time,
			},
		},
		{
			name: "a parent condition without a time of its own is carried like the others",
			prev: func(t *testing.T) *inference.InferencePoolImport {
				imp := compute(t, true, true)
				imp.Status.Clusters[1].Parents[0].Conditions[0].LastTransitionTime = metav1.Time{}
				CarryTransitionTimes(nil, imp, t1)
				return imp
			},
			next: func(t *testing.T) *inference.InferencePoolImport {
				imp := compute(t, true, true)
				imp.Status.Clusters[1].Parents[0].Conditions[0].LastTransitionTime = metav1.Time{}
				return imp
			},
			want: map[string]time.Time{
				"status/Accepted": t1.Time, "status/Ready": t1.Time,
				"clusters/cluster-a/Ready":                         t1.Time,
				"clusters/cluster-p/Ready":                         t1.Time,
				"clusters/cluster-p/parents/example/gw/Accepted":   t1.Time,
				"clusters/cluster-p/parents/example/gw/Programmed": gatewayTime,
				ctrl + "/Accepted":                                 t1.Time, ctrl + "/Ready": t1.Time,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prev, next := tc.prev(t), tc.next(t)
			var before map[string]time.Time
			if prev != nil {
				before = transitionTimes(prev)
			}
			CarryTransitionTimes(prev, next, t2)
			got := transitionTimes(next)
			for k, v := range got {
				got[k] = v.UTC()
			}
			assert.Equal(t, tc.want, got)
			if prev != nil {
				assert.Equal(t, before, transitionTimes(prev), "prev is only read")
			}
		})
	}

	t.Run("a nil next is ignored", func(t *testing.T) {
		assert.NotPanics(t, func() { CarryTransitionTimes(compute(t, true, false), nil, t1) })
	})
}

func TestCarryExportTransitionTimes(t *testing.T) {
	t1, t2 := metav1.NewTime(t0.Add(time.Hour)), metav1.NewTime(t0.Add(2*time.Hour))
	export := func(t *testing.T, a map[string]string) *inference.InferencePoolExport {
		exp, ok := Export(clusterSet("cluster-a", member(t, "cluster-a", pool(testNamespace, testPool, annotations(a)))), testNamespace, testPool)
		require.True(t, ok)
		return exp
	}
	valid := map[string]string{v1alpha1.ExportAnnotation: "ClusterSet"}
	invalid := map[string]string{v1alpha1.ExportAnnotation: "Nope"}

	tests := []struct {
		name       string
		prev, next map[string]string
		want       metav1.Time
	}{
		{name: "a first export starts now", next: valid, want: t2},
		{name: "an unchanged validity keeps its time", prev: valid, next: valid, want: t1},
		{name: "an export that becomes invalid moves to now", prev: valid, next: invalid, want: t2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var prev *inference.InferencePoolExport
			if tc.prev != nil {
				prev = export(t, tc.prev)
				CarryExportTransitionTimes(nil, prev, t1)
			}
			next := export(t, tc.next)
			CarryExportTransitionTimes(prev, next, t2)
			assert.True(t, tc.want.Equal(&next.Status.Conditions[0].LastTransitionTime))
		})
	}
}

func TestClusterFinderFindsEveryClusterWhateverTheOrderOfTheLookups(t *testing.T) {
	listed := []inference.ImportedCluster{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
	tests := []struct {
		name    string
		lookups []string
	}{
		{name: "in the listed order", lookups: []string{"a", "b", "c", "d"}},
		{name: "a cluster that is gone is skipped", lookups: []string{"a", "c", "d"}},
		{name: "a new cluster is not found and the walk goes on", lookups: []string{"a", "ab", "b", "c", "d"}},
		{name: "in reverse", lookups: []string{"d", "c", "b", "a"}},
		{name: "twice", lookups: []string{"b", "b", "a", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := clusterFinder{clusters: listed}
			for _, name := range tt.lookups {
				got := f.find(name)
				if len(name) > 1 {
					assert.Nil(t, got, name)
					continue
				}
				require.NotNil(t, got, name)
				assert.Equal(t, name, got.Name)
			}
		})
	}
	assert.Nil(t, (&clusterFinder{}).find("a"), "no previous import")
}
