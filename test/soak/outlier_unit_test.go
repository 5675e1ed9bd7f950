package soak

import (
	"strings"
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
			res := judgeOutlier(tc.w, tc.reqs, nil, nil, at(60))
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
			res := judgeOutlier(tc.w, tc.reqs, tc.withdrawals, nil, end)
			assertMissedOrNotJudged(t, res, tc.missed, tc.notJudged)
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
	res := judgeOutlier(w, reqs, []withdrawal{{Cluster: "cluster-c", At: start.Add(-time.Second)}}, nil, start.Add(time.Minute))
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

// TestReportDoesNotCountTheRequestsOfAnErrorSinkTheGatewayCouldNotReach
// replays fault #102 of seed 98153's 60-minute soak: cluster-c's
// kube-apiserver is paused from 4.7s before its model servers fail to
// 8.3s into it. cluster-b's mci-apiservers flag cluster-c unreachable
// as its model servers start failing, and mci-sidecar keeps a flagged
// cluster a candidate only after every reachable one: it takes one
// request, which fails, then none until the flag goes 9.1s into the
// fault, then every other request until the fifth failure in a row
// ejects it, 9.9s into it. Those four requests were not new requests
// outlier detection should have kept from it for 5s: it had seen one
// failure. Its share cannot be judged, and is not missed.
func TestReportDoesNotCountTheRequestsOfAnErrorSinkTheGatewayCouldNotReach(t *testing.T) {
	begin := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return begin.Add(time.Duration(s * float64(time.Second))) }
	end := at(75)
	paused := window{fault: fault{ID: 1, Kind: pause, Target: "cluster-c", Hold: 13 * time.Second}, Start: at(20), Healed: at(33)}
	sink := window{fault: fault{ID: 2, Kind: errorSink, Target: "cluster-c", Watcher: "cluster-b", Others: []string{"cluster-a"}, Hold: 10200 * time.Millisecond}, Start: at(24.7), Healed: at(34.9)}
	ms := []*measurement{
		{Label: "heal " + paused.fault.String(), Kind: "heal", FaultID: 1, Since: paused.Healed, Took: 760 * time.Millisecond},
		{Label: "heal " + sink.fault.String(), Kind: "heal", FaultID: 2, Since: sink.Healed, Took: 110 * time.Millisecond},
	}
	// Ten requests a second, every other one to cluster-c while it is
	// neither flagged (24.84s to 33.81s) nor ejected (from its fifth
	// failure in a row to 40s, when its probe succeeds).
	var reqs []request
	failures, ejectedAt := 0, time.Time{}
	for i := range 700 {
		sent := at(float64(i) / 10)
		q := request{Sent: sent, Done: sent.Add(25 * time.Millisecond), Code: 200, Cluster: "cluster-a", Model: "m"}
		flagged := !sent.Before(at(24.84)) && sent.Before(at(33.81))
		ejected := !ejectedAt.IsZero() && sent.Before(at(40))
		if i%2 == 0 && !flagged && !ejected {
			q.Cluster = "cluster-c"
			if !sent.Before(sink.Start) && sent.Before(sink.Healed) {
				q.Code, q.Done = 500, sent.Add(3*time.Millisecond)
				if failures++; failures == 5 {
					ejectedAt = sent
				}
			}
		}
		reqs = append(reqs, q)
	}
	require.Equal(t, at(34.6), ejectedAt, "the fifth failure in a row ejects it")

	cfg := config{Seed: 98153, Duration: 75 * time.Second, Warmup: 10 * time.Second, HealTarget: 5 * time.Second}
	r := buildReport(cfg, begin, end, []fault{paused.fault, sink.fault}, []window{paused, sink}, ms, reqs, 0, nil, 0, watcherResult{}, nil, testTopology, "m")
	assert.Empty(t, r.Failures, "nothing missed")
	require.Len(t, r.Outliers, 1)
	assert.Zero(t, r.Outliers[0].Judged, "every request of the window was sent while cluster-c was flagged, or within the settle after")
	assert.Equal(t, 5, r.Outliers[0].FailedAt, "the one before the flag and the four after are counted as failed at it")
	require.Len(t, r.NotJudged, 1)
	assert.Contains(t, r.NotJudged[0], "fault #2 error-sink cluster-c's model servers for 10.2s: not judged: its share from 5s into the fault to its heal: fault #1 apiserver-pause cluster-c for 13s")
	assert.Contains(t, r.NotJudged[0], "kept cluster-b's mci-apiservers from reaching cluster-c: it was flagged unreachable, a candidate only after every reachable cluster, from 0.7s before the fault at the earliest to 9.1s into it, when the views were fresh again (and 5s after)")
}

