package sidecar

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/peer"

	"github.com/mci-dev/mci/pkg/routetable"
)

// shimPorts keeps an ext_proc listener open on every port that the shim
// pools' endpointPickerRefs name, besides the main one (--grpc-port), so
// that a gateway reaches the sidecar on the port of the pool it routes to
// and the port tells the pool (routetable.Table.ShimFor). It follows the
// routing table: ports open as pools name them and close as no pool does.
// A port that cannot be bound is retried at each change of the table and
// each retry tick, and said once per change of its error: a log line and
// mci_sidecar_shim_port_listening{port}=0.
type shimPorts struct {
	bind string
	// main is the main listener's port.
	main int32
	// serve serves the ext_proc server on a listener; listen binds one.
	serve  func(net.Listener)
	listen func(addr string) (net.Listener, error)
	logger logr.Logger

	listening *prometheus.GaugeVec
	pools     *prometheus.GaugeVec

	mu   sync.Mutex
	want []int32
	open map[int32]net.Listener
	// failed is the bind error last said, by port.
	failed map[int32]string
}

func newShimPorts(bind string, main int32, serve func(net.Listener), reg prometheus.Registerer, logger logr.Logger) *shimPorts {
	p := &shimPorts{
		bind: bind, main: main, serve: serve, logger: logger,
		listen: func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) },
		listening: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mci_sidecar_shim_port_listening",
			Help: "Ports that shim pools' endpointPickerRefs name, besides --grpc-port: 1 while the sidecar listens on the port, 0 while it cannot bind it (see the logs; retried every few seconds).",
		}, []string{"port"}),
		pools: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mci_sidecar_shim_pools",
			Help: "Shim pools by the port their endpointPickerRef names (\"\" for none: the main ext_proc port). Above 1, a gateway that sends neither route metadata nor a request its HTTPRoutes tell apart gets 500 on that port.",
		}, []string{"port"}),
		open:   map[int32]net.Listener{},
		failed: map[int32]string{},
	}
	reg.MustRegister(p.listening, p.pools)
	return p
}

// follow makes the listeners those of t's shim pools.
func (p *shimPorts) follow(t *routetable.Table) {
	p.pools.Reset()
	for _, be := range t.Shims() {
		port := ""
		if be.ShimPort != 0 {
			port = strconv.Itoa(int(be.ShimPort))
		}
		p.pools.WithLabelValues(port).Inc()
	}
	want := slices.DeleteFunc(slices.Clone(t.ShimPorts()), func(port int32) bool { return port == p.main })
	p.mu.Lock()
	defer p.mu.Unlock()
	p.want = want
	p.reconcile()
}

// retry binds the ports that could not be bound.
func (p *shimPorts) retry() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reconcile()
}

// reconcile opens the wanted ports not open yet and closes the others.
// Connections already accepted on a closed port go on: their requests
// find no pool of that port any more and are answered as such.
func (p *shimPorts) reconcile() {
	for port, l := range p.open {
		if !slices.Contains(p.want, port) {
			// The series goes first: the metric never says a port
			// listens once a client can see it closed.
			p.listening.DeleteLabelValues(portLabel(port))
			_ = l.Close()
			delete(p.open, port)
			p.logger.Info("Closed the ext_proc port no shim pool names any more", "port", port)
		}
	}
	for port := range p.failed {
		if !slices.Contains(p.want, port) {
			delete(p.failed, port)
			p.listening.DeleteLabelValues(portLabel(port))
		}
	}
	for _, port := range p.want {
		if p.open[port] != nil {
			continue
		}
		addr := net.JoinHostPort(p.bind, strconv.Itoa(int(port)))
		l, err := p.listen(addr)
		if err != nil {
			p.listening.WithLabelValues(portLabel(port)).Set(0)
			if p.failed[port] != err.Error() {
				p.failed[port] = err.Error()
				p.logger.Error(err, "Cannot listen on the ext_proc port a shim pool names: requests of the pool's gateway do not reach the sidecar there (retried; logged again when the error changes)", "address", addr)
			}
			continue
		}
		if _, was := p.failed[port]; was {
			delete(p.failed, port)
			p.logger.Info("Listening on the ext_proc port a shim pool names, after all", "address", addr)
		} else {
			p.logger.Info("Listening on the ext_proc port a shim pool names", "address", addr)
		}
		p.open[port] = l
		p.listening.WithLabelValues(portLabel(port)).Set(1)
		p.serve(l)
	}
}

// close closes every listener.
func (p *shimPorts) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.want = nil
	p.reconcile()
}

// arrival is where the connection of a stream of ctx arrived.
func (p *shimPorts) arrival(ctx context.Context) routetable.Arrival {
	if pr, ok := peer.FromContext(ctx); ok {
		if a, ok := pr.LocalAddr.(*net.TCPAddr); ok {
			return routetable.Arrival{Port: int32(a.Port), Main: int32(a.Port) == p.main}
		}
	}
	return routetable.Arrival{Port: p.main, Main: true}
}

func portLabel(port int32) string { return strconv.Itoa(int(port)) }
