package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// faultKind is one kind of fault the soak injects.
type faultKind string

const (
	// Member link faults: the replicas of Watcher lose Target.
	partition faultKind = "partition"  // MemberLink cut: refused, RST
	blackhole faultKind = "blackhole"  // MemberLink accepts, never answers
	slow500ms faultKind = "slow-500ms" // MemberLink 500ms ± 50ms latency
	slow2s    faultKind = "slow-2s"    // MemberLink 2s ± 200ms latency
	eppStall  faultKind = "epp-stall"  // EPPLink(Target) blackholed: streams stall mid-way
	eppReset  faultKind = "epp-reset"  // EPPLink(Target) resets every connection as it carries data
	restart   faultKind = "replica-restart"
	pause     faultKind = "apiserver-pause" // Target's kube-apiserver SIGSTOPped
	rotation  faultKind = "secret-rotation" // Watcher's member Secret for Target gets a new token, the old one revoked
	// Model server faults, which mci-sidecar's outlier detection in
	// Watcher (the gateway cluster) must take Target out for.
	errorSink     faultKind = "error-sink"      // Target's model servers answer 500 at once
	hungFirstByte faultKind = "hung-first-byte" // Target's model servers hold every request before its first byte
	// Faults of a member's state, which every watcher of Target must
	// come back from.
	compaction faultKind = "etcd-compaction"  // etcd compacted to its revision, Target's kube-apiserver restarted: every watch on it gets 410 Gone
	recreated  faultKind = "member-recreated" // Target's namespace recreatedNS deleted and recreated: new UIDs, new resourceVersions
	// upgrade: Target's mci-apiserver replicas replaced one at a time,
	// each once the other serves, as a rollout with one replica
	// unavailable at most: the watchers of its imports (mci-sidecar among
	// them) move from the old replicas to the new ones.
	upgrade faultKind = "apiserver-rolling-upgrade"
	// certRenewal: Target's kube-apiserver gets a new serving
	// certificate from the same CA while every watcher's watches are open
	// on it (certrenewal_test.go says why this rotation).
	certRenewal faultKind = "serving-cert-renewal"
	// nameFailure: the host name by which Watcher's member Secret names
	// Target stops resolving, its connections cut, then resolves again
	// (dnsfailure_test.go says how without a DNS query).
	nameFailure faultKind = "member-name-unresolvable"
)

// allKinds are drawn at random; outlierKinds and memberKinds take turns
// on lanes of their own (see newSchedule).
var (
	allKinds     = []faultKind{partition, blackhole, slow500ms, slow2s, eppStall, eppReset, restart, pause, rotation}
	outlierKinds = []faultKind{errorSink, hungFirstByte}
	memberKinds  = []faultKind{compaction, recreated}
	// laneKinds are the kinds every schedule holds, the smoke's too.
	laneKinds = append(append(slices.Clone(outlierKinds), memberKinds...), upgrade, certRenewal, nameFailure)
)

// outlierRecovery is how long after its heal a model server fault may
// still keep its cluster ejected: the longest ejection,
// --outlier-max-ejection-time (20s), and a probe.
const outlierRecovery = 22 * time.Second

// fault is one scheduled fault: it starts At after the fault phase begins
// and heals Hold later.
type fault struct {
	ID   int           `json:"id"`
	Kind faultKind     `json:"kind"`
	At   time.Duration `json:"at"`
	Hold time.Duration `json:"hold"`
	// Watcher is the cluster whose replicas see the fault (member link
	// faults, restart, rotation); empty for the others.
	Watcher string `json:"watcher,omitempty"`
	// Target is the member, the EPP's cluster or the paused cluster.
	Target string `json:"target"`
	// Others are, for a model server fault, the other exporters of the
	// data path pool, which must serve what Target does not.
	Others []string `json:"others,omitempty"`
}