// TestJudgeOutlierLeavesOutTheFailingClusterWhileTheGatewayCannotReachIt:
// a fault that cuts the gateway cluster off the failing cluster takes it
// out of the choice, as a withdrawal of its export does, from when it
// may be flagged to withdrawalSettle after the views were fresh again;
// one that cuts it off the other exporter, or only slows a link, does
// not.
func TestJudgeOutlierLeavesOutTheFailingClusterWhileTheGatewayCannotReachIt(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	end := at(60)
	sink := window{fault: fault{ID: 1, Kind: errorSink, Target: "cluster-a"}, Start: start, Healed: at(15)}
	// Ten requests a second from -10s to 40s, every other one to the
	// failing cluster, which is never ejected: its share is missed
	// wherever it is judged.
	var reqs []request
	for i := range 500 {
		s := -10 + float64(i)/10
		q := request{Sent: at(s), Done: at(s + 0.01), Code: 200, Cluster: "cluster-c"}
		if i%2 == 0 {
			q.Cluster = "cluster-a"
			if s >= 0 && s < 15 {
				q.Code = 500
			}
		}
		reqs = append(reqs, q)
	}
	for _, tc := range []struct {
		name string
		cut  window
		// missed and notJudged are what the result's Why and NotJudged
		// contain; empty: nothing.
		missed, notJudged string
	}{
		{
			name: "its kube-apiserver paused over the whole window: not judged", cut: window{fault: fault{ID: 2, Kind: pause, Target: "cluster-a", Hold: 13 * time.Second}, Start: at(-4), Healed: at(9)},
			notJudged: "fault #2 apiserver-pause cluster-a for 13s, from 4.0s before the fault to 9.0s into it, kept cluster-b's mci-apiservers from reaching cluster-a: it was flagged unreachable, a candidate only after every reachable cluster, from 0.0s into it at the earliest to 10.0s into it",
		},
		{
			name: "the gateway's link to it cut over the whole window: not judged", cut: window{fault: fault{ID: 2, Kind: partition, Watcher: "cluster-b", Target: "cluster-a", Hold: 12 * time.Second}, Start: at(-2), Healed: at(10)},
			notJudged: "fault #2 partition cluster-b->cluster-a for 12s",
		},
		{
			name: "its kube-apiserver restarted over the whole window: not judged", cut: window{fault: fault{ID: 2, Kind: compaction, Target: "cluster-a", Hold: 25 * time.Second}, Start: at(-3), Healed: at(14)},
			notJudged: "fault #2 etcd-compaction cluster-a",
		},
		{
			// Paused from 6s before the fault, it was flagged until 5s
			// after its views were fresh again, 2s into the fault: the
			// rest of the window is judged.
			name: "a pause that ended before the window: judged", cut: window{fault: fault{ID: 2, Kind: pause, Target: "cluster-a", Hold: 7 * time.Second}, Start: at(-9), Healed: at(-2)},
			missed: "cluster-a took",
		},
		{
			name: "the other exporter's kube-apiserver paused: judged", cut: window{fault: fault{ID: 2, Kind: pause, Target: "cluster-c", Hold: 13 * time.Second}, Start: at(-4), Healed: at(9)},
			missed: "cluster-a took",
		},
		{
			name: "another cluster's link to it cut: judged", cut: window{fault: fault{ID: 2, Kind: partition, Watcher: "cluster-c", Target: "cluster-a", Hold: 12 * time.Second}, Start: at(-2), Healed: at(10)},
			missed: "cluster-a took",
		},
		{
			name: "the gateway's link to it slow: judged", cut: window{fault: fault{ID: 2, Kind: slow2s, Watcher: "cluster-b", Target: "cluster-a", Hold: 12 * time.Second}, Start: at(-2), Healed: at(10)},
			missed: "cluster-a took",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			healOf := map[int]*measurement{tc.cut.ID: {Kind: "heal", FaultID: tc.cut.ID, Took: time.Second}}
			res := judgeOutlier(sink, reqs, nil, cutOffsOf([]window{tc.cut}, healOf, "cluster-b"), end)
			assertMissedOrNotJudged(t, res, tc.missed, tc.notJudged)
		})
	}
}

