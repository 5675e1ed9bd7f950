package clusterset

import (
	"context"
	"math"
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

// probeLoop checks that the member apiserver answers, every probeInterval
// while it does and with exponential backoff and jitter while it does not
// (so that many replicas probing a dead member do not beat in step), but
// never sleeping past the next threshold. Informers retry on their own,
// with their own jittered backoff; the probe exists because a hung
// apiserver (or a silent partition) keeps a watch open without errors, and
// only a request with a deadline notices.
func (m *member) probeLoop(ctx context.Context, client rest.Interface, th thresholds) {
	logger := klog.FromContext(ctx)
	notify := func(err error) {
		st := m.status()
		logger.Info("Member reachability changed", "member", m.name, "unreachable", st != nil, "removed", st != nil && st.removed, "err", err)
		m.handler(Event{Member: m.name, Kind: KindMember})
	}
	backoff := probeBackoff(th)
	for {
		started := time.Now()
		result := make(chan error, 1)
		go func() { result <- m.probe(ctx, client, th) }()
		// A failing member crosses its thresholds on time even while a
		// probe hangs (a paused apiserver answers nothing until the
		// probe's timeout): no answer yet is no recovery.
		var err error
		for answered := false; !answered; {
			var threshold <-chan time.Time
			var timer *time.Timer
			if d := m.untilThreshold(time.Now(), th); d > 0 {
				timer = time.NewTimer(d)
				threshold = timer.C
			}
			select {
			case err = <-result:
				answered = true
			case <-threshold:
				if m.crossThresholds(time.Now(), th) {
					m.gate.hold()
					notify(m.pendingProbeError())
				}
			}
			if timer != nil {
				timer.Stop()
			}
		}
		if ctx.Err() != nil {
			return // shutting down
		}
		// A member that refuses the credentials answers: it is
		// reachable, and flagged for its credentials instead
		// (credentials.go, from the same answer).
		reach := err
		if credentialError(err) {
			reach = nil
		}
		changed, untilNext := m.assess(started, time.Now(), reach, th)
		if gateOpens(err) {
			m.gate.release()
		} else {
			m.gate.hold()
		}
		if changed {
			notify(err)
		}
		delay := wait.Jitter(probeIntervalFor(th), 0.1)
		if reach != nil {
			delay = backoff.Step()
			if untilNext > 0 && untilNext < delay {
				delay = untilNext
			}
		} else {
			backoff = probeBackoff(th)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
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
