package localclusterset

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// NameProxy is an HTTP CONNECT proxy on loopback that resolves host names
// from a table the test holds, never through DNS: a member kubeconfig that
// names its server by a host name and sets proxy-url to the proxy reaches
// the member only while the table holds the name. It is how a test makes
// a member's name stop resolving, and resolve again, without a query
// leaving the machine: the client hands the name to the proxy unresolved
// (client-go tunnels https through CONNECT), and the proxy answers a name
// it does not hold as a proxy answers a failed lookup, 502 Bad Gateway.
// TLS runs end to end through the tunnel, so the client verifies the
// member's certificate (against the kubeconfig's tls-server-name) as it
// would without the proxy.
type NameProxy struct {
	ln  net.Listener
	srv *http.Server

	mu      sync.Mutex
	names   map[string]string
	tunnels map[string]map[net.Conn]bool
}

// StartNameProxy starts a NameProxy on a free loopback port.
func StartNameProxy() (*NameProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("clusterset: name proxy: %w", err)
	}
	p := &NameProxy{ln: ln, names: map[string]string{}, tunnels: map[string]map[net.Conn]bool{}}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.connect), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// URL is the proxy-url a kubeconfig names.
func (p *NameProxy) URL() string { return "http://" + p.ln.Addr().String() }

// Resolve makes name resolve to the loopback address ip.
func (p *NameProxy) Resolve(name, ip string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.names[name] = ip
}

// Unresolve makes name resolve no more and closes the tunnels opened to
// it, as when a member's address moves while its record is gone: its
// clients must dial again, and their lookups fail.
func (p *NameProxy) Unresolve(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.names, name)
	for conn := range p.tunnels[name] {
		_ = conn.Close()
	}
	delete(p.tunnels, name)
}

// Close stops the proxy and every tunnel.
func (p *NameProxy) Close() error {
	err := p.srv.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, conns := range p.tunnels {
		for conn := range conns {
			_ = conn.Close()
		}
	}
	return err
}

func (p *NameProxy) connect(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "this proxy only tunnels (CONNECT)", http.StatusMethodNotAllowed)
		return
	}
	name, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	ip, ok := p.names[name]
	p.mu.Unlock()
	if !ok {
		http.Error(w, fmt.Sprintf("lookup %s: no such host", name), http.StatusBadGateway)
		return
	}
	upstream, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), 5*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = upstream.Close()
		http.Error(w, "cannot tunnel on this connection", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
	client, buf, err := hj.Hijack()
	if err != nil {
		_ = upstream.Close()
		return
	}
	if !p.track(name, client, upstream) {
		return
	}
	defer p.untrack(name, client, upstream)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(upstream, buf); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, upstream); done <- struct{}{} }()
	<-done
}

// track records a tunnel to name; false (both ends closed) when name
// stopped resolving while it was being opened.
func (p *NameProxy) track(name string, conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.names[name]; !ok {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	if p.tunnels[name] == nil {
		p.tunnels[name] = map[net.Conn]bool{}
	}
	for _, c := range conns {
		p.tunnels[name][c] = true
	}
	return true
}

func (p *NameProxy) untrack(name string, conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(p.tunnels[name], c)
	}
}