// assertMissedOrNotJudged holds a judged fault that did not pass to what
// was missed and what was not judged ("": nothing), each a part of the
// judge's reason.
func assertMissedOrNotJudged(t *testing.T, res outlierResult, missed, notJudged string) {
	t.Helper()
	assert.False(t, res.OK, "a fault with something missed or not judged is not passed: %+v", res)
	if missed == "" {
		assert.Empty(t, res.Why)
	} else {
		assert.Contains(t, res.Why, missed)
	}
	if notJudged == "" {
		assert.Empty(t, res.NotJudged)
	} else {
		assert.Contains(t, res.NotJudged, notJudged)
	}
}

// A fault that cuts the gateway off the failing cluster starts its
// absence a fraction of a millisecond after the judged window does (seen
// in a 60-minute soak: two faults drawn 2 s apart, one judged from 2 s
// into it, the other excluding from 4 s into it): no request falls in
// what is left, which tells nothing of outlier detection. A longer rest
// with no request is still missed.
func TestJudgeOutlierLeavesOutAWindowItsAbsencesLeaveTooLittleOf(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	end := at(60)
	hung := window{fault: fault{ID: 2, Kind: hungFirstByte, Target: "cluster-c"}, Start: start, Healed: at(8)}
	// Ten requests a second to the other cluster, none sent in [from, until).
	sentBut := func(from, until float64) []request {
		var out []request
		for i := range 500 {
			s := -10 + float64(i)/10
			if s >= from && s < until {
				continue
			}
			out = append(out, request{Sent: at(s), Done: at(s + 0.001), Code: 200, Cluster: "cluster-a"})
		}
		return out
	}
	for _, tc := range []struct {
		name              string
		withdrawnAt       float64
		missed, notJudged string
	}{
		{name: "a fifth of a millisecond left: not judged", withdrawnAt: 2.0002, notJudged: "they leave 200µs of it, less than 1s"},
		{name: "a second and a half left without a request: missed", withdrawnAt: 3.5, missed: "no request to judge from 2s into the fault to its heal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withdrawals := []withdrawal{{Cluster: "cluster-c", At: at(tc.withdrawnAt), Restored: at(9)}}
			res := judgeOutlier(hung, sentBut(2, tc.withdrawnAt), withdrawals, nil, end)
			require.Zero(t, res.Judged, "no request is sent in what the withdrawal leaves of the window")
			assertMissedOrNotJudged(t, res, tc.missed, tc.notJudged)
		})
	}
}

// The heals' row says what the heals did, whatever else missed: a model
// server fault's miss names its heal too.
func TestTheHealsRowIsJudgedOnTheHealsAlone(t *testing.T) {
	r := &report{HealTarget: "p99 <= 2s", HealsMet: true, Failures: []string{"fault #17 hung-first-byte cluster-a's model servers for 6.3s: [no request to judge from 2s into the fault to its heal]"}}
	var row string
	for _, line := range strings.Split(r.markdown(), "\n") {
		if strings.HasPrefix(line, "| after a heal, every view equals a fresh LIST") {
			row = line
		}
	}
	assert.True(t, strings.HasSuffix(row, "| ok |"), "the heals met their target: %q", row)
	r.HealsMet = false
	assert.Contains(t, r.markdown(), "0 not converged | MISSED |")
}
