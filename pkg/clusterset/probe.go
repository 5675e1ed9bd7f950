package clusterset

import (
	"context"
	"math"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

const (
	// probeTimeout is the least time a reachability probe of a member
	// apiserver is given; it is given the unreachable threshold when that
	// is longer (probeTimeoutFor).
	probeTimeout = 2 * time.Second
	// probeInterval is how often a reachable member is probed.
	probeInterval = time.Second
	// probeMaxInterval caps the backoff between probes of a failing
	// member. A failing member's recovery is noticed by its next probe, and
	// until then its informers wait (see linkGate): a longer cap would
	// keep every view of it stale for that long after a partition heals.
	// A probe of a failing member is one refused connection or one pending
	// request, and the jitter keeps replicas out of step.
	probeMaxInterval = probeInterval
)

// startProbes checks that the member apiserver answers, every
// probeInterval while it does and with exponential backoff and jitter
// while it does not (so that many replicas probing a dead member do not
// beat in step), but never sleeping past the next threshold. Informers
// retry on their own, with their own jittered backoff; the probe exists
// because a hung apiserver (or a silent partition) keeps a watch open
// without errors, and only a request with a deadline notices. It closes
// m.done once ctx has ended and no probe is pending.
//
// The probes run on timers, not on a goroutine of the member's: a
// goroutine's stack is about 5 KiB, as much as a tenth of what a member
// costs a replica, and this one would sleep between probes for the
// member's life. A probe runs in its timer's goroutine, which ends with
// it.
func (m *member) startProbes(ctx context.Context, client rest.Interface, th thresholds) {
	p := &prober{m: m, ctx: ctx, client: client, th: th, logger: klog.FromContext(ctx), backoff: probeBackoff(th)}
	p.mu.Lock()
	p.next = time.AfterFunc(0, p.send)
	p.mu.Unlock()
	context.AfterFunc(ctx, p.stop)
}

// prober is the state of a member's probes between its timers' callbacks.
// Its lock is held through each step (a probe's answer, a threshold
// crossed while it is pending), so that the steps are taken one at a
// time, in order, as a loop would take them: a threshold crossed and an
// answer that arrive together never leave the gate held for a member
// that answered.
type prober struct {
	m      *member
	ctx    context.Context
	client rest.Interface
	th     thresholds
	logger klog.Logger

	mu      sync.Mutex
	backoff wait.Backoff
	// next sends the next probe, while none is pending; threshold is the
	// next threshold a failing member crosses while one is.
	next, threshold *time.Timer
	pending         bool
	// probes counts the probes sent, so that a threshold timer of an
	// earlier one that fires late is not taken as the pending one's.
	probes          uint64
	stopped, closed bool
}

// send probes the member and takes its answer.
func (p *prober) send() {
	p.mu.Lock()
	if p.stopped {
		p.closeLocked()
		p.mu.Unlock()
		return
	}
	p.pending = true
	p.probes++
	p.armThresholdLocked()
	p.mu.Unlock()

	started := time.Now()
	err := p.m.probe(p.ctx, p.client, p.th)
	p.answered(started, err)
}

// armThresholdLocked sets the timer of the next threshold, if a failing
// member has one left: a failing member crosses its thresholds on time
// even while a probe hangs (a paused apiserver answers nothing until the
// probe's timeout), as no answer yet is no recovery.
func (p *prober) armThresholdLocked() {
	if d := p.m.untilThreshold(time.Now(), p.th); d > 0 {
		probe := p.probes
		p.threshold = time.AfterFunc(d, func() { p.crossed(probe) })
	}
}

// crossed takes a threshold that fell while probe is pending.
func (p *prober) crossed(probe uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.pending || probe != p.probes {
		return // answered meanwhile
	}
	if p.m.crossThresholds(time.Now(), p.th) {
		p.m.gate.hold()
		p.notify(p.m.pendingProbeError())
	}
	p.armThresholdLocked()
}

// answered takes a probe's answer and schedules the next probe.
func (p *prober) answered(started time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = false
	if p.threshold != nil {
		p.threshold.Stop()
		p.threshold = nil
	}
	if p.stopped || p.ctx.Err() != nil {
		p.closeLocked() // shutting down
		return
	}
	// A member that refuses the credentials answers: it is reachable,
	// and flagged for its credentials instead (credentials.go, from the
	// same answer).
	reach := err
	if credentialError(err) {
		reach = nil
	}
	changed, untilNext := p.m.assess(started, time.Now(), reach, p.th)
	if gateOpens(err) {
		p.m.gate.release()
	} else {
		p.m.gate.hold()
	}
	if changed {
		p.notify(err)
	}
	delay := wait.Jitter(probeIntervalFor(p.th), 0.1)
	if reach != nil {
		delay = p.backoff.Step()
		if untilNext > 0 && untilNext < delay {
			delay = untilNext
		}
	} else {
		p.backoff = probeBackoff(p.th)
	}
	p.next = time.AfterFunc(delay, p.send)
}

func (p *prober) notify(err error) {
	st := p.m.status()
	p.logger.Info("Member reachability changed", "member", p.m.name, "unreachable", st != nil, "removed", st != nil && st.removed, "err", err)
	p.m.handler(Event{Member: p.m.name, Kind: KindMember})
}

// stop ends the probes when the member's context ends; m.done is closed
// at once unless a probe is pending, else when it returns (its context
// ends it).
func (p *prober) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.threshold != nil {
		p.threshold.Stop()
	}
	if p.pending {
		return
	}
	if p.next != nil && !p.next.Stop() {
		// Its callback has started, and will close m.done under the lock.
		return
	}
	p.closeLocked()
}