func (f fault) String() string {
	where := f.Target
	if f.Watcher != "" {
		where = f.Watcher + "->" + f.Target
	}
	if f.Kind == restart {
		where = f.Watcher + " replica " + f.Target
	}
	if f.Kind == errorSink || f.Kind == hungFirstByte {
		where = f.Target + "'s model servers"
	}
	if f.Kind == recreated {
		where = f.Target + "/" + recreatedNS
	}
	return fmt.Sprintf("#%d %s %s for %s", f.ID, f.Kind, where, f.Hold)
}

// resources are what two faults may not hold at once: one link, one
// process, the Secret. A replica restart holds its cluster's
// kube-apiserver too: a replica cannot become ready while it is paused.
func (f fault) resources() []string {
	switch f.Kind {
	case partition, blackhole, slow500ms, slow2s:
		return []string{"link " + f.Watcher + "->" + f.Target}
	case eppStall, eppReset:
		return []string{"epp " + f.Target}
	case restart:
		return []string{"replica " + f.Watcher + "/" + f.Target, "apiserver " + f.Watcher}
	case upgrade:
		// Not with a compaction: a new replica's first listing of a
		// member whose kube-apiserver restarts waits out the reflectors'
		// backoff, which the compaction's heal measures.
		return []string{"replica " + f.Target + "/0", "replica " + f.Target + "/1", "apiserver " + f.Target, "etcd"}
	case pause:
		return []string{"apiserver " + f.Target, "apiserver process " + f.Target}
	case certRenewal:
		// Only what stops the kube-apiserver: a paused one reloads
		// nothing, a restarted one ends the watches it must keep.
		return []string{"apiserver process " + f.Target}
	case compaction:
		// One etcd under every kube-apiserver: one compaction at a time.
		return []string{"apiserver " + f.Target, "apiserver process " + f.Target, "etcd"}
	case recreated:
		// Its deletion and recreation go through Target's kube-apiserver.
		return []string{"namespace " + f.Target + "/" + recreatedNS, "apiserver " + f.Target}
	case nameFailure:
		// Its member is reached by that name only through the Secret,
		// and through that link; a member stopped or paused meanwhile
		// would be flagged for that.
		return []string{"secret " + f.Watcher + "->" + f.Target, "link " + f.Watcher + "->" + f.Target, "apiserver process " + f.Target}
	case rotation:
		// It writes to both clusters' kube-apiservers.
		return []string{"secret " + f.Watcher + "->" + f.Target, "apiserver " + f.Watcher, "apiserver " + f.Target}
	case errorSink, hungFirstByte:
		// Whatever takes another exporter out of the gateway's choice:
		// with the other exporter out, the failing cluster would be the last,
		// which outlier detection never ejects, and its share could not
		// be judged.
		out := []string{"model servers"}
		for _, c := range f.Others {
			out = append(out, "epp "+c, "apiserver "+c, "link "+f.Watcher+"->"+c)
		}
		return out
	}
	return []string{string(f.Kind)}
}

// onDataPath reports whether the fault can fail a request through the
// gateway in gateway: the EPP links, and whatever changes what the
// gateway cluster's mci-apiservers serve to mci-sidecar (its member
// links, its replicas, its member Secret, an exporter's kube-apiserver).
func (f fault) onDataPath(gateway string) bool {
	switch f.Kind {
	case eppStall, eppReset, pause, errorSink, hungFirstByte, compaction:
		return true
	case partition, blackhole, slow500ms, slow2s, restart, rotation, nameFailure:
		return f.Watcher == gateway
	}
	// recreated: its namespace carries no traffic. upgrade: one replica
	// serves throughout, so no request through the gateway may fail in
	// its window. certRenewal: neither may one fail in its window.
	return false
}

// topology is what the schedule draws from.
type topology struct {
	Clusters  []string
	Gateway   string
	Exporters []string
	// Rotating is the member Secret that rotations change: the gateway
	// cluster's Secret for the first exporter.
	Rotating [2]string
	// Named is the member Secret that names its member by a host name
	// (nameFailure): the second exporter's Secret for the first, off the
	// data path, so that its member's flag is judged on its own.
	Named [2]string
	// Regional is the exporter whose region the regional route is
	// restricted to; empty when the soak has no regional route.
	Regional string
}

