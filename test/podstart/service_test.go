package podstart

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// serviceProxy plays kube-proxy for one port of a Service: connections to
// its loopback address and the Service's port go to the next backend (a
// pod IP and the resolved targetPort), trying the others when one refuses.
// TLS passes through untouched.
type serviceProxy struct {
	listener net.Listener
	backends []string
	next     atomic.Uint64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startServiceProxy(addr string, backends []string) (*serviceProxy, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &serviceProxy{listener: l, backends: backends, conns: map[net.Conn]struct{}{}}
	s.wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() { s.relay(conn) })
		}
	})
	return s, nil
}

func (s *serviceProxy) relay(client net.Conn) {
	defer client.Close()
	start := int(s.next.Add(1))
	var backend net.Conn
	for i := range s.backends {
		c, err := net.DialTimeout("tcp", s.backends[(start+i)%len(s.backends)], time.Second)
		if err == nil {
			backend = c
			break
		}
	}
	if backend == nil {
		return
	}
	defer backend.Close()
	s.mu.Lock()
	s.conns[client], s.conns[backend] = struct{}{}, struct{}{}
	s.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(backend, client)
	go pipe(client, backend)
	<-done
	<-done
	s.mu.Lock()
	delete(s.conns, client)
	delete(s.conns, backend)
	s.mu.Unlock()
}

func (s *serviceProxy) close() {
	_ = s.listener.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
