package clusterset

import (
	"net/http"
	"sync"
)

// linkGate holds a member's list and watch requests while its probe cannot
// reach the member (no connection, no answer), and lets them go the
// moment a probe gets through again.
//
// Without it, client-go's reflectors retry a lost member on their own
// exponential backoff (up to 30s between attempts), so after a partition
// heals each informer would come back whenever its backoff next let it:
// the member stayed flagged or stale for seconds to tens of seconds after
// it answered again. Held at the gate instead, a reflector's request
// neither fails (its backoff does not grow) nor piles up connections or
// goroutines on a dead link: one request per informer waits, cancelled
// with the informer. The probe decides (it goes around the gate), so the
// informers resume within one probe interval of the link healing.
type linkGate struct {
	mu sync.Mutex
	// open is closed while requests may go, and replaced by an open
	// channel while they wait.
	open chan struct{}
	// onReopen is called, and forgotten, when a hold ends.
	onReopen func()
}

func newLinkGate() *linkGate {
	open := make(chan struct{})
	close(open)
	return &linkGate{open: open}
}

// hold makes new requests wait until release.
func (g *linkGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default: // held already
	}
}

// release lets waiting and new requests go.
func (g *linkGate) release() {
	g.mu.Lock()
	var reopened func()
	select {
	case <-g.open: // open already
	default:
		close(g.open)
		reopened, g.onReopen = g.onReopen, nil
	}
	g.mu.Unlock()
	if reopened != nil {
		reopened()
	}
}

// held reports whether requests wait.
func (g *linkGate) held() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		return false
	default:
		return true
	}
}

// whenReopened calls f the next time the gate opens after holding: when
// a probe gets through again (open now, after a hold and its end), in the
// goroutine that releases it, so f must not block. A later call replaces
// f: the gate has one follower, the member's mode (mode.go).
func (g *linkGate) whenReopened(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.onReopen = f
}

// wrap is a rest.Config WrapTransport: each request waits at the gate
// until it opens or the request is cancelled.
func (g *linkGate) wrap(rt http.RoundTripper) http.RoundTripper {
	return gatedTransport{gate: g, next: rt}
}

type gatedTransport struct {
	gate *linkGate
	next http.RoundTripper
}

func (t gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.gate.mu.Lock()
	open := t.gate.open
	t.gate.mu.Unlock()
	select {
	case <-open:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return t.next.RoundTrip(req)
}