// scheduleOptions shape a schedule.
type scheduleOptions struct {
	// Phase is how long faults may run: every fault heals before it ends.
	Phase time.Duration
	// Gap is the range of the time between two fault starts; one start in
	// four follows the previous one within OverlapGap instead, so faults
	// overlap.
	Gap        [2]time.Duration
	OverlapGap [2]time.Duration
	// Hold is the range of a fault's duration.
	Hold [2]time.Duration
	// Warmup is how long before the phase the export changes start, and
	// ExportsUntil when, from the phase's start, they stop: the
	// withdrawals of the data path pool fall in between (planWithdrawals).
	Warmup, ExportsUntil time.Duration
}

// held is how long f holds its resources: a model server fault until
// its cluster is back in the choice.
func (f fault) held() time.Duration {
	if f.Kind == errorSink || f.Kind == hungFirstByte {
		return f.Hold + outlierRecovery
	}
	return f.Hold
}

// newSchedule draws the faults of a soak from seed: the same seed, topology
// and options give the same schedule. The model server faults take turns
// on a lane of their own, from 2s into the phase, each after the last one's
// cluster is back, and the member faults on another, so that every
// schedule (the smoke's 45s too) holds each of those kinds at least once;
// the other kinds are drawn at random around them.
func newSchedule(seed uint64, topo topology, o scheduleOptions) []fault {
	faults := outlierLane(seed, topo, o.Phase)
	faults = memberLane(seed, topo, o.Phase, faults)
	faults = upgradeLane(topo, o.Phase, faults)
	faults = renewalLane(topo, o.Phase, faults)
	faults = nameFailureLane(topo, o.Phase, faults)
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	between := func(r [2]time.Duration) time.Duration {
		if r[1] <= r[0] {
			return r[0]
		}
		return r[0] + time.Duration(rng.Int64N(int64(r[1]-r[0])))
	}
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	at := between(o.Gap) / 2
	for {
		f := fault{ID: len(faults) + 1, At: at.Round(100 * time.Millisecond), Kind: allKinds[rng.IntN(len(allKinds))]}
		f.Hold = between(o.Hold).Round(100 * time.Millisecond)
		switch f.Kind {
		case partition, blackhole, slow500ms, slow2s:
			f.Watcher = pick(topo.Clusters)
			f.Target = pick(slices.DeleteFunc(slices.Clone(topo.Clusters), func(c string) bool { return c == f.Watcher }))
		case eppStall, eppReset:
			f.Target = pick(topo.Exporters)
			// An EPP fault is a short stall or burst of resets, not an
			// outage of the cluster.
			f.Hold = min(f.Hold, 8*time.Second)
		case restart:
			// Replica 1 only: replica 0 of every cluster runs the whole
			// soak, so its heap, goroutines and descriptors compare over
			// the whole run. Hold is the time it stays down.
			f.Watcher, f.Target = pick(topo.Clusters), "1"
			f.Hold = min(f.Hold, 6*time.Second)
		case pause:
			// Exporters only: pausing the gateway cluster's kube-apiserver
			// stops the aggregator every view goes through.
			f.Target = pick(topo.Exporters)
		case rotation:
			f.Watcher, f.Target = topo.Rotating[0], topo.Rotating[1]
			// A rotation is one change; Hold is the window in which it
			// could explain a failure.
			f.Hold = 10 * time.Second
		}
		if f.At+f.Hold > o.Phase {
			break
		}
		if !busy(faults, f) {
			faults = append(faults, f)
		}
		if rng.IntN(4) == 0 {
			at += between(o.OverlapGap)
		} else {
			at += between(o.Gap)
		}
	}
	slices.SortStableFunc(faults, func(a, b fault) int { return int(a.At - b.At) })
	for i := range faults {
		faults[i].ID = i + 1
	}
	return faults
}

