package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJudgeOutlierCountsNewRequestsToTheFailingClusterBeyondItsProbes(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	// Ten requests a second over 20s, alternating between the clusters
	// before outlierAt, then all to cluster-c but for those in toA; the
	// fault heals at 15s and cluster-a serves again from backAt.
	traffic := func(outlierAt float64, toA map[int]bool, backAt float64) []request {
		var out []request
		for i := range 300 {
			s := -10 + float64(i)/10
			q := request{Sent: at(s), Done: at(s + 0.05), Code: 200, Cluster: "cluster-c"}
			if (s < outlierAt && i%2 == 0) || toA[i] || (s >= backAt && i%2 == 0) {
				q.Cluster = "cluster-a"
				if s >= 0 && s < 15 {
					q.Code = 500
				}
			}
			out = append(out, q)
		}
		return out
	}
	sink := window{fault: fault{ID: 1, Kind: errorSink, Target: "cluster-a"}, Start: start, Healed: at(15)}
	for _, tc := range []struct {
		name string
		w    window
		reqs []request
		ok   bool
	}{
		{"an error sink ejected at once, probed twice and back at once passes", sink, traffic(0.5, map[int]bool{153: true, 203: true}, 15), true},
		{"an error sink that keeps a share fails", sink, traffic(0.5, map[int]bool{151: true, 153: true, 155: true, 157: true, 203: true}, 15), false},
		{"an error sink never ejected fails", sink, traffic(15, nil, 15), false},
		{"an error sink back 31s after its heal fails", sink, traffic(0.5, nil, 46), false},
		{"a hung cluster taking no request after 2s passes", window{fault: fault{ID: 2, Kind: hungFirstByte, Target: "cluster-a"}, Start: start, Healed: at(8)}, traffic(1, map[int]bool{163: true}, 8), true},
		{"a hung cluster taking requests after 2s fails", window{fault: fault{ID: 2, Kind: hungFirstByte, Target: "cluster-a"}, Start: start, Healed: at(8)}, traffic(4, nil, 8), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := judgeOutlier(tc.w, tc.reqs, nil, at(60))
			assert.Equal(t, tc.ok, res.OK, "%+v", res)
			assert.InDelta(t, 0.5, res.ShareBefore, 0.01, "half the requests went to it before the fault")
		})
	}
}

func TestJudgeOutlierLeavesOutWithdrawals(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	end := at(60)
	sink := window{fault: fault{ID: 1, Kind: errorSink, Target: "cluster-a"}, Start: start, Healed: at(15)}
	hung := window{fault: fault{ID: 2, Kind: hungFirstByte, Target: "cluster-c"}, Start: start, Healed: at(8)}
	// Ten requests a second from -10s to 40s, all to cluster, failed by
	// the error sink while it holds.
	to := func(cluster string, from float64) []request {
		var out []request
		for i := range 500 {
			s := -10 + float64(i)/10
			if s < from {
				continue
			}
			q := request{Sent: at(s), Done: at(s + 0.001), Code: 200, Cluster: cluster}
			if cluster == "cluster-a" && s >= 0 && s < 15 {
				q.Code = 500
			}
			out = append(out, q)
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		w           window
		reqs        []request
		withdrawals []withdrawal
		// missed and notJudged are what the result's Why and NotJudged
		// contain; empty: nothing.
		missed, notJudged string
	}{
		{
			// The other cluster's export is withdrawn: every request goes
			// to the failing cluster, which is the last and is never ejected.
			name: "the other exporter withdrawn over the whole window: not judged", w: sink, reqs: to("cluster-a", -10),
			withdrawals: []withdrawal{{Cluster: "cluster-c", At: at(-1), Restored: at(12)}},
			notJudged:   "cluster-c's export of the data path pool was withdrawn from 1.0s before the fault to 12.0s into it (and 5s after): cluster-a was the last exporter",
		},
		{
			// Its own export is withdrawn before the fault and never
			// restored: no request can go to it, it cannot come back.
			name: "its own export withdrawn to the end: neither its share nor its return judged", w: sink, reqs: to("cluster-c", -10),
			withdrawals: []withdrawal{{Cluster: "cluster-a", At: at(-6)}},
			notJudged:   "its return within 30s of its heal: cluster-a's export of the data path pool was withdrawn from 6.0s before the fault to the end of the soak: no request could go to cluster-a",
		},
		{
			// The load generator's slots are full of requests held by the
			// only cluster: none is sent in the window.
			name: "no request sent while the hung cluster was the last: not judged", w: hung, reqs: append(to("cluster-a", 14), to("cluster-c", 12)...),
			withdrawals: []withdrawal{{Cluster: "cluster-a", At: at(-10), Restored: at(9)}},
			notJudged:   "cluster-c was the last exporter",
		},
		{
			name: "no request sent with both exporters in the choice: missed", w: hung, reqs: append(to("cluster-a", 14), to("cluster-c", 12)...),
			missed: "no request to judge from 2s into the fault to its heal",
		},
		{
			// Withdrawn for the first half of the judged window: the rest
			// is judged, and the failing cluster kept its share.
			name: "a withdrawal over part of the window leaves the rest judged", w: sink, reqs: to("cluster-a", -10),
			withdrawals: []withdrawal{{Cluster: "cluster-c", At: at(-1), Restored: at(4)}},
			missed:      "cluster-a took",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := judgeOutlier(tc.w, tc.reqs, tc.withdrawals, end)
			assert.False(t, res.OK, "a fault with something missed or not judged is not passed: %+v", res)
			if tc.missed == "" {
				assert.Empty(t, res.Why)
			} else {
				assert.Contains(t, res.Why, tc.missed)
			}
			if tc.notJudged == "" {
				assert.Empty(t, res.NotJudged)
			} else {
				assert.Contains(t, res.NotJudged, tc.notJudged)
			}
		})
	}
}