func (p *prober) closeLocked() {
	if !p.closed {
		p.closed = true
		close(p.m.done)
	}
}

// probeIntervalFor is how often a member is probed: probeInterval, or a
// quarter of the unreachable threshold when that is shorter. A pending
// probe counts from the member's last answer (untilThreshold), so a probe
// sent a whole threshold after that answer would flag a healthy member
// before it could reply: every threshold holds several probes instead.
func probeIntervalFor(th thresholds) time.Duration {
	if th.unreachableAfter <= 0 {
		return probeInterval
	}
	return min(probeInterval, th.unreachableAfter/4)
}

// probeTimeoutFor gives a probe as long as the unreachable threshold (at
// least probeTimeout): a member that answers at all within the threshold
// is reachable, however slow its link (a 2s link to a member is slow, not
// down). A member that does not answer is flagged on time all the same:
// untilThreshold counts from its last answer while a probe is pending.
func probeTimeoutFor(th thresholds) time.Duration {
	return max(probeTimeout, th.unreachableAfter)
}

// gateOpens reports whether a probe's answer lets the member's list and
// watch requests go: the member said it is ready, and accepted the
// credentials. Any other answer says the informers' requests would fail
// too, and every failure grows a reflector's backoff (up to 30s), so the
// member would be read again whenever each backoff next allowed it:
//   - a kube-apiserver that is starting answers /readyz 500, and the
//     requests for resources it has not installed yet (custom resources,
//     the aggregated APIs) 503 with Retry-After: 5, which client-go
//     sleeps out inside the request;
//   - one that refuses the credentials (an expired or revoked token, or
//     an RBAC authorizer that has not read its role bindings yet, for a
//     second or more after a restart) refuses the informers alike; the
//     member is flagged CredentialsRejected from the probe's answer.
//
// Held at the gate, the informers go the moment a probe is answered ready
// and accepted: within a probe interval. A member that answers not ready
// is failing (reachability.go) and flagged once past its threshold, so
// its last known data is not served as fresh meanwhile.
func gateOpens(err error) bool {
	return err == nil
}

func probeBackoff(th thresholds) wait.Backoff {
	interval := probeIntervalFor(th)
	return wait.Backoff{Duration: interval, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: max(interval, probeMaxInterval)}
}

// probe asks the member apiserver whether it is ready, within
// probeTimeoutFor the member's threshold.
func (m *member) probe(ctx context.Context, client rest.Interface, th thresholds) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeoutFor(th))
	defer cancel()
	// No retries: a connection refused or reset is the answer.
	return client.Get().AbsPath("/readyz").MaxRetries(0).Do(ctx).Error()
}
