package epptransport

import (
	"sync"
	"time"
)

// Conns keeps one connection per address, made with the credentials that
// Credentials gives the address: when they change (a rotated Secret or CA
// ConfigMap, another transport), the next Get makes a new connection and
// the old one is released. The relay, the health prober and the pool
// scraper keep theirs in one, each with its own kind of connection C.
//
// A released connection is closed after the grace period, so that the
// streams still using it may finish (0: at once). It is safe for
// concurrent use.
type Conns[C any] struct {
	creds *Credentials
	dial  func(addr string, t *EndpointTLS) (C, error)
	close func(C)
	grace time.Duration
	// retire, when set, takes a released connection in place of the
	// grace period (RetireWith).
	retire func(C)

	mu    sync.Mutex
	conns map[string]versioned[C]
}

// versioned is a connection and the version of the credentials it was made
// with (EndpointTLS.Version).
type versioned[C any] struct {
	version string
	conn    C
}

// NewConns returns connections that dial makes, with the credentials creds
// give their address (nil: plaintext), and close closes, grace after they
// are released.
func NewConns[C any](creds *Credentials, grace time.Duration, dial func(addr string, t *EndpointTLS) (C, error), close func(C)) *Conns[C] {
	return &Conns[C]{creds: creds, dial: dial, close: close, grace: grace, conns: map[string]versioned[C]{}}
}

// Get returns the connection to addr with its current credentials, made
// now when there is none or it was made with other ones. It fails when the
// credentials of addr cannot be had (Credentials.ForTarget) or dial fails.
func (c *Conns[C]) Get(addr string) (C, error) {
	var none C
	t, err := c.creds.ForTarget(addr)
	if err != nil {
		return none, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.conns[addr]
	if ok && old.version == t.Version {
		return old.conn, nil
	}
	conn, err := c.dial(addr, t)
	if err != nil {
		return none, err
	}
	if ok {
		c.release(old.conn)
	}
	c.conns[addr] = versioned[C]{version: t.Version, conn: conn}
	return conn, nil
}

// With calls f with the connection to addr, when there is one.
func (c *Conns[C]) With(addr string, f func(C)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.conns[addr]; ok {
		f(v.conn)
	}
}

// Retain releases the connections to the addresses keep does not keep.
func (c *Conns[C]) Retain(keep func(addr string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, v := range c.conns {
		if !keep(addr) {
			delete(c.conns, addr)
			c.release(v.conn)
		}
	}
}

// Forget releases the connection to addr.
func (c *Conns[C]) Forget(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.conns[addr]; ok {
		delete(c.conns, addr)
		c.release(v.conn)
	}
}

// Close closes every connection at once.
func (c *Conns[C]) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, v := range c.conns {
		delete(c.conns, addr)
		c.close(v.conn)
	}
}

// RetireWith hands each released connection to retire, which closes it
// when it sees fit (when its streams have ended, say), in place of closing
// it after the grace period. Close still closes every connection at once.
// Call it before the first Get.
func (c *Conns[C]) RetireWith(retire func(C)) { c.retire = retire }

// release retires conn, or closes it after the grace period.
func (c *Conns[C]) release(conn C) {
	if c.retire != nil {
		c.retire(conn)
		return
	}
	if c.grace <= 0 {
		c.close(conn)
		return
	}
	time.AfterFunc(c.grace, func() { c.close(conn) })
}
