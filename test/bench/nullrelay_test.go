package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/test/envoyclient"
)

// The data path's null relay: a process of its own, as the sidecar is,
// that pipes each gateway stream to the EPP and back and decides nothing
// (envoyclient.NullRelay), served as mci-sidecar serves its ext_proc port
// and connected to the EPP as it connects: the floor of any extra hop,
// measured beside the sidecar.
const (
	nullRelayIP   = "127.0.202.3"
	roleNullRelay = "null-relay"
	// nullRelayUpstreamEnv gives the null relay's process the EPP's
	// ext_proc address.
	nullRelayUpstreamEnv = "MCI_BENCH_NULL_RELAY_UPSTREAM"
)

// serveChild serves a server process of the benchmark (StartChild): the
// null relay, on nullRelayIP's ext_proc, health and metrics ports (its
// metrics are the Go runtime's, for the allocations per request).
func serveChild(ctx context.Context, role string, ready func(string)) error {
	if role != roleNullRelay {
		return fmt.Errorf("unknown role %q", role)
	}
	conn, err := grpc.NewClient(os.Getenv(nullRelayUpstreamEnv), append(extproc.StreamDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	servers, err := extproc.Listen(extproc.ServingOptions{BindAddress: nullRelayIP, GRPCPort: 9002, HealthPort: 9003, MetricsPort: 9090, EnablePprof: true}, envoyclient.NewNullRelay(conn), reg)
	if err != nil {
		return err
	}
	servers.Ready()
	ready(net.JoinHostPort(nullRelayIP, "9002"))
	return servers.Run(ctx, time.Second)
}