// outlierLane is the model server faults of a schedule: an error sink
// held 10s or more (5s to be ejected, then at least 5s to judge its
// share) and a hung first byte held 6 to 8s (its held requests are
// answered at the heal, within the soak client's 15s timeout), in turn,
// each more than outlierRecovery after the last heal.
func outlierLane(seed uint64, topo topology, phase time.Duration) []fault {
	rng := rand.New(rand.NewPCG(seed, 0x0e1))
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	var faults []fault
	at := 2 * time.Second
	for i := 0; ; i++ {
		f := fault{Kind: outlierKinds[i%len(outlierKinds)], At: at.Round(100 * time.Millisecond), Watcher: topo.Gateway}
		f.Target = topo.Exporters[rng.IntN(len(topo.Exporters))]
		f.Others = slices.DeleteFunc(slices.Clone(topo.Exporters), func(c string) bool { return c == f.Target })
		if f.Kind == errorSink {
			f.Hold = between(10*time.Second, max(10*time.Second, min(20*time.Second, phase/4)))
		} else {
			f.Hold = between(6*time.Second, 8*time.Second)
		}
		f.Hold = f.Hold.Round(100 * time.Millisecond)
		if f.At+f.Hold > phase {
			return faults
		}
		faults = append(faults, f)
		at = f.At + f.Hold + between(outlierRecovery+time.Second, max(outlierRecovery+time.Second, phase/10))
	}
}

// upgradeHold is a rolling upgrade's budget in the schedule: two replica
// restarts, each 3 to 6s on the shared 2 cores while no member restarts
// (seen: 16s for one that started while a member's kube-apiserver did,
// which the upgrade now never overlaps). It heals when its last replica
// is ready, however long that takes.
const upgradeHold = 12 * time.Second

// upgradeLane adds one rolling upgrade of the gateway cluster's
// mci-apiservers, a fifth into the phase (else a second later while what
// it needs is busy). One: it replaces replica 0 too, whose growth a long
// soak judges over its last process, which then covers the rest of the
// run.
func upgradeLane(topo topology, phase time.Duration, faults []fault) []fault {
	return placeOnce(faults, phase, phase/5, fault{Kind: upgrade, Target: topo.Gateway, Hold: upgradeHold})
}

// placeOnce adds to faults the first of candidates whose needs no fault
// already scheduled holds, from from into the phase, a second later each
// time round; none when none fits within the phase.
func placeOnce(faults []fault, phase, from time.Duration, candidates ...fault) []fault {
	for at := from.Round(100 * time.Millisecond); ; at += time.Second {
		for _, f := range candidates {
			f.At = at
			if f.At+f.Hold > phase {
				return faults
			}
			if !busy(faults, f) {
				return append(faults, f)
			}
		}
	}
}

// renewalHold is a serving certificate renewal's budget in the schedule:
// the kube-apiserver's reload and the checks. It heals when they are done.
const renewalHold = 15 * time.Second

// renewalLane adds one serving certificate renewal of an exporter's
// kube-apiserver, which the gateway cluster's replicas watch, from a
// quarter into the phase (else a second later, or on the other exporter, while
// what it needs is busy).
func renewalLane(topo topology, phase time.Duration, faults []fault) []fault {
	var candidates []fault
	for _, target := range topo.Exporters {
		candidates = append(candidates, fault{Kind: certRenewal, Target: target, Hold: renewalHold})
	}
	return placeOnce(faults, phase, phase/4, candidates...)
}

// nameFailureHold is how long the rotating member's name does not
// resolve: past the unreachable threshold and a probe interval, so that
// the member is flagged, and a few seconds of it flagged.
const nameFailureHold = unreachableAfter + 5*time.Second

