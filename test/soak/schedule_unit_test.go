package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testTopology = topology{
	Clusters: []string{"cluster-a", "cluster-b", "cluster-c"}, Gateway: "cluster-b",
	Exporters: []string{"cluster-a", "cluster-c"}, Rotating: [2]string{"cluster-b", "cluster-a"}, Named: [2]string{"cluster-c", "cluster-a"},
}

var testScheduleOptions = scheduleOptions{
	Phase: 20 * time.Minute, Gap: [2]time.Duration{8 * time.Second, 25 * time.Second},
	OverlapGap: [2]time.Duration{time.Second, 4 * time.Second}, Hold: [2]time.Duration{6 * time.Second, 20 * time.Second},
}

func TestScheduleReplaysFromItsSeed(t *testing.T) {
	a := newSchedule(42, testTopology, testScheduleOptions)
	require.NotEmpty(t, a)
	assert.Equal(t, a, newSchedule(42, testTopology, testScheduleOptions), "the same seed gives the same schedule")
	assert.NotEqual(t, a, newSchedule(43, testTopology, testScheduleOptions), "another seed gives another schedule")
}

func TestScheduleKeepsFaultsApartOnOneResourceAndWithinThePhase(t *testing.T) {
	for seed := range uint64(50) {
		faults := newSchedule(seed, testTopology, testScheduleOptions)
		kinds := map[faultKind]bool{}
		overlapping := 0
		for i, f := range faults {
			kinds[f.Kind] = true
			assert.LessOrEqual(t, f.At+f.Hold, testScheduleOptions.Phase, "seed %d: %s ends after the phase", seed, f)
			assert.NotEqual(t, f.Watcher, f.Target, "seed %d: %s", seed, f)
			for _, g := range faults[:i] {
				if f.At < g.At+g.Hold {
					overlapping++
				}
				if f.At < g.At+g.held()+time.Second {
					for _, r := range f.resources() {
						assert.NotContains(t, g.resources(), r, "seed %d: %s and %s hold %s at once", seed, g, f, r)
					}
				}
			}
		}
		assert.Len(t, kinds, len(allKinds)+len(laneKinds), "seed %d: a 20-minute schedule draws every kind of fault", seed)
		assert.Positive(t, overlapping, "seed %d: a 20-minute schedule has overlapping faults", seed)
	}
}

func TestScheduleOfTheSmokeHoldsEveryModelServerAndMemberFault(t *testing.T) {
	for seed := range uint64(200) {
		faults := newSchedule(seed, testTopology, scheduleOptions{
			Phase: 45 * time.Second, Gap: testScheduleOptions.Gap, OverlapGap: testScheduleOptions.OverlapGap, Hold: testScheduleOptions.Hold,
		})
		kinds := map[faultKind]int{}
		for _, f := range faults {
			kinds[f.Kind]++
			if f.Kind == errorSink || f.Kind == hungFirstByte {
				assert.Equal(t, testTopology.Gateway, f.Watcher, "seed %d: %s", seed, f)
				assert.Contains(t, testTopology.Exporters, f.Target, "seed %d: %s", seed, f)
				assert.Len(t, f.Others, len(testTopology.Exporters)-1, "seed %d: %s", seed, f)
			}
		}
		for _, k := range laneKinds {
			assert.Positive(t, kinds[k], "seed %d: the smoke's 45s of faults hold a %s", seed, k)
		}
	}
}
