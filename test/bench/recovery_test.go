package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchEPPRecovery stops the remote cluster's mci-epp for cfg.RecoveryOutage
// (150 s in the full profile: longer than gRPC's default maximum reconnect
// backoff of 120 s), while requests keep going through the sidecar, then
// starts it again on the same address and measures how long until the
// first request through the sidecar is served by it: the time a gateway's
// users wait after the EPP is back. The route is switched to HealthBased
// first (healthBased), so that the health prober's view decides whether
// the cluster is tried, as in a reported outage. The sidecar
// runs with its default flags (--epp-reconnect-max-delay=1s,
// --health-check-interval=1s).
func benchEPPRecovery(b *testing.B, path *dataPath, healthBased, stopEPP, startEPP func()) {
	ctx := context.Background()
	healthBased()
	require.NoError(b, pollFor(time.Minute, func() bool { return path.send(ctx) == nil }), "the sidecar path never answered under HealthBased")
	stopEPP()
	down := time.Now()
	failed := 0
	for time.Since(down) < cfg.RecoveryOutage {
		if path.send(ctx) != nil {
			failed++
		}
		time.Sleep(500 * time.Millisecond) // paces the probing requests
	}
	startEPP()
	back := time.Now()
	var took time.Duration
	for {
		if path.send(ctx) == nil {
			took = time.Since(back)
			break
		}
		if time.Since(back) > 3*time.Minute {
			b.Fatalf("no request through the sidecar succeeded within 3 minutes of the EPP's return")
		}
		time.Sleep(20 * time.Millisecond) // the measurement's resolution
	}
	// took includes mci-epp's own start (listening, its first scrape of the
	// simulator), which a restarted upstream EPP also needs.
	results.check("recovery", fmt.Sprintf("first success after the EPP returns from a %s outage (HealthBased)", cfg.RecoveryOutage), "ms", ms(took),
		"< 2 s", took < 2*time.Second,
		fmt.Sprintf("requests every 500 ms through the sidecar during the outage (%d failed, as they must); then every 20 ms until one succeeds; includes mci-epp's start", failed))
}
