package sidecar

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/peer"
	"k8s.io/apimachinery/pkg/types"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/routetable"
)

// logLines is a logger that keeps its lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

func (l *logLines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// freePort returns a loopback port free a moment ago.
func freePort(t *testing.T) int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = l.Close() }()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

// shimTable is the routing table of shim pools that name ports (0: none).
func shimTable(t *testing.T, ports ...int32) *routetable.Table {
	t.Helper()
	var pools []*poolv1.InferencePool
	for i, port := range ports {
		p := shimPool("pool-"+strconv.Itoa(i), "")
		p.Spec.EndpointPickerRef.Port = nil
		if port != 0 {
			p.Spec.EndpointPickerRef.Port = &poolv1.Port{Number: port}
		}
		pools = append(pools, p)
	}
	tbl, _ := buildTable(routetable.Inputs{EndpointPickerServices: []types.NamespacedName{sidecarService}, Pools: pools})
	return tbl
}

func listening(port int32) bool {
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// TestShimPortsFollowThePools: the sidecar listens on every port its shim
// pools name, besides the main one, and on no other; a port it cannot bind
// is said once, and bound once it is free.
func TestShimPortsFollowThePools(t *testing.T) {
	main, p1, p2 := freePort(t), freePort(t), freePort(t)
	var logs logLines
	reg := prometheus.NewRegistry()
	var served []net.Listener
	ports := newShimPorts("127.0.0.1", main, func(l net.Listener) { served = append(served, l) }, reg, logs.logger())
	t.Cleanup(ports.close)
	gauge := func(port int32) float64 { return testutil.ToFloat64(ports.listening.WithLabelValues(portLabel(port))) }

	ports.follow(shimTable(t, p1, p2, main, 0))
	assert.True(t, listening(p1), "the port of a pool")
	assert.True(t, listening(p2), "the port of another pool")
	assert.Len(t, served, 2, "the main port is the main listener's")
	assert.Equal(t, []float64{1, 1}, []float64{gauge(p1), gauge(p2)})
	assert.Equal(t, 1.0, testutil.ToFloat64(ports.pools.WithLabelValues("")), "the pool naming no port")
	assert.Equal(t, 1.0, testutil.ToFloat64(ports.pools.WithLabelValues(portLabel(main))), "the pool naming the main port")

	ports.follow(shimTable(t, p1))
	assert.True(t, listening(p1))
	assert.False(t, listening(p2), "a port no pool names any more is closed")
	assert.Equal(t, 1, testutil.CollectAndCount(ports.listening), "and leaves the gauge")

	// Another process holds p2.
	held, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(p2))))
	require.NoError(t, err)
	before := logs.count()
	ports.follow(shimTable(t, p1, p2))
	ports.retry()
	ports.retry()
	assert.Equal(t, 0.0, gauge(p2), "a port that cannot be bound")
	assert.Equal(t, before+1, logs.count(), "is said once while its error stays the same: %v", logs.lines)

	require.NoError(t, held.Close())
	ports.retry()
	assert.Equal(t, 1.0, gauge(p2), "and bound once it is free")
	assert.True(t, listening(p2))
}

func TestShimPortsArrival(t *testing.T) {
	ports := newShimPorts("127.0.0.1", 9002, func(net.Listener) {}, prometheus.NewRegistry(), logr.Discard())
	at := func(port int) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}})
	}
	assert.Equal(t, routetable.Arrival{Port: 9010}, ports.arrival(at(9010)))
	assert.Equal(t, routetable.Arrival{Port: 9002, Main: true}, ports.arrival(at(9002)))
	assert.Equal(t, routetable.Arrival{Port: 9002, Main: true}, ports.arrival(context.Background()), "a stream without a peer is the main listener's")
}

// TestResponsePhaseWatch: a gateway that ends its streams after the
// request phase is said once, after a streak, and once again when a
// response phase comes.
func TestResponsePhaseWatch(t *testing.T) {
	var logs logLines
	w := newResponsePhaseWatch(prometheus.NewRegistry(), logs.logger())
	for range MissingResponsePhaseStreak - 1 {
		w.ended(false, nil)
	}
	assert.Equal(t, 0.0, testutil.ToFloat64(w.gauge), "a few streams without a response phase say little")
	w.ended(true, nil)
	for range MissingResponsePhaseStreak - 1 {
		w.ended(false, nil)
	}
	assert.Equal(t, 0.0, testutil.ToFloat64(w.gauge), "a response phase starts the streak again")
	assert.Equal(t, 0, logs.count())

	w.ended(false, &extprocv3.ProtocolConfiguration{})
	assert.Equal(t, 1.0, testutil.ToFloat64(w.gauge), "a streak: the gateway does not send it")
	for range 50 {
		w.ended(false, nil)
	}
	require.Equal(t, 1, logs.count(), "said once")
	assert.Contains(t, logs.lines[0], `"announcedResponseBodyMode"="NONE"`)
	assert.Equal(t, float64(2*MissingResponsePhaseStreak-1+50), testutil.ToFloat64(w.streams))

	w.ended(true, nil)
	assert.Equal(t, 0.0, testutil.ToFloat64(w.gauge))
	assert.Equal(t, 2, logs.count(), "said once again when it comes back")
}