// nameFailureLane adds one name failure of the named member Secret's
// member, from 3/10 into the phase.
func nameFailureLane(topo topology, phase time.Duration, faults []fault) []fault {
	f := fault{Kind: nameFailure, Watcher: topo.Named[0], Target: topo.Named[1], Hold: nameFailureHold}
	return placeOnce(faults, phase, 3*phase/10, f)
}

// memberLane adds the member faults to faults, drawn from seed: an etcd
// compaction and a member recreated in turn, from 5s into the phase, each
// on an exporter that no fault already scheduled holds (else a second
// later), 15s to phase/10 after the last one starts. A compaction's Hold
// is the window in which the restart it includes may explain a failure;
// a recreation's is the time from the deletion to the recreation (longer
// when the namespace takes longer to go).
func memberLane(seed uint64, topo topology, phase time.Duration, faults []fault) []fault {
	rng := rand.New(rand.NewPCG(seed, 0x3e3))
	at := 5 * time.Second
	for i := 0; ; {
		f := fault{Kind: memberKinds[i%len(memberKinds)], At: at.Round(100 * time.Millisecond)}
		// A kube-apiserver restart takes 10 to 25s on the shared 2 cores:
		// longer, and the injector waits for it.
		f.Hold = 25 * time.Second
		if f.Kind == recreated {
			f.Hold = 6 * time.Second
		}
		if f.At+f.Hold > phase {
			return faults
		}
		placed := false
		for _, j := range rng.Perm(len(topo.Exporters)) {
			f.Target = topo.Exporters[j]
			if !busy(faults, f) {
				faults = append(faults, f)
				placed = true
				break
			}
		}
		if !placed {
			at += time.Second
			continue
		}
		i++
		lo := 15 * time.Second
		at += lo + time.Duration(rng.Int64N(int64(max(time.Second, phase/10-lo))))
	}
}

// busy reports whether a fault already scheduled holds one of f's
// resources while f would.
func busy(faults []fault, f fault) bool {
	for _, g := range faults {
		if f.At >= g.At+g.held()+time.Second || g.At >= f.At+f.held()+time.Second {
			continue
		}
		for _, r := range f.resources() {
			if slices.Contains(g.resources(), r) {
				return true
			}
		}
	}
	return false
}

// withdrawalSettle is how long after a withdrawal of the data path
// pool's export is restored the gateway may still leave its cluster out of
// the choice: the import's convergence and mci-sidecar's informer lag.
// Requests sent meanwhile are judged as sent under the withdrawal.
const withdrawalSettle = 5 * time.Second

// Withdrawals of the data path pool last withdrawalHold, shortened down to
// minWithdrawal where the next model server fault leaves no more room:
// long enough to see the import converge and the gateway stop routing to
// the cluster.
var (
	withdrawalHold = [2]time.Duration{15 * time.Second, 30 * time.Second}
	minWithdrawal  = 10 * time.Second
)

// plannedWithdrawal is a withdrawal of the data path pool's export by
// Cluster, from At to Restore, both counted from the start of the fault
// phase: At is negative in the warm-up, when export changes already run.
type plannedWithdrawal struct {
	Cluster string        `json:"cluster"`
	At      time.Duration `json:"at"`
	Restore time.Duration `json:"restore"`
}

// planWithdrawals draws the withdrawals of the data path pool's export
// from seed, one at a time, around the faults of a schedule: the first at
// the first export change where one fits, then a chance in four at each
// change (every 4 to 10s from the start of the export changes), each on an
// exporter where it fits (withdrawalFits), restored before the export
// changes stop. The faults are placed first, so a seed's faults are the
// same with or without them.
func planWithdrawals(seed uint64, topo topology, o scheduleOptions, faults []fault) []plannedWithdrawal {
	rng := rand.New(rand.NewPCG(seed, 0x3d))
	between := func(r [2]time.Duration) time.Duration {
		return r[0] + time.Duration(rng.Int64N(int64(r[1]-r[0])))
	}
	var out []plannedWithdrawal
	for at := -o.Warmup; ; {
		at += between([2]time.Duration{4 * time.Second, 10 * time.Second})
		if at+minWithdrawal > o.ExportsUntil {
			return out
		}
		// The first at the first change where one fits, so that short
		// schedules (the smoke's) hold one too.
		if rng.IntN(4) != 0 && len(out) > 0 {
			continue
		}
		want := between(withdrawalHold)
		for _, j := range rng.Perm(len(topo.Exporters)) {
			wd, ok := fitWithdrawal(faults, topo, o, plannedWithdrawal{Cluster: topo.Exporters[j], At: at.Round(100 * time.Millisecond)}, want)
			if ok {
				out = append(out, wd)
				at = wd.Restore
				break
			}
		}
	}
}

