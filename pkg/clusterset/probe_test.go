package clusterset

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// probedMember is a member whose /readyz answers ready, or hangs until
// the probe's deadline while hang is set.
type probedMember struct {
	*member
	client rest.Interface
	hang   atomic.Bool
	probes atomic.Int64
	// hanging counts the probes that hang now.
	hanging atomic.Int64
	mu      sync.Mutex
	events  []Event
}

func newProbedMember(t *testing.T) *probedMember {
	t.Helper()
	p := &probedMember{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.probes.Add(1)
		if p.hang.Load() {
			p.hanging.Add(1)
			defer p.hanging.Add(-1)
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	var err error
	p.client, err = rest.UnversionedRESTClientFor(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{NegotiatedSerializer: scheme.Codecs.WithoutConversion()}})
	require.NoError(t, err)
	p.member = &member{name: "cluster-a", gate: newLinkGate(), done: make(chan struct{}), handler: func(ev Event) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.events = append(p.events, ev)
	}}
	return p
}

func (p *probedMember) memberEvents() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.events)
}

func TestAMembersProbesRunOnTimers(t *testing.T) {
	p := newProbedMember(t)
	// Probes every 250 ms; a probe may take the whole threshold.
	th := thresholds{unreachableAfter: time.Second}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p.startProbes(ctx, p.client, th)

	require.Eventually(t, func() bool { return p.probes.Load() >= 3 }, 5*time.Second, 10*time.Millisecond, "probed again and again")
	assert.Nil(t, p.status(), "a member that answers is reachable")
	assert.False(t, p.gate.held())
	assert.Zero(t, p.memberEvents(), "nothing changed")

	// It stops answering: its pending probe hangs for the threshold, and
	// the member is flagged when the threshold falls, not when the probe
	// times out.
	reopened := make(chan struct{})
	p.gate.whenReopened(func() { close(reopened) })
	p.hang.Store(true)
	require.Eventually(t, func() bool { return p.status() != nil }, 5*time.Second, 5*time.Millisecond, "flagged")
	assert.Equal(t, int64(1), p.hanging.Load(), "flagged while its probe hangs (a probe is given 2 s, the threshold 1 s)")
	// Its requests wait, and the change is told, just after.
	require.Eventually(t, func() bool { return p.gate.held() && p.memberEvents() == 1 }, time.Second, 5*time.Millisecond, "its requests wait; the change is told")
	assert.ErrorIs(t, p.pendingProbeError(), errProbePending)

	// It answers again: reachable, the gate opens and its follower is told.
	p.hang.Store(false)
	select {
	case <-reopened:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate did not reopen when the member answered again")
	}
	assert.Nil(t, p.status())
	assert.False(t, p.gate.held())
	// Told just after the gate opens.
	require.Eventually(t, func() bool { return p.memberEvents() == 2 }, 5*time.Second, 5*time.Millisecond, "the recovery is told")

	// Stopping while a probe hangs ends the probe with the context, then
	// closes done; no probe is sent after.
	p.hang.Store(true)
	sent := p.probes.Load()
	require.Eventually(t, func() bool { return p.probes.Load() > sent }, 5*time.Second, 10*time.Millisecond, "a probe pending")
	cancel()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("done was not closed when the member's context ended")
	}
	sent = p.probes.Load()
	time.Sleep(600 * time.Millisecond)
	assert.Equal(t, sent, p.probes.Load(), "no probe after the member stopped")
}
