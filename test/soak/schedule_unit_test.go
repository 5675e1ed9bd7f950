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

// smokeScheduleOptions are the smoke's: 45s of faults after a 10s warm-up,
// export changes until halfway into its 20s tail.
var smokeScheduleOptions = scheduleOptions{
	Phase: 45 * time.Second, Gap: testScheduleOptions.Gap, OverlapGap: testScheduleOptions.OverlapGap, Hold: testScheduleOptions.Hold,
	Warmup: 10 * time.Second, ExportsUntil: 55 * time.Second,
}

func TestWithdrawalsOfTheDataPathLeaveEveryModelServerFaultSomethingToJudge(t *testing.T) {
	long := testScheduleOptions
	long.Warmup, long.ExportsUntil = time.Minute, long.Phase+time.Minute
	for _, o := range []struct {
		name  string
		opts  scheduleOptions
		seeds uint64
	}{{"smoke", smokeScheduleOptions, 500}, {"20 minutes", long, 50}} {
		planned, none := 0, 0
		for seed := range o.seeds {
			faults := newSchedule(seed, testTopology, o.opts)
			plan := planWithdrawals(seed, testTopology, o.opts, faults)
			assert.Equal(t, plan, planWithdrawals(seed, testTopology, o.opts, faults), "%s, seed %d: the same seed gives the same withdrawals", o.name, seed)
			planned += len(plan)
			if len(plan) == 0 {
				none++
			}
			for i, wd := range plan {
				assert.GreaterOrEqual(t, wd.At, -o.opts.Warmup, "%s, seed %d: %+v starts before the export changes", o.name, seed, wd)
				assert.LessOrEqual(t, wd.Restore, o.opts.ExportsUntil, "%s, seed %d: %+v ends after the export changes", o.name, seed, wd)
				assert.GreaterOrEqual(t, wd.Restore-wd.At, minWithdrawal, "%s, seed %d: %+v", o.name, seed, wd)
				if i > 0 {
					assert.GreaterOrEqual(t, wd.At, plan[i-1].Restore, "%s, seed %d: one withdrawal at a time", o.name, seed)
				}
				gone, back := wd.At, wd.Restore+withdrawalSettle
				for _, f := range faults {
					if f.Kind != errorSink && f.Kind != hungFirstByte {
						if (f.Kind == pause || f.Kind == compaction) && f.Target == wd.Cluster {
							// Each write takes up to a second.
							for _, at := range []time.Duration{wd.At, wd.Restore} {
								assert.False(t, at+time.Second > f.At-time.Second && at < f.At+f.held()+time.Second,
									"%s, seed %d: %s's kube-apiserver cannot take the write at %s under %s", o.name, seed, wd.Cluster, at, f)
							}
						}
						continue
					}
					// From a second before the fault to a second after its
					// heal its cluster, and another, are in the choice; an
					// error sink's cluster until it must serve again too.
					until := f.At + f.Hold + time.Second
					if wd.Cluster == f.Target && f.Kind == errorSink {
						until = f.At + f.Hold + errorSinkBackWithin
					}
					assert.False(t, gone < until && f.At-time.Second < back,
						"%s, seed %d: %s withdraws the data path pool from %s to %s (and %s), under %s at %s", o.name, seed, wd.Cluster, wd.At, wd.Restore, withdrawalSettle, f, f.At)
				}
			}
		}
		assert.Positive(t, planned, "%s: the schedules withdraw the data path pool", o.name)
		t.Logf("%s: %d withdrawals over %d seeds, %d seeds without one", o.name, planned, o.seeds, none)
	}
}