// fitWithdrawal gives wd the longest hold up to want, and at least
// minWithdrawal, with which it fits among faults and ends before the
// export changes stop.
func fitWithdrawal(faults []fault, topo topology, o scheduleOptions, wd plannedWithdrawal, want time.Duration) (plannedWithdrawal, bool) {
	for hold := want; hold >= minWithdrawal; hold -= time.Second {
		wd.Restore = min(wd.At+hold, o.ExportsUntil).Round(100 * time.Millisecond)
		if wd.Restore-wd.At >= minWithdrawal && withdrawalFits(faults, topo, wd) {
			return wd, true
		}
	}
	return wd, false
}

// withdrawalFits reports whether wd leaves every model server fault
// something to judge, and can be made and restored:
//   - from a second before a model server fault to a second after its
//     heal, the gateway's choice must hold its cluster and another: no
//     withdrawal of its cluster (it could take no request) nor of the
//     only other exporter (its cluster would be the last, which outlier
//     detection never ejects) may hold then, counting withdrawalSettle
//     after the restore;
//   - nor one of an error sink's cluster until errorSinkBackWithin after
//     the heal, in which the cluster must serve again;
//   - the withdrawal and its restore are writes to the cluster's
//     kube-apiserver: neither falls in a fault that stops that process (a
//     pause, a compaction's restart), which would delay the restore into
//     a model server fault's window.
func withdrawalFits(faults []fault, topo topology, wd plannedWithdrawal) bool {
	overlap := func(a0, a1, b0, b1 time.Duration) bool { return a0 < b1 && b0 < a1 }
	for _, f := range faults {
		switch {
		case f.Kind == errorSink || f.Kind == hungFirstByte:
			end := f.At + f.Hold + time.Second
			if wd.Cluster == f.Target && f.Kind == errorSink {
				end = f.At + f.Hold + errorSinkBackWithin
			} else if len(f.Others) > 1 {
				continue // another exporter stays in the choice
			}
			if overlap(wd.At, wd.Restore+withdrawalSettle, f.At-time.Second, end) {
				return false
			}
		case stopsAPIServer(f, wd.Cluster):
			for _, t := range []time.Duration{wd.At, wd.Restore} {
				if overlap(t, t+time.Second, f.At-time.Second, f.At+f.held()+time.Second) {
					return false
				}
			}
		}
	}
	return true
}

// stopsAPIServer reports whether f stops cluster's kube-apiserver: a
// request to it waits, or is refused, while f holds.
func stopsAPIServer(f fault, cluster string) bool {
	return (f.Kind == pause || f.Kind == compaction) && f.Target == cluster
}

// describeWithdrawals is the plan of withdrawals, one a line, for the log.
func describeWithdrawals(plan []plannedWithdrawal) string {
	var b strings.Builder
	for _, wd := range plan {
		fmt.Fprintf(&b, "  %+.1fs to %+.1fs  %s withdraws the data path pool\n", wd.At.Seconds(), wd.Restore.Seconds(), wd.Cluster)
	}
	return b.String()
}

// describeSchedule is the schedule, one fault a line, for the log.
func describeSchedule(faults []fault) string {
	var b strings.Builder
	for _, f := range faults {
		fmt.Fprintf(&b, "  +%-7s %s\n", f.At, f)
	}
	return b.String()
}