func TestJudgeOutlierCountsFailuresAtTheClusterUnderAWithdrawal(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := window{fault: fault{ID: 1, Kind: errorSink, Target: "cluster-a"}, Start: start, Healed: start.Add(15 * time.Second)}
	var reqs []request
	for i := range 150 {
		sent := start.Add(time.Duration(i) * 100 * time.Millisecond)
		reqs = append(reqs, request{Sent: sent, Done: sent.Add(time.Millisecond), Code: 500, Cluster: "cluster-a"})
	}
	// Sent just before the fault, failed by it.
	reqs = append(reqs, request{Sent: start.Add(-time.Millisecond), Done: start.Add(time.Millisecond), Code: 500, Cluster: "cluster-a"})
	reqs = append(reqs, request{Sent: start.Add(16 * time.Second), Code: 200, Cluster: "cluster-a"})
	res := judgeOutlier(w, reqs, []withdrawal{{Cluster: "cluster-c", At: start.Add(-time.Second)}}, start.Add(time.Minute))
	assert.Zero(t, res.Judged)
	assert.False(t, res.OK, "a fault with nothing to judge is not passed")
	assert.NotEmpty(t, res.NotJudged)
	assert.Equal(t, 151, res.FailedAt, "the requests the failing cluster failed are counted, the one under way at its start too")
}

func TestReportListsAFaultWithNothingToJudgeApartFromTheMissedTargets(t *testing.T) {
	begin := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return begin.Add(time.Duration(s * float64(time.Second))) }
	end := at(75)
	sink := window{fault: fault{ID: 1, Kind: errorSink, Target: "cluster-a", Hold: 11 * time.Second}, Start: at(12), Healed: at(23)}
	// cluster-a's export was withdrawn in the warm-up and never restored:
	// every request went to cluster-c.
	var reqs []request
	for i := range 700 {
		sent := at(float64(i) / 10)
		reqs = append(reqs, request{Sent: sent, Done: sent.Add(30 * time.Millisecond), Code: 200, Cluster: "cluster-c", Model: "m"})
	}
	wds := []withdrawal{{Cluster: "cluster-a", At: at(6), Converged: true, Gone: 100 * time.Millisecond}}
	cfg := config{Seed: 4242, Duration: 75 * time.Second, Warmup: 10 * time.Second, HealTarget: 5 * time.Second}
	r := buildReport(cfg, begin, end, []fault{sink.fault}, []window{sink}, nil, reqs, 0, wds, 0, watcherResult{}, nil, testTopology, "m")
	assert.Empty(t, r.Failures, "nothing missed")
	require.Len(t, r.NotJudged, 1)
	assert.Contains(t, r.NotJudged[0], "fault #1 error-sink cluster-a's model servers for 11s: not judged: its share from 5s into the fault to its heal: cluster-a's export of the data path pool was withdrawn from 6.0s before the fault to the end of the soak")
	md := r.markdown()
	assert.Contains(t, md, "# Chaos soak: PASS, 1 checks not judged")
	assert.Contains(t, md, "| not judged (below) |")
}
